//! Replica sync between the frontends of a model (see `switchyard_runtime::replicas`).
//!
//! Each frontend sends its routing events (routed, prefill done, finished) in the order its
//! router took them, and every `alive_interval` the list of requests it still has. Another
//! frontend records those requests in its own router under ids of their own (top bit set,
//! so they never meet local ids), counting them in the workers' load like its own. A
//! request the `Alive` list no longer names is freed (its `Finished` was lost), and a
//! frontend silent for `peer_timeout` is presumed dead and all its requests freed.
//!
//! The outbox is bounded: if publishing falls behind, events are dropped rather than piling
//! up, and the next `Alive` announcement repairs what the others missed.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use switchyard_core::{RequestId, SequenceHash};
use switchyard_router::RouteDecision;
use switchyard_runtime::channel::{LossySender, SUBSCRIPTION_CAPACITY};
use switchyard_runtime::{ReplicaEvent, ReplicaMessage, ReplicaPlane, ReplicaSubscription};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::RoutingService;

/// Requests of other frontends have this bit set in their local id.
const REMOTE: u64 = 1 << 63;
/// Most events in one message.
const MAX_EVENTS_PER_MESSAGE: usize = 256;

#[derive(Debug, Clone, Copy)]
pub struct ReplicaSettings {
    /// How often a frontend announces its requests.
    pub alive_interval: Duration,
    /// A frontend not heard from for this long is presumed gone.
    pub peer_timeout: Duration,
}

impl Default for ReplicaSettings {
    fn default() -> Self {
        ReplicaSettings {
            alive_interval: Duration::from_secs(2),
            peer_timeout: Duration::from_secs(10),
        }
    }
}

#[derive(Debug)]
pub(super) struct Replicas {
    frontend: u64,
    outbox: Mutex<LossySender<ReplicaEvent>>,
    peers: Mutex<HashMap<u64, Peer>>,
    settings: ReplicaSettings,
}

#[derive(Debug)]
struct Peer {
    last_seen: Instant,
    /// Its requests recorded here, by its ids.
    requests: HashSet<RequestId>,
}

/// The local id of another frontend's request.
fn remote_id(frontend: u64, request: RequestId) -> RequestId {
    // A 64-bit mix of both (splitmix64's finaliser); collisions are as likely as between
    // random ids.
    let mut x = frontend.rotate_left(29) ^ request.0.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    RequestId((x ^ (x >> 31)) | REMOTE)
}

impl Replicas {
    fn send(&self, event: ReplicaEvent) {
        // The publisher has stopped only when the frontend is shutting down.
        self.outbox.lock().send(event);
    }

    pub(super) fn routed(&self, id: RequestId, decision: &RouteDecision, blocks: &[SequenceHash]) {
        self.send(ReplicaEvent::Routed {
            request: id,
            worker: decision.worker,
            prefill_tokens: decision.prefill_tokens,
            seq_hashes: blocks.to_vec(),
        });
    }

    pub(super) fn prefill_done(&self, id: RequestId) {
        if id.0 & REMOTE == 0 {
            self.send(ReplicaEvent::PrefillDone { request: id });
        }
    }

    pub(super) fn finished(&self, id: RequestId) {
        if id.0 & REMOTE == 0 {
            self.send(ReplicaEvent::Finished { request: id });
        }
    }
}

impl RoutingService {
    /// Shares routing state with the model's other frontends: returns the events to
    /// publish (see [`publish_replicas`]); apply theirs with [`RoutingService::apply_replicas`].
    pub fn with_replicas(
        mut self,
        frontend: u64,
        settings: ReplicaSettings,
    ) -> (Self, mpsc::Receiver<ReplicaEvent>) {
        let (outbox, events) = LossySender::channel(SUBSCRIPTION_CAPACITY, None);
        self.replicas = Some(Replicas {
            frontend,
            outbox: Mutex::new(outbox),
            peers: Mutex::new(HashMap::new()),
            settings,
        });
        (self, events)
    }

