//! In-process event plane: fan-out to unbounded per-subscriber channels, so publishers
//! never wait and nothing is dropped.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use parking_lot::Mutex;
use tokio::sync::mpsc;

use crate::events::{EventPlane, EventPlaneError, EventSubscription, WorkerEvent};

#[derive(Debug, Clone, Default)]
pub struct LocalEventPlane {
    subscribers: Arc<Mutex<HashMap<String, Vec<mpsc::UnboundedSender<WorkerEvent>>>>>,
}

impl LocalEventPlane {
    pub fn new() -> Self {
        Self::default()
    }
}

#[async_trait]
impl EventPlane for LocalEventPlane {
    async fn publish(&self, model: &str, event: WorkerEvent) -> Result<(), EventPlaneError> {
        let mut subscribers = self.subscribers.lock();
        if let Some(list) = subscribers.get_mut(model) {
            list.retain(|s| s.send(event.clone()).is_ok());
        }
        Ok(())
    }

    async fn subscribe(&self, model: &str) -> Result<EventSubscription, EventPlaneError> {
        let (tx, rx) = mpsc::unbounded_channel();
        self.subscribers
            .lock()
            .entry(model.to_string())
            .or_default()
            .push(tx);
        Ok(rx)
    }
}
