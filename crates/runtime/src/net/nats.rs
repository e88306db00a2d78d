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
use serde::Serialize;
use serde::de::DeserializeOwned;
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
    ) -> Result<mpsc::UnboundedReceiver<T>, EventPlaneError>
    where
        T: DeserializeOwned + Clone + Send + 'static,
    {
        let mut subscriber =
            self.client.subscribe(subject).await.map_err(|e| {
                EventPlaneError::Unavailable(format!("cannot subscribe on NATS: {e}"))
            })?;
        let (tx, rx) = mpsc::unbounded_channel();
        let cancel = self.cancel.clone();
        let mut reconnections = self.reconnections.subscribe();
        reconnections.mark_unchanged();
        self.tracker.spawn(async move {
            loop {
                let message = tokio::select! {
                    () = cancel.cancelled() => return,
                    changed = reconnections.changed(), if on_reconnect.is_some() => {
                        let marker = on_reconnect.clone();
                        if changed.is_err() || marker.is_some_and(|m| tx.send(m).is_err()) {
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
                        if tx.send(decoded).is_err() {
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
            WorkerEvent::Kv(events) if events.len() > MAX_EVENTS_PER_MESSAGE => {
                for chunk in events.chunks(MAX_EVENTS_PER_MESSAGE) {
                    self.send(subject.clone(), &WorkerEvent::Kv(chunk.to_vec()))
                        .await?;
                }
                Ok(())
            }
            event => self.send(subject, &event).await,
        }
    }

    async fn subscribe(&self, model: &str) -> Result<EventSubscription, EventPlaneError> {
        self.forward(self.subject(model), Some(WorkerEvent::Reconnected))
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
