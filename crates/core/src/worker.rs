//! Worker identity.

use std::fmt;

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// One worker process (an engine instance), as registered in discovery.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct WorkerId(pub u64);

impl fmt::Display for WorkerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:x}", self.0)
    }
}

/// What the router routes to: a worker and one of its data-parallel ranks.
///
/// Each rank has its own KV cache and its own event stream, so the indexer and the
/// active-sequence tracker key everything by this pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct WorkerKey {
    pub worker_id: WorkerId,
    #[serde(default)]
    pub dp_rank: u32,
}

impl WorkerKey {
    pub fn new(worker_id: u64, dp_rank: u32) -> Self {
        WorkerKey {
            worker_id: WorkerId(worker_id),
            dp_rank,
        }
    }
}

impl From<WorkerId> for WorkerKey {
    fn from(worker_id: WorkerId) -> Self {
        WorkerKey {
            worker_id,
            dp_rank: 0,
        }
    }
}

impl fmt::Display for WorkerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.worker_id, self.dp_rank)
    }
}

/// What a worker does in the fleet.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum WorkerRole {
    /// Prefill and decode on one engine.
    #[default]
    Aggregated,
    /// Prefill only, handing KV blocks to decode workers.
    Prefill,
    /// Decode from KV blocks computed elsewhere (or locally, for short prompts).
    Decode,
    /// Encodes media into embeddings for LLM workers.
    Encoder,
}

impl WorkerRole {
    pub const ALL: [WorkerRole; 4] = [
        WorkerRole::Aggregated,
        WorkerRole::Prefill,
        WorkerRole::Decode,
        WorkerRole::Encoder,
    ];

    pub fn name(self) -> &'static str {
        match self {
            WorkerRole::Aggregated => "aggregated",
            WorkerRole::Prefill => "prefill",
            WorkerRole::Decode => "decode",
            WorkerRole::Encoder => "encoder",
        }
    }

    /// Whether the worker generates tokens for text requests routed to it directly.
    pub fn serves_generation(self) -> bool {
        matches!(self, WorkerRole::Aggregated | WorkerRole::Decode)
    }
}

impl fmt::Display for WorkerRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is none of the worker roles.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("unknown worker role {0:?}; expected aggregated, prefill, decode or encoder")]
pub struct UnknownRole(pub String);

impl std::str::FromStr for WorkerRole {
    type Err = UnknownRole;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        WorkerRole::ALL
            .into_iter()
            .find(|r| r.name() == s)
            .ok_or_else(|| UnknownRole(s.to_string()))
    }
}
