//! The OpenAI API surface: request and response bodies, and errors.

pub mod error;
pub mod logprobs;
pub mod request;
pub mod response;
pub mod tools;

pub use error::ApiError;
