//! The event plane over NATS: one subject per namespace and model, MessagePack payloads.
//!
//! The client reconnects on its own; events published while the connection is down are
//! lost. Subscribers notice: each reconnection is passed on as
//! [`WorkerEvent::Reconnected`], and a lost event in the middle of a stream shows as a gap
//! in the worker's event ids. Either way the frontend repairs from the workers' dumps.

use std::sync::Arc;

use async_nats::Event;
use async_trait::async_trait;
use futures::StreamExt;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::token;
use crate::events::{EventPlane, EventPlaneError, EventSubscription, WorkerEvent};
use crate::replicas::{ReplicaMessage, ReplicaPlane, ReplicaSubscription};

/// Most KV events per message, to stay well under NATS's payload limit.
const MAX_EVENTS_PER_MESSAGE: usize = 256;

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

    async fn send(&self, subject: &str, event: &WorkerEvent) -> Result<(), EventPlaneError> {
        let payload = rmp_serde::to_vec(event)
            .map_err(|e| EventPlaneError::Unavailable(format!("cannot encode an event: {e}")))?;
        self.client
            .publish(subject.to_string(), payload.into())
            .await
            .map_err(|e| EventPlaneError::Unavailable(format!("cannot publish to NATS: {e}")))
    }
}

#[async_trait]
impl EventPlane for NatsEventPlane {
    async fn publish(&self, model: &str, event: WorkerEvent) -> Result<(), EventPlaneError> {
        let subject = self.subject(model);
        match event {
            WorkerEvent::Kv(events) if events.len() > MAX_EVENTS_PER_MESSAGE => {
                for chunk in events.chunks(MAX_EVENTS_PER_MESSAGE) {
                    self.send(&subject, &WorkerEvent::Kv(chunk.to_vec()))
                        .await?;
                }
                Ok(())
            }
            event => self.send(&subject, &event).await,
        }
    }

    async fn subscribe(&self, model: &str) -> Result<EventSubscription, EventPlaneError> {
        let mut subscriber = self
            .client
            .subscribe(self.subject(model))
            .await
            .map_err(|e| EventPlaneError::Unavailable(format!("cannot subscribe on NATS: {e}")))?;
        let (tx, rx) = mpsc::unbounded_channel();
        let cancel = self.cancel.clone();
        let mut reconnections = self.reconnections.subscribe();
        reconnections.mark_unchanged();
        self.tracker.spawn(async move {
            loop {
                let message = tokio::select! {
                    () = cancel.cancelled() => return,
                    changed = reconnections.changed() => {
                        if changed.is_err() || tx.send(WorkerEvent::Reconnected).is_err() {
                            return;
                        }
                        continue;
                    }
                    message = subscriber.next() => match message {
                        Some(message) => message,
                        None => return,
                    },
                };
                match rmp_serde::from_slice::<WorkerEvent>(&message.payload) {
                    Ok(event) => {
                        if tx.send(event).is_err() {
                            return;
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "ignoring an undecodable event"),
                }
            }
        });
        Ok(rx)
    }
}

#[async_trait]
impl ReplicaPlane for NatsEventPlane {
    async fn publish_replica(
        &self,
        model: &str,
        message: &ReplicaMessage,
    ) -> Result<(), EventPlaneError> {
        let payload = rmp_serde::to_vec(message)
            .map_err(|e| EventPlaneError::Unavailable(format!("cannot encode a message: {e}")))?;
        self.client
            .publish(self.replica_subject(model), payload.into())
            .await
            .map_err(|e| EventPlaneError::Unavailable(format!("cannot publish to NATS: {e}")))
    }

    async fn subscribe_replicas(
        &self,
        model: &str,
    ) -> Result<ReplicaSubscription, EventPlaneError> {
        let mut subscriber = self
            .client
            .subscribe(self.replica_subject(model))
            .await
            .map_err(|e| EventPlaneError::Unavailable(format!("cannot subscribe on NATS: {e}")))?;
        let (tx, rx) = mpsc::unbounded_channel();
        let cancel = self.cancel.clone();
        self.tracker.spawn(async move {
            loop {
                let message = tokio::select! {
                    () = cancel.cancelled() => return,
                    message = subscriber.next() => match message {
                        Some(message) => message,
                        None => return,
                    },
                };
                match rmp_serde::from_slice::<ReplicaMessage>(&message.payload) {
                    Ok(message) => {
                        if tx.send(message).is_err() {
                            return;
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "ignoring an undecodable replica message"),
                }
            }
        });
        Ok(rx)
    }
}
