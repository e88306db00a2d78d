//! The benchmark client behind `switchyard bench`: drives an OpenAI-compatible endpoint
//! and measures it.
//!
//! - [`config`]: what to send, how fast, and when to stop ([`BenchConfig`]).
//! - `prompt`: prompt text from trace hash ids (equal ids give equal text).
//! - `plan`: the request sequence and its schedule for each load shape.
//! - `client`, `response`: one HTTP exchange, streamed (SSE) or not, timed.
//! - `runner`: dispatching under a load shape within the bounds; progress on a terminal.
//! - [`summary`], `report`, `plots`: statistics, the terminal summary, JSON and PNG/SVG.
//!
//! [`run_blocking`] is the entry point for a command line: it builds its own tokio runtime
//! and treats Ctrl-C as "stop sending, cancel what is in flight, report what was measured".

mod client;
pub mod config;
mod plan;
mod plots;
pub use plots::{DrawError, register_font};
mod progress;
mod prompt;
mod record;
mod report;
mod response;
mod runner;
pub mod sessions;
pub mod summary;
mod timeline;

use std::io;
use std::path::PathBuf;

pub use config::{
    BenchConfig, Endpoint, ExtraBody, ExtraBodyError, LoadShape, RequestSource, Slo,
    parse_extra_body,
};
pub use prompt::{PromptBuilder, VOCABULARY};
pub use record::{ErrorKind, RequestError, RequestRecord};
pub use report::BenchReport;
pub use runner::run;
pub use summary::BenchSummary;
use tokio_util::sync::CancellationToken;

/// Why a benchmark could not run or its results could not be written. Failed requests are
/// not errors: they are counted in the report.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("invalid benchmark setting: {0}")]
    InvalidConfig(String),
    #[error("cannot build the HTTP client")]
    Client(#[source] reqwest::Error),
    #[error("cannot start the async runtime")]
    Runtime(#[source] io::Error),
    #[error("cannot write {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot draw {path}: {source}")]
    Plot {
        path: PathBuf,
        #[source]
        source: DrawError,
    },
}

/// Runs a benchmark to completion on a runtime of its own. Ctrl-C stops dispatching and
/// cancels requests in flight; the report then covers what was measured.
pub fn run_blocking(config: BenchConfig) -> Result<BenchReport, BenchError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(BenchError::Runtime)?;
    runtime.block_on(async {
        let shutdown = CancellationToken::new();
        let bench = run(config, shutdown.clone());
        tokio::pin!(bench);
        tokio::select! {
            report = &mut bench => report,
            Ok(()) = tokio::signal::ctrl_c() => {
                eprintln!("interrupted: cancelling requests in flight");
                shutdown.cancel();
                bench.await
            }
        }
    })
}
