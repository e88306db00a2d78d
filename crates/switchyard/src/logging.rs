//! Logging setup for the commands that run services.
//!
//! Nothing logs prompt or completion text at `info` or above (a test checks it): logs go to
//! collectors that are not meant to hold users' data.

use anyhow::{Context, Result};
use switchyard::config::{LogConfig, LogFormat};
use tracing_subscriber::EnvFilter;

/// Logs to stderr with the configured filter and format (from the configuration, not the
/// environment).
pub fn init(config: &LogConfig) -> Result<()> {
    let filter = EnvFilter::try_new(&config.level)
        .with_context(|| format!("invalid log filter {:?}", config.level))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match config.format {
        // One JSON object per line: timestamp, level, target, fields (message included),
        // the spans the event happened in.
        LogFormat::Json => builder
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .try_init()
            .ok(),
        // Colours on a terminal only, not in log files.
        LogFormat::Text => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .try_init()
            .ok(),
    };
    Ok(())
}
