//! Worker identity.

use std::fmt;

use serde::{Deserialize, Serialize};

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
