//! In-process discovery: a map behind a watch channel.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use switchyard_core::WorkerId;
use tokio::sync::watch;

use crate::discovery::{Discovery, DiscoveryError, Instances, Lease, WorkerInstance};

#[derive(Debug, Clone)]
pub struct LocalDiscovery {
    instances: Arc<watch::Sender<Instances>>,
}

impl Default for LocalDiscovery {
    fn default() -> Self {
        LocalDiscovery {
            instances: Arc::new(watch::Sender::new(Arc::new(BTreeMap::new()))),
        }
    }
}

impl LocalDiscovery {
    pub fn new() -> Self {
        Self::default()
    }
}

#[derive(Debug)]
struct LocalLease {
    worker_id: WorkerId,
    instances: Arc<watch::Sender<Instances>>,
}

impl Lease for LocalLease {
    fn worker_id(&self) -> WorkerId {
        self.worker_id
    }
}

impl Drop for LocalLease {
    fn drop(&mut self) {
        let id = self.worker_id;
        self.instances.send_if_modified(|current| {
            if !current.contains_key(&id) {
                return false;
            }
            let mut next = (**current).clone();
            next.remove(&id);
            *current = Arc::new(next);
            true
        });
    }
}

#[async_trait]
impl Discovery for LocalDiscovery {
    async fn register(&self, instance: WorkerInstance) -> Result<Box<dyn Lease>, DiscoveryError> {
        let id = instance.worker_id;
        let mut duplicate = false;
        self.instances.send_if_modified(|current| {
            if current.contains_key(&id) {
                duplicate = true;
                return false;
            }
            let mut next = (**current).clone();
            next.insert(id, instance);
            *current = Arc::new(next);
            true
        });
        if duplicate {
            return Err(DiscoveryError::Duplicate(id));
        }
        Ok(Box::new(LocalLease {
            worker_id: id,
            instances: Arc::clone(&self.instances),
        }))
    }

    fn watch(&self) -> watch::Receiver<Instances> {
        self.instances.subscribe()
    }
}
