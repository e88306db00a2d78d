//! Worker KV state for resynchronisation: a frontend that starts late, or that missed
//! events, asks the worker for its whole cache.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use switchyard_core::{SequenceHash, WorkerId, WorkerKey};
use switchyard_router::{Indexer, WorkerSnapshot};
use thiserror::Error;

use crate::discovery::WorkerInstance;

/// Where a frontend gets a worker's cache from.
#[async_trait]
pub trait KvSnapshotSource: Send + Sync + std::fmt::Debug {
    /// The worker's cache, one snapshot per data-parallel rank that holds blocks.
    async fn snapshot(&self, worker: &WorkerInstance)
    -> Result<Vec<WorkerSnapshot>, SnapshotError>;
}

/// Why a worker's cache could not be fetched; the frontend retries with a backoff.
#[derive(Debug, Error)]
pub enum SnapshotError {
    /// No worker in this process lends its cache record under that id.
    #[error("worker {0} keeps no cache record here")]
    NotHere(WorkerId),
    #[error("{0} has no address")]
    NoAddress(WorkerId),
    #[error("{address}: {source}")]
    Unreachable {
        address: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("{address} answered {status}")]
    Status {
        address: String,
        status: reqwest::StatusCode,
    },
    #[error("{address}: invalid dump: {source}")]
    InvalidDump {
        address: String,
        #[source]
        source: rmp_serde::decode::Error,
    },
    /// Another source's failure (a source outside this crate, or a test's).
    #[error(transparent)]
    Other(Box<dyn std::error::Error + Send + Sync>),
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
