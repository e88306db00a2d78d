//! Logging setup for the commands that run services.

use anyhow::{Context, Result};
use tracing_subscriber::EnvFilter;

/// Logs to stderr with the given filter (from the configuration, not the environment).
pub fn init(filter: &str) -> Result<()> {
    let filter =
        EnvFilter::try_new(filter).with_context(|| format!("invalid log filter {filter:?}"))?;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colours on a terminal only, not in log files.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init()
        .ok();
    Ok(())
}
