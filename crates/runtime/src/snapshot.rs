//! Worker KV state for resynchronisation: a frontend that starts late, or that missed
//! events, asks the worker for its whole cache.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use switchyard_core::{SequenceHash, WorkerKey};
use switchyard_router::{Indexer, WorkerSnapshot};

use crate::discovery::WorkerInstance;

/// Where a frontend gets a worker's cache from.
#[async_trait]
pub trait KvSnapshotSource: Send + Sync + std::fmt::Debug {
    /// The worker's cache, one snapshot per data-parallel rank that holds blocks.
    async fn snapshot(&self, worker: &WorkerInstance) -> Result<Vec<WorkerSnapshot>, String>;
}

/// What an index holds, per worker stream, in a form two processes can compare: the
/// sequence hashes, sorted.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct IndexView {
    pub streams: Vec<StreamView>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamView {
    pub worker: WorkerKey,
    pub last_event_id: Option<u64>,
    pub blocks: Vec<SequenceHash>,
}

impl IndexView {
    pub fn of(indexer: &Indexer) -> Self {
        let mut streams: Vec<StreamView> = indexer
            .workers()
            .map(|worker| {
                let mut blocks = indexer.worker_hashes(worker);
                blocks.sort_unstable();
                StreamView {
                    worker,
                    last_event_id: indexer.last_event_id(worker),
                    blocks,
                }
            })
            .filter(|s| !s.blocks.is_empty())
            .collect();
        streams.sort_by_key(|s| s.worker);
        IndexView { streams }
    }

    /// The streams of one worker.
    pub fn worker(&self, worker_id: switchyard_core::WorkerId) -> Vec<&StreamView> {
        self.streams
            .iter()
            .filter(|s| s.worker.worker_id == worker_id)
            .collect()
    }
}
