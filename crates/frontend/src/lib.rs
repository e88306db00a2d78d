//! The OpenAI-compatible frontend.
//!
//! - [`auth`]: API keys, tenants, their priorities and rate limits.
//! - [`config`]: the frontend's configuration ([`FrontendConfig`]) and its checks.
//! - [`convert`]: validating requests into tokenized [`pipeline::Prepared`] requests.
//! - [`feature_store`]: the encoded-feature store: media items' features the fleet holds,
//!   shared by requests, within memory budgets.
//! - [`http`]: the axum routes, body parsing with OpenAI-style errors, request counting.
//! - [`media`]: media in chat requests: fetched, prepared, turned into placeholder tokens.
//! - [`metrics`]: Prometheus metrics.
//! - [`openai`]: request and response bodies, OpenAI-style errors.
//! - [`pipeline`]: admission → routing → dispatch → detokenized response stream.
//! - [`preprocess`]: chat templates, tokenization and incremental detokenization.
//! - [`responses`]: the Responses API lowered into chat requests, its events, its store.
//! - [`routing`]: the async shell around the routing core (which makes every decision:
//!   admission, worker choice, exclusion): the shared index, discovery, events, resync.
//! - [`server`]: running the frontend: its background tasks and its HTTP server.
//! - [`stop`]: stop strings.
//! - [`tools`]: tool calling and reasoning: the tools in the prompt, the answer parsed.

pub mod auth;
pub mod config;
pub mod constraint;
pub mod convert;
pub mod feature_store;
pub mod http;
pub mod media;
pub mod metrics;
pub mod openai;
pub mod pipeline;
pub mod preprocess;
pub mod responses;
pub mod routing;
pub mod server;
pub mod stop;
pub mod tools;

pub use config::FrontendConfig;
pub use pipeline::Frontend;
