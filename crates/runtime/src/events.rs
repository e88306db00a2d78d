//! The event plane: KV events and load reports, from workers to frontends.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use switchyard_core::{KvEvent, LoadSnapshot, WorkerKey};
use thiserror::Error;
use tokio::sync::mpsc;

/// Something a worker reports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkerEvent {
    /// KV cache changes, in order.
    Kv(Vec<KvEvent>),
    /// The engine's load after a step.
    Load {
        worker: WorkerKey,
        load: LoadSnapshot,
    },
    /// Never published: events may have been lost on this subscription (its plane lost
    /// its connection and got it back, or the subscriber fell behind and messages were
    /// dropped), so every worker needs resynchronising.
    EventsLost,
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum EventPlaneError {
    #[error("event plane unavailable: {0}")]
    Unavailable(String),
}

/// A subscription's events, in publication order per worker. Bounded: a subscriber that
/// falls behind loses events and receives [`WorkerEvent::EventsLost`] (see
/// [`crate::channel`]).
pub type EventSubscription = mpsc::Receiver<WorkerEvent>;

#[async_trait]
pub trait EventPlane: Send + Sync + std::fmt::Debug {
    /// Publishes an event about `model`'s workers.
    async fn publish(&self, model: &str, event: WorkerEvent) -> Result<(), EventPlaneError>;

    /// Every later event about `model`'s workers.
    async fn subscribe(&self, model: &str) -> Result<EventSubscription, EventPlaneError>;
}
