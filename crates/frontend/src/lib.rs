//! The OpenAI-compatible frontend.
//!
//! - [`openai`]: request and response bodies, OpenAI-style errors.
//! - [`preprocess`]: chat templates, tokenization and incremental detokenization.
//! - [`convert`]: validating requests into tokenized [`pipeline::Prepared`] requests.
//! - [`routing`]: the async shell around the routing core (which makes every decision:
//!   admission, worker choice, exclusion): the shared index, discovery, events, resync.
//! - [`pipeline`]: admission → routing → dispatch → detokenized response stream.
//! - [`stop`]: stop strings.
//! - [`metrics`]: Prometheus metrics.
//! - [`http`], [`server`]: the axum routes and the server.

pub mod auth;
pub mod config;
pub mod convert;
pub mod features;
pub mod http;
pub mod media;
pub mod metrics;
pub mod openai;
pub mod pipeline;
pub mod preprocess;
pub mod routing;
pub mod server;
pub mod stop;

pub use config::FrontendConfig;
pub use pipeline::Frontend;
