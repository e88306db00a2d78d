//! In-process planes: a whole deployment in one process, no external service.

mod discovery;
mod events;
mod request;

pub use discovery::LocalDiscovery;
pub use events::LocalEventPlane;
pub use request::LocalRequestPlane;
