//! In-process event plane: fan-out to bounded per-subscriber queues. Publishers never wait;
//! a subscriber that falls behind loses events and is told so (see [`crate::channel`]).

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use parking_lot::Mutex;

use crate::channel::{LossySender, SUBSCRIPTION_CAPACITY};
use crate::events::{EventPlane, EventPlaneError, EventSubscription, WorkerEvent};

#[derive(Debug, Clone, Default)]
pub struct LocalEventPlane {
    subscribers: Arc<Mutex<HashMap<String, Vec<LossySender<WorkerEvent>>>>>,
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
            list.retain_mut(|s| s.send(event.clone()));
        }
        Ok(())
    }

    async fn subscribe(&self, model: &str) -> Result<EventSubscription, EventPlaneError> {
        let (tx, rx) = LossySender::channel(SUBSCRIPTION_CAPACITY, Some(WorkerEvent::EventsLost));
        self.subscribers
            .lock()
            .entry(model.to_string())
            .or_default()
            .push(tx);
        Ok(rx)
    }
}
