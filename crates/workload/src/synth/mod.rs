//! Learning a trace's prefix structure and sampling new traces from it.
//!
//! [`SynthModel::learn`] builds the prefix tree of the trace's hash-id paths, keeps its shared
//! (core) part as radix nodes with next-step distributions, and keeps everything else as
//! empirical distributions: unique prompt lengths, tokens in the last block, output lengths
//! and inter-arrival gaps. [`SynthModel::generate`] samples requests from that, scaled by the
//! knobs of [`SynthConfig`].

mod config;
mod generate;
mod media;
mod model;

pub use crate::stats::Sampling;
pub use config::{Arrivals, RateShape, SynthConfig};
pub use media::{MediaMix, MediaMixError};
pub use model::SynthModel;

use switchyard_core::trace::MooncakeRecord;

use crate::trace_io::{RecordError, Trace, TraceError};

/// Why synthesis could not run.
#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    #[error("{flag} must be {requirement}, got {value}")]
    InvalidKnob {
        flag: &'static str,
        requirement: &'static str,
        value: String,
    },
    #[error(transparent)]
    Record(#[from] RecordError),
    #[error(transparent)]
    Trace(#[from] TraceError),
}

/// Learns from a trace file's records and samples a new trace; record problems name the line.
pub fn generate_from_trace(
    trace: &Trace,
    config: &SynthConfig,
) -> Result<Vec<MooncakeRecord>, SynthError> {
    config.validate()?;
    let model = SynthModel::learn(&trace.records, config.block_size)
        .map_err(|e| SynthError::Trace(trace.locate(e)))?;
    Ok(model.generate(config))
}
