//! The wiring behind the `switchyard` command.
//!
//! - [`config`]: the one configuration tree and its loader (file, environment, flags).
//! - [`deploy`]: deployments from it: `serve`'s in one process, a distributed frontend
//!   and its workers.
//! - [`engines`]: the engines this build's workers host, by name (the CPU engine with the
//!   `candle` feature).
//! - [`replay`]: the simulator's settings from the same tree, so a deployment replays as
//!   it is.
//! - `kubernetes` (feature `kubernetes`): the planner's connector to a cluster.
//! - `otel` (feature `otel`): request spans exported over OTLP.

pub mod config;
pub mod deploy;
pub mod engines;
#[cfg(feature = "kubernetes")]
pub mod kubernetes;
#[cfg(feature = "otel")]
pub mod otel;
pub mod replay;
