//! The wiring behind the `switchyard` command: the configuration tree and deployments.

pub mod config;
pub mod deploy;
#[cfg(feature = "kubernetes")]
pub mod kubernetes;
#[cfg(feature = "otel")]
pub mod otel;
