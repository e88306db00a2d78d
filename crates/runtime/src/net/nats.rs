//! The event plane over NATS: one subject per namespace and model, MessagePack payloads.
//!
//! The client reconnects on its own; events published while the connection is down are
//! lost. Subscribers notice: each reconnection is passed on as [`WorkerEvent::EventsLost`]
//! (as is a subscriber falling behind its bounded queue), and a lost event in the middle of
//! a stream shows as a gap in the worker's event ids. Either way the frontend repairs from
//! the workers' dumps.
//!
//! KV event batches are split by encoded size, to stay under the server's payload limit
//! whatever the block size (a 16-token-block engine names 32 times the blocks of a
//! 512-token one for the same prompt).

use std::sync::Arc;

use async_nats::Event;
use async_trait::async_trait;
use futures::StreamExt;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::token;
use crate::channel::{LossySender, SUBSCRIPTION_CAPACITY};
use crate::events::{EventPlane, EventPlaneError, EventSubscription, WorkerEvent};
use crate::replicas::{ReplicaMessage, ReplicaPlane, ReplicaSubscription};

/// Bytes a message may take, as a share of the server's payload limit (leaving room for the
/// framing an estimate does not count).
const PAYLOAD_SHARE: f64 = 0.5;
/// The payload limit when the server has not said yet (NATS's default is 1 MiB).
const DEFAULT_MAX_PAYLOAD: usize = 1 << 20;

/// An upper bound on an event's MessagePack size: a fixed part, and two 64-bit hashes (at
/// most 9 bytes each, plus field names) per stored block, one per removed block.
fn encoded_size_bound(event: &switchyard_core::KvEvent) -> usize {
    64 + 40 * event.block_count()
}

