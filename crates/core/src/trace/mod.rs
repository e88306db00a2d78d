//! Mooncake-style request traces, and how their blocks map onto engine blocks.
//!
//! A Mooncake row is `{timestamp (ms), input_length, output_length, hash_ids}` where each hash
//! id stands for one trace block of (usually) 512 tokens; equal ids at equal positions mean
//! a shared prefix. Engines use smaller blocks, so each trace block expands into
//! `trace_block_size / engine_block_size` engine blocks whose hashes derive from the trace id
//! and the position inside it: shared trace prefixes stay shared engine prefixes.
//!
//! Rows may also carry a session (Dynamo's session and agentic forms, so users' traces read
//! unchanged): rows sharing a `session_id` are turns sent one after another's completion,
//! and `wait_for` names the requests whose completions release a row. [`session`] resolves
//! them.
//!
//! Reading files is the caller's business; this module parses lines.

pub mod session;

use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::hash::{DEFAULT_SEED, LocalBlockHash};

/// One request of a Mooncake trace.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MooncakeRecord {
    /// Arrival, in milliseconds from the start of the trace (a whole number of them; a
    /// fraction is rounded). A session's later turns arrive by their `delay` instead.
    #[serde(default, deserialize_with = "session::whole_ms")]
    pub timestamp: u64,
    pub input_length: u64,
    pub output_length: u64,
    #[serde(default)]
    pub hash_ids: Vec<u64>,
    /// Media items in the prompt (a multimodal trace), in order, not overlapping; their
    /// tokens are part of `input_length`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub media: Vec<MediaRecord>,
    /// The session this row is a turn of; none: a session of its own.
    #[serde(
        default,
        deserialize_with = "session::opt_name",
        skip_serializing_if = "Option::is_none"
    )]
    pub session_id: Option<String>,
    /// Milliseconds after the previous turn of the session (or the last of `wait_for`)
    /// completes, before this row is sent.
    #[serde(default, alias = "delay_ms", skip_serializing_if = "Option::is_none")]
    pub delay: Option<f64>,
    /// The name `wait_for` refers to this row by.
    #[serde(
        default,
        deserialize_with = "session::opt_name",
        skip_serializing_if = "Option::is_none"
    )]
    pub request_id: Option<String>,
    /// The requests (by `request_id`, of any session) whose completions release this row:
    /// siblings of a fan-out share one, a join names several.
    #[serde(
        default,
        deserialize_with = "session::names",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub wait_for: Vec<String>,
    /// Milliseconds a tool ran before this row could be sent, after `delay`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_wait_ms: Option<f64>,
}

/// A media item of a trace request: its placeholder tokens take `tokens` positions from
/// `offset`; equal `hash`es are the same item (reused, so cacheable).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MediaRecord {
    pub modality: crate::protocol::Modality,
    pub offset: u64,
    pub tokens: u64,
    pub hash: u64,
}

/// The trace block size of the published Mooncake traces.
pub const MOONCAKE_BLOCK_SIZE: u32 = 512;

impl MooncakeRecord {
    /// Parses one JSONL line.
    pub fn parse(line: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(line)
    }

    /// Local hashes of the request's full engine blocks.
    ///
    /// Trace block `i` covers tokens `[i·T, (i+1)·T)`; engine block `j` lies in trace block
    /// `j·E / T`. Only blocks entirely inside `input_length` are full. When `E` does not
    /// divide `T`, an engine block spanning two trace blocks hashes both ids.
    pub fn engine_block_hashes(
        &self,
        trace_block_size: u32,
        engine_block_size: u32,
    ) -> Vec<LocalBlockHash> {
        let (t, e) = (
            u64::from(trace_block_size.max(1)),
            u64::from(engine_block_size.max(1)),
        );
        let full = self.input_length / e;
        let mut out = Vec::with_capacity(full as usize);
        for j in 0..full {
            let (start, end) = (j * e, (j + 1) * e - 1);
            let (first, last) = ((start / t) as usize, (end / t) as usize);
            let Some(&id) = self.hash_ids.get(first) else {
                break;
            };
            let mut key = [0u8; 24];
            key[..8].copy_from_slice(&id.to_le_bytes());
            key[8..16].copy_from_slice(&(start % t).to_le_bytes());
            if last != first {
                let Some(&next) = self.hash_ids.get(last) else {
                    break;
                };
                key[16..].copy_from_slice(&next.to_le_bytes());
            }
            out.push(LocalBlockHash(xxh3_64_with_seed(&key, DEFAULT_SEED)));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(len: u64, ids: &[u64]) -> MooncakeRecord {
        MooncakeRecord {
            media: Vec::new(),
            timestamp: 0,
            input_length: len,
            output_length: 1,
            hash_ids: ids.to_vec(),
            ..MooncakeRecord::default()
        }
    }

    #[test]
    fn shared_trace_prefixes_stay_shared() {
        let a = record(1500, &[1, 2, 3]).engine_block_hashes(512, 64);
        let b = record(1200, &[1, 2, 9]).engine_block_hashes(512, 64);
        assert_eq!(a.len(), 23);
        assert_eq!(b.len(), 18);
        assert_eq!(a[..16], b[..16]);
        assert_ne!(a[16], b[16]);
        // Distinct positions inside one trace block hash differently.
        assert_ne!(a[0], a[1]);
    }

    #[test]
    fn engine_block_spanning_two_trace_blocks_depends_on_both() {
        // Engine blocks of 48 tokens: block 10 spans tokens 480..528, across ids 0 and 1.
        let a = record(1024, &[5, 6]).engine_block_hashes(512, 48);
        let b = record(1024, &[5, 7]).engine_block_hashes(512, 48);
        assert_eq!(a[..10], b[..10]);
        assert_ne!(a[10], b[10]);
    }

    #[test]
    fn parses_a_trace_line() {
        let r = MooncakeRecord::parse(
            r#"{"timestamp": 27, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1]}"#,
        )
        .expect("valid line");
        assert_eq!(r.timestamp, 27);
        assert_eq!(r.hash_ids, vec![0, 1]);
        assert!(MooncakeRecord::parse("{\"timestamp\": \"x\"}").is_err());
    }
}
