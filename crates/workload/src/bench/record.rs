//! What one request measured.

use std::fmt;
use std::time::Duration;

use serde::{Serialize, Serializer};

use crate::units::{serialize_ms, serialize_ms_list, serialize_opt_ms};

/// Measurements of one request, times relative to the start of the run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RequestRecord {
    /// Position in the request sequence.
    pub index: usize,
    /// When an open-loop schedule meant it to be sent.
    #[serde(rename = "scheduled_ms", serialize_with = "serialize_opt_ms")]
    pub scheduled: Option<Duration>,
    /// When it was sent.
    #[serde(rename = "start_ms", serialize_with = "serialize_ms")]
    pub start: Duration,
    /// Time to the first content token (streaming only).
    #[serde(rename = "ttft_ms", serialize_with = "serialize_opt_ms")]
    pub ttft: Option<Duration>,
    /// Gaps between consecutive content chunks (streaming only).
    #[serde(rename = "itl_ms", serialize_with = "serialize_ms_list")]
    pub itl: Vec<Duration>,
    /// From sending to the end of the response, or to the failure.
    #[serde(rename = "latency_ms", serialize_with = "serialize_ms")]
    pub latency: Duration,
    /// Prompt tokens: the server's `usage` when sent, else the prompt's word count.
    pub input_tokens: u64,
    /// Output tokens: the server's `usage` when sent, else content chunks (streaming) or
    /// words of the text (not streaming).
    pub output_tokens: u64,
    /// Whether the token counts came from the server's `usage`.
    pub usage_reported: bool,
    /// Prompt tokens the server served from its prefix cache, when its `usage` says
    /// (`prompt_tokens_details.cached_tokens`).
    pub cached_tokens: Option<u64>,
    pub error: Option<RequestError>,
}

impl RequestRecord {
    pub fn succeeded(&self) -> bool {
        self.error.is_none()
    }

    /// Mean gap between content chunks; `None` with fewer than two chunks.
    pub fn mean_itl(&self) -> Option<Duration> {
        let count = u32::try_from(self.itl.len()).ok().filter(|&n| n > 0)?;
        Some(self.itl.iter().sum::<Duration>() / count)
    }

    /// Time per output token after the first: `(latency - ttft) / (output_tokens - 1)`.
    /// Differs from the mean ITL when a server packs several tokens into one chunk.
    pub fn tpot(&self) -> Option<Duration> {
        let ttft = self.ttft?;
        let after_first = u32::try_from(self.output_tokens.checked_sub(1)?)
            .ok()
            .filter(|&n| n > 0)?;
        Some(self.latency.saturating_sub(ttft) / after_first)
    }
}

/// A failed request: what kind of failure, and the detail.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RequestError {
    pub kind: ErrorKind,
    pub message: String,
}

impl RequestError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }
}

/// Failure kinds, counted separately in the report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ErrorKind {
    /// No connection could be made.
    Connect,
    /// The request's deadline passed.
    Timeout,
    /// The server answered with a non-success status.
    Http(u16),
    /// The connection broke after it was made (reset, closed mid-response).
    Dropped,
    /// The stream ended cleanly but without `[DONE]` or a finish reason.
    Incomplete,
    /// The response could not be understood (not JSON, no choices).
    Protocol,
    /// The server sent an error object in a success response or stream.
    Server,
    /// Cancelled by the user (Ctrl-C).
    Cancelled,
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Connect => f.write_str("connect"),
            Self::Timeout => f.write_str("timeout"),
            Self::Http(status) => write!(f, "http_{status}"),
            Self::Dropped => f.write_str("dropped"),
            Self::Incomplete => f.write_str("incomplete"),
            Self::Protocol => f.write_str("protocol"),
            Self::Server => f.write_str("server"),
            Self::Cancelled => f.write_str("cancelled"),
        }
    }
}

impl Serialize for ErrorKind {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(ttft_ms: u64, itl_ms: &[u64], latency_ms: u64, output_tokens: u64) -> RequestRecord {
        RequestRecord {
            index: 0,
            scheduled: None,
            start: Duration::ZERO,
            ttft: Some(Duration::from_millis(ttft_ms)),
            itl: itl_ms.iter().map(|&ms| Duration::from_millis(ms)).collect(),
            latency: Duration::from_millis(latency_ms),
            input_tokens: 1,
            output_tokens,
            usage_reported: true,
            cached_tokens: None,
            error: None,
        }
    }

    #[test]
    fn mean_itl_and_tpot() {
        let r = record(50, &[10, 20, 30], 110, 4);
        assert_eq!(r.mean_itl(), Some(Duration::from_millis(20)));
        assert_eq!(r.tpot(), Some(Duration::from_millis(20)));
        // Two tokens per chunk: ITL sees chunks, TPOT sees tokens.
        let packed = record(50, &[20, 20], 90, 5);
        assert_eq!(packed.mean_itl(), Some(Duration::from_millis(20)));
        assert_eq!(packed.tpot(), Some(Duration::from_millis(10)));
        assert_eq!(record(50, &[], 50, 1).tpot(), None);
        assert_eq!(record(50, &[], 50, 1).mean_itl(), None);
    }

    #[test]
    fn error_kinds_serialise_as_their_names() {
        let kinds = [ErrorKind::Http(503), ErrorKind::Dropped, ErrorKind::Timeout];
        assert_eq!(
            serde_json::to_string(&kinds).unwrap(),
            "[\"http_503\",\"dropped\",\"timeout\"]"
        );
    }
}
