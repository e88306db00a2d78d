//! Hosting an engine: a worker builds its engine, registers it in discovery under a lease,
//! publishes its KV events and load on the event plane, and serves generate requests.
//!
//! - [`config`]: what engine to run (the mocker, or the echo engine) and as which model.
//! - [`mocker`], [`echo`]: the engines as request-plane services.
//! - [`host`]: starting a worker on a set of planes.

pub mod config;
pub mod echo;
pub mod host;
pub mod kv_state;
pub mod mocker;

pub use config::{EchoConfig, EngineConfig, MockerConfig, WorkerConfig};
pub use host::{Serving, Worker, WorkerError, WorkerPlanes};