    /// Applies another frontend's events (its own messages come back too, and are skipped).
    pub fn apply_replicas(&self, message: ReplicaMessage) {
        let Some(replicas) = &self.replicas else {
            return;
        };
        // Its own messages, and traffic reports (for planners; frontends with replica
        // sync off send them too, and are no peers).
        let traffic = |e: &ReplicaEvent| matches!(e, ReplicaEvent::Traffic(_));
        if message.frontend == replicas.frontend || message.events.iter().all(traffic) {
            return;
        }
        let now = self.now();
        let mut core = self.core.lock();
        let mut peers = replicas.peers.lock();
        let peer = peers.entry(message.frontend).or_insert_with(|| {
            tracing::info!(
                frontend = format!("{:x}", message.frontend),
                "another frontend of the model"
            );
            Peer {
                last_seen: Instant::now(),
                requests: HashSet::new(),
            }
        });
        peer.last_seen = Instant::now();
        let mut freed = false;
        for event in message.events {
            match event {
                ReplicaEvent::Routed {
                    request,
                    worker,
                    prefill_tokens,
                    seq_hashes,
                } => {
                    let local = remote_id(message.frontend, request);
                    // Unknown workers (not yet, or no longer, discovered here) are skipped.
                    if core.record_external(local, worker, &seq_hashes, prefill_tokens, now) {
                        peer.requests.insert(request);
                    }
                }
                ReplicaEvent::PrefillDone { request } => {
                    core.prefill_done(remote_id(message.frontend, request), now);
                }
                ReplicaEvent::Finished { request } => {
                    if peer.requests.remove(&request) {
                        core.finish(remote_id(message.frontend, request));
                        freed = true;
                    }
                }
                ReplicaEvent::Traffic(_) => {}
                ReplicaEvent::Alive { requests } => {
                    let alive: HashSet<RequestId> = requests.into_iter().collect();
                    let lost: Vec<RequestId> = peer.requests.difference(&alive).copied().collect();
                    for request in lost {
                        peer.requests.remove(&request);
                        core.finish(remote_id(message.frontend, request));
                        freed = true;
                    }
                }
            }
        }
        drop((peers, core));
        if freed {
            self.pump();
        }
    }

    /// Announces this frontend's requests, and drops frontends not heard from in time.
    /// Returns how many frontends were dropped.
    pub fn replica_tick(&self) -> usize {
        let Some(replicas) = &self.replicas else {
            return 0;
        };
        let mut core = self.core.lock();
        let own: Vec<RequestId> = core
            .active_request_ids()
            .filter(|id| id.0 & REMOTE == 0)
            .collect();
        replicas.send(ReplicaEvent::Alive { requests: own });
        let mut peers = replicas.peers.lock();
        let timeout = replicas.settings.peer_timeout;
        let gone: Vec<u64> = peers
            .iter()
            .filter(|(_, p)| p.last_seen.elapsed() > timeout)
            .map(|(&f, _)| f)
            .collect();
        for frontend in &gone {
            if let Some(peer) = peers.remove(frontend) {
                tracing::warn!(
                    frontend = format!("{frontend:x}"),
                    requests = peer.requests.len(),
                    "another frontend went silent; freeing its requests"
                );
                for request in peer.requests {
                    core.finish(remote_id(*frontend, request));
                }
            }
        }
        drop((peers, core));
        if !gone.is_empty() {
            self.pump();
        }
        gone.len()
    }

    /// Requests of other frontends counted here.
    pub fn replica_requests(&self) -> usize {
        self.replicas.as_ref().map_or(0, |r| {
            r.peers.lock().values().map(|p| p.requests.len()).sum()
        })
    }
}

/// Publishes this frontend's events, batched, until cancelled; announces its requests
/// every `alive_interval`.
pub async fn publish_replicas(
    routing: Arc<RoutingService>,
    plane: Arc<dyn ReplicaPlane>,
    mut events: mpsc::Receiver<ReplicaEvent>,
    cancel: CancellationToken,
) {
    let Some(replicas) = &routing.replicas else {
        return;
    };
    let frontend = replicas.frontend;
    let mut tick = tokio::time::interval(replicas.settings.alive_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let first = tokio::select! {
            () = cancel.cancelled() => return,
            _ = tick.tick() => {
                routing.replica_tick();
                continue;
            }
            event = events.recv() => match event {
                Some(event) => event,
                None => return,
            },
        };
        let mut batch = vec![first];
        while batch.len() < MAX_EVENTS_PER_MESSAGE {
            match events.try_recv() {
                Ok(event) => batch.push(event),
                Err(_) => break,
            }
        }
        let message = ReplicaMessage {
            frontend,
            events: batch,
        };
        if let Err(e) = plane.publish_replica(routing.model(), &message).await {
            tracing::warn!(error = %e, "cannot share routing state with the other frontends");
        }
    }
}

/// Applies the other frontends' events until cancelled.
pub async fn follow_replicas(
    routing: Arc<RoutingService>,
    mut messages: ReplicaSubscription,
    cancel: CancellationToken,
) {
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            message = messages.recv() => match message {
                Some(message) => routing.apply_replicas(message),
                None => return,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_ids_never_meet_local_ones_and_differ_by_frontend() {
        let a = remote_id(1, RequestId(5));
        assert_ne!(a.0 & REMOTE, 0);
        assert_ne!(a, remote_id(2, RequestId(5)));
        assert_ne!(a, remote_id(1, RequestId(6)));
        assert_eq!(a, remote_id(1, RequestId(5)));
    }
}
