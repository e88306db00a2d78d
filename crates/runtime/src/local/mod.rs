//! In-process planes: a whole deployment in one process, no external service.

mod discovery;
mod events;
mod request;
mod snapshot;

pub use discovery::LocalDiscovery;
pub use events::LocalEventPlane;
pub use request::LocalRequestPlane;
pub use snapshot::LocalKvSnapshots;
