//! Engine load snapshots.

use serde::{Deserialize, Serialize};

/// What an engine reports about its load at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct LoadSnapshot {
    /// Requests queued, not yet admitted.
    pub waiting: u32,
    /// Requests admitted (prefilling or decoding).
    pub running: u32,
    /// KV blocks held by running requests.
    pub active_blocks: u64,
    /// KV blocks holding cached, reusable content not used by any running request.
    pub cached_blocks: u64,
    /// KV block capacity.
    pub capacity_blocks: u64,
    /// Prompt tokens admitted but not yet computed.
    pub active_prefill_tokens: u64,
}

impl LoadSnapshot {
    /// Share of the KV capacity held by running requests, in [0, 1].
    pub fn kv_usage(&self) -> f64 {
        if self.capacity_blocks == 0 {
            0.0
        } else {
            self.active_blocks as f64 / self.capacity_blocks as f64
        }
    }
}