/// Cuts `events` into runs whose encoded size stays under `budget` (a single event over it
/// goes alone).
fn split_by_size(
    events: Vec<switchyard_core::KvEvent>,
    budget: usize,
) -> Vec<Vec<switchyard_core::KvEvent>> {
    let mut out = Vec::new();
    let mut current = Vec::new();
    let mut size = 0;
    for event in events {
        let bound = encoded_size_bound(&event);
        if !current.is_empty() && size + bound > budget {
            out.push(std::mem::take(&mut current));
            size = 0;
        }
        size += bound;
        current.push(event);
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

#[derive(Debug, Clone)]
pub struct NatsEventPlane {
    client: async_nats::Client,
    namespace: String,
    /// Counts connections made after losing one.
    reconnections: Arc<watch::Sender<u64>>,
    tracker: TaskTracker,
    cancel: CancellationToken,
}

impl NatsEventPlane {
    /// Connects to `url` (`nats://host:port`). Returns at once; the connection is made, and
    /// remade, in the background.
    pub async fn connect(
        url: &str,
        namespace: &str,
        tracker: TaskTracker,
        cancel: CancellationToken,
    ) -> Result<Self, EventPlaneError> {
        let address = url.strip_prefix("nats://").unwrap_or(url).to_string();
        let reconnections = Arc::new(watch::Sender::new(0u64));
        let counter = Arc::clone(&reconnections);
        let lost_flag = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let callback = move |event: Event| {
            let counter = Arc::clone(&counter);
            let lost_flag = Arc::clone(&lost_flag);
            async move {
                use std::sync::atomic::Ordering;
                match event {
                    Event::Disconnected => {
                        tracing::warn!("lost the NATS connection; reconnecting");
                        lost_flag.store(true, Ordering::SeqCst);
                    }
                    Event::Connected => {
                        if lost_flag.swap(false, Ordering::SeqCst) {
                            tracing::info!("reconnected to NATS");
                            counter.send_modify(|n| *n += 1);
                        }
                    }
                    other => tracing::debug!(event = ?other, "NATS"),
                }
            }
        };
        let client = async_nats::ConnectOptions::new()
            .name("switchyard")
            .retry_on_initial_connect()
            .max_reconnects(None)
            .event_callback(callback)
            .connect(address)
            .await
            .map_err(|e| {
                EventPlaneError::Unavailable(format!("cannot connect to NATS at {url}: {e}"))
            })?;
        Ok(NatsEventPlane {
            client,
            namespace: token(namespace),
            reconnections,
            tracker,
            cancel,
        })
    }

    fn subject(&self, model: &str) -> String {
        format!("switchyard.{}.events.{}", self.namespace, token(model))
    }

    fn replica_subject(&self, model: &str) -> String {
        format!("switchyard.{}.replicas.{}", self.namespace, token(model))
    }

    async fn send(&self, subject: String, message: &impl Serialize) -> Result<(), EventPlaneError> {
        let payload = rmp_serde::to_vec(message)
            .map_err(|e| EventPlaneError::Unavailable(format!("cannot encode a message: {e}")))?;
        self.client
            .publish(subject, payload.into())
            .await
            .map_err(|e| EventPlaneError::Unavailable(format!("cannot publish to NATS: {e}")))
    }

    /// Subscribes to `subject` and forwards its decoded messages until cancelled, and
    /// `on_reconnect` (if any) after each reconnection.
    async fn forward<T>(
        &self,
        subject: String,
        on_reconnect: Option<T>,
    ) -> Result<mpsc::Receiver<T>, EventPlaneError>
    where
        T: DeserializeOwned + Clone + Send + 'static,
    {
        let mut subscriber =
            self.client.subscribe(subject).await.map_err(|e| {
                EventPlaneError::Unavailable(format!("cannot subscribe on NATS: {e}"))
            })?;
        let (mut tx, rx) = LossySender::channel(SUBSCRIPTION_CAPACITY, on_reconnect.clone());
        let cancel = self.cancel.clone();
        let mut reconnections = self.reconnections.subscribe();
        reconnections.mark_unchanged();
        self.tracker.spawn(async move {
            loop {
                let message = tokio::select! {
                    () = cancel.cancelled() => return,
                    changed = reconnections.changed(), if on_reconnect.is_some() => {
                        let marker = on_reconnect.clone();
                        if changed.is_err() || marker.is_some_and(|m| !tx.send(m)) {
                            return;
                        }
                        continue;
                    }
                    message = subscriber.next() => match message {
                        Some(message) => message,
                        None => return,
                    },
                };
                match rmp_serde::from_slice::<T>(&message.payload) {
                    Ok(decoded) => {
                        if !tx.send(decoded) {
                            return;
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "ignoring an undecodable message"),
                }
            }
        });
        Ok(rx)
    }
}

#[async_trait]
impl EventPlane for NatsEventPlane {
    async fn publish(&self, model: &str, event: WorkerEvent) -> Result<(), EventPlaneError> {
        let subject = self.subject(model);
        match event {
            WorkerEvent::Kv(events) => {
                let max_payload = match self.client.server_info().max_payload {
                    0 => DEFAULT_MAX_PAYLOAD,
                    n => n,
                };
                let budget = (max_payload as f64 * PAYLOAD_SHARE) as usize;
                for run in split_by_size(events, budget) {
                    self.send(subject.clone(), &WorkerEvent::Kv(run)).await?;
                }
                Ok(())
            }
            event => self.send(subject, &event).await,
        }
    }

    async fn subscribe(&self, model: &str) -> Result<EventSubscription, EventPlaneError> {
        self.forward(self.subject(model), Some(WorkerEvent::EventsLost))
            .await
    }
}

#[async_trait]
impl ReplicaPlane for NatsEventPlane {
    async fn publish_replica(
        &self,
        model: &str,
        message: &ReplicaMessage,
    ) -> Result<(), EventPlaneError> {
        self.send(self.replica_subject(model), message).await
    }

    async fn subscribe_replicas(
        &self,
        model: &str,
    ) -> Result<ReplicaSubscription, EventPlaneError> {
        self.forward(self.replica_subject(model), None).await
    }
}

#[cfg(test)]
mod tests {
    use switchyard_core::{
        KvEvent, KvEventData, LocalBlockHash, SequenceHash, StorageTier, StoredBlock, WorkerId,
    };

    use super::*;

    fn stored(id: u64, blocks: u64) -> KvEvent {
        KvEvent {
            worker_id: WorkerId(u64::MAX),
            dp_rank: 7,
            event_id: id,
            tier: StorageTier::Device,
            data: KvEventData::Stored {
                parent: Some(SequenceHash(u64::MAX)),
                blocks: (0..blocks)
                    .map(|b| StoredBlock {
                        seq_hash: SequenceHash(u64::MAX - b),
                        local_hash: LocalBlockHash(u64::MAX - 2 * b),
                    })
                    .collect(),
            },
        }
    }

    #[test]
    fn batches_split_by_encoded_size_and_the_bound_holds() {
        let events: Vec<KvEvent> = (1..=40).map(|i| stored(i, 100 * i)).collect();
        let budget = 64 << 10;
        let runs = split_by_size(events.clone(), budget);
        assert!(runs.len() > 1);
        let flat: Vec<KvEvent> = runs.iter().flatten().cloned().collect();
        assert_eq!(flat, events, "order and content kept");
        for run in &runs {
            let bytes = rmp_serde::to_vec(&WorkerEvent::Kv(run.clone())).expect("encodes");
            assert!(
                run.len() == 1 || bytes.len() <= budget,
                "{} bytes over {budget}",
                bytes.len()
            );
        }
        // The bound is an upper bound on what is really sent.
        for event in &events {
            let bytes = rmp_serde::to_vec(event).expect("encodes");
            assert!(bytes.len() <= encoded_size_bound(event));
        }
    }
}
