//! Workloads: trace formats, trace analysis and synthesis, and the benchmark client.
//!
//! - [`trace_io`]: reading and writing Mooncake JSONL files (row type:
//!   `switchyard_core::trace::MooncakeRecord`), with line numbers in errors.
//! - [`azure`]: reading the Azure LLM inference CSV traces (no prefix information).
//! - [`prefix`]: the prefix tree of a trace's hash-id paths and its shared core.
//! - [`analyze`]: the structure of a trace (`switchyard synth analyze`).
//! - [`synth`]: learning that structure and sampling new traces (`switchyard synth generate`).
//! - [`bench`](mod@bench): the benchmark client for OpenAI-compatible endpoints (`switchyard bench`).
//! - [`profile`]: profiling an engine through its API into the mocker's timing profile and
//!   a report (`switchyard profile`).
//! - [`stats`], [`units`]: summaries, empirical distributions, and how reports print them.

pub mod analyze;
pub mod azure;
pub mod bench;
pub mod prefix;
pub mod profile;
pub mod stats;
pub mod synth;
pub mod trace_io;
pub mod units;
