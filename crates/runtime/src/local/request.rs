//! In-process request plane: a registry of engine services by worker id.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use parking_lot::RwLock;
use switchyard_core::protocol::GenerateRequest;
use switchyard_core::{RequestId, SequenceHash, WorkerId};

use crate::discovery::WorkerInstance;
use crate::request::{EngineError, EngineService, RequestPlane, ResponseStream};

#[derive(Debug, Clone, Default)]
pub struct LocalRequestPlane {
    services: Arc<RwLock<HashMap<WorkerId, Arc<dyn EngineService>>>>,
}

impl LocalRequestPlane {
    pub fn new() -> Self {
        Self::default()
    }

    /// Makes a worker's service reachable.
    pub fn serve(&self, worker: WorkerId, service: Arc<dyn EngineService>) {
        self.services.write().insert(worker, service);
    }

    /// Makes a worker's service reachable unless another service already answers for its
    /// id (then leaves that one alone and returns false).
    pub fn claim(&self, worker: WorkerId, service: Arc<dyn EngineService>) -> bool {
        match self.services.write().entry(worker) {
            std::collections::hash_map::Entry::Occupied(_) => false,
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert(service);
                true
            }
        }
    }

    pub fn remove(&self, worker: WorkerId) {
        self.services.write().remove(&worker);
    }

    fn service(&self, worker: &WorkerInstance) -> Result<Arc<dyn EngineService>, EngineError> {
        self.services
            .read()
            .get(&worker.worker_id)
            .cloned()
            .ok_or_else(|| {
                EngineError::Unreachable(format!("worker {} is not served here", worker.worker_id))
            })
    }
}

#[async_trait]
impl RequestPlane for LocalRequestPlane {
    async fn generate(
        &self,
        worker: &WorkerInstance,
        request: GenerateRequest,
    ) -> Result<ResponseStream, EngineError> {
        let service = self.service(worker)?;
        service.generate(request).await
    }

    async fn held_blocks(
        &self,
        worker: &WorkerInstance,
        blocks: Vec<SequenceHash>,
    ) -> Result<u32, EngineError> {
        let service = self.service(worker)?;
        service.held_blocks(&blocks).await
    }

    async fn media_ready(
        &self,
        worker: &WorkerInstance,
        id: RequestId,
    ) -> Result<bool, EngineError> {
        let service = self.service(worker)?;
        service.media_ready(id).await
    }
}
