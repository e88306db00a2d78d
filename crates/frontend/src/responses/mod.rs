//! The Responses API (`/v1/responses`), served by the chat endpoint's pipeline:
//!
//! - [`lower`]: a request's input items, tools and `text.format` lowered into a chat
//!   request, continuing a stored conversation;
//! - [`events`]: the answer's parts as output items and the typed events that stream them;
//! - [`store`]: stored responses (bounded, with a TTL), each with its prompt and answer as
//!   tokens, so a follow-up tokenizes only what is new.
//!
//! The request and response types are the SGLang gateway's `openai-protocol` crate's.

pub mod doc;
pub mod events;
pub mod lower;
pub mod store;

pub use events::{ResponseBuilder, new_id};
pub use lower::{Lowered, lower};
pub use store::{ResponseStore, ResponsesConfig, Stored};
