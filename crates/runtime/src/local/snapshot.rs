//! In-process KV dumps: workers in the same process lend the frontend a way to read their
//! cache records, so a local deployment resynchronises like a distributed one (after a
//! subscriber fell behind and lost events, or when a worker restarts).

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use parking_lot::RwLock;
use switchyard_core::WorkerId;
use switchyard_router::WorkerSnapshot;

use crate::discovery::WorkerInstance;
use crate::snapshot::{KvSnapshotSource, SnapshotError};

/// Reads one worker's cache record.
pub type DumpFn = Arc<dyn Fn() -> Vec<WorkerSnapshot> + Send + Sync>;

#[derive(Clone, Default)]
pub struct LocalKvSnapshots {
    workers: Arc<RwLock<HashMap<WorkerId, DumpFn>>>,
}

impl std::fmt::Debug for LocalKvSnapshots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalKvSnapshots")
            .field("workers", &self.workers.read().len())
            .finish()
    }
}

impl LocalKvSnapshots {
    pub fn new() -> Self {
        Self::default()
    }

    /// Lends `worker`'s dump unless another already answers for its id (then leaves that
    /// one alone and returns false).
    pub fn claim(&self, worker: WorkerId, dump: DumpFn) -> bool {
        match self.workers.write().entry(worker) {
            std::collections::hash_map::Entry::Occupied(_) => false,
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert(dump);
                true
            }
        }
    }

    pub fn remove(&self, worker: WorkerId) {
        self.workers.write().remove(&worker);
    }
}

#[async_trait]
impl KvSnapshotSource for LocalKvSnapshots {
    async fn snapshot(
        &self,
        worker: &WorkerInstance,
    ) -> Result<Vec<WorkerSnapshot>, SnapshotError> {
        let dump = self
            .workers
            .read()
            .get(&worker.worker_id)
            .cloned()
            .ok_or(SnapshotError::NotHere(worker.worker_id))?;
        Ok(dump())
    }
}
