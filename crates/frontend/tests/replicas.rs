//! Replica sync between frontends: each counts the others' requests in the workers' load.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use switchyard_core::{RequestId, WorkerId, WorkerKey};
use switchyard_frontend::routing::{ReplicaSettings, RoutingService};
use switchyard_router::{RoutingConfig, RoutingOverrides};
use switchyard_runtime::{ReplicaEvent, ReplicaMessage, TrafficCounters, WorkerInstance};
use tokio::sync::mpsc::Receiver;

struct Frontend {
    id: u64,
    routing: Arc<RoutingService>,
    outbox: Receiver<ReplicaEvent>,
}

impl Frontend {
    fn new(id: u64, settings: ReplicaSettings) -> Self {
        let (routing, outbox) =
            RoutingService::new("m".into(), RoutingConfig::default()).with_replicas(id, settings);
        let routing = Arc::new(routing);
        let workers: BTreeMap<WorkerId, WorkerInstance> = (1..=2)
            .map(|id| {
                (
                    WorkerId(id),
                    WorkerInstance {
                        block_size: Some(16),
                        capacity_blocks: Some(1000),
                        max_num_seqs: Some(8),
                        ..WorkerInstance::new(WorkerId(id), "m")
                    },
                )
            })
            .collect();
        routing.sync_workers(&Arc::new(workers));
        Frontend {
            id,
            routing,
            outbox,
        }
    }

    /// What it would publish now.
    fn message(&mut self) -> ReplicaMessage {
        let mut events = Vec::new();
        while let Ok(event) = self.outbox.try_recv() {
            events.push(event);
        }
        ReplicaMessage {
            frontend: self.id,
            events,
        }
    }

    /// The requests each worker has, in this frontend's view.
    fn requests(&self) -> Vec<u32> {
        let mut loads = self.routing.loads();
        loads.sort_by_key(|(k, _, _)| *k);
        loads.iter().map(|(_, load, _)| load.requests).collect()
    }

    fn route(&self, id: u64) -> WorkerKey {
        let tokens: Vec<u32> = (0..64).map(|t| t + id as u32 * 1000).collect();
        self.routing
            .route(
                RequestId(id),
                &switchyard_core::protocol::Prompt::tokens(tokens),
                RoutingOverrides::default(),
                &[],
            )
            .unwrap()
            .decision
            .worker
    }
}

#[test]
fn frontends_count_each_others_requests() {
    let mut a = Frontend::new(0xa, ReplicaSettings::default());
    let b = Frontend::new(0xb, ReplicaSettings::default());
    let first = a.route(1);
    let message = a.message();
    assert!(matches!(message.events[..], [ReplicaEvent::Routed { .. }]));
    b.routing.apply_replicas(message.clone());
    // Its own messages come back to it: no double counting.
    a.routing.apply_replicas(message);
    assert_eq!(a.requests().iter().sum::<u32>(), 1);
    assert_eq!(b.requests().iter().sum::<u32>(), 1);
    assert_eq!(b.routing.replica_requests(), 1);
    // b now sends a new request to the other worker rather than piling on.
    assert_ne!(b.route(100), first);
    let with_prefill = |f: &Frontend| {
        f.routing
            .loads()
            .iter()
            .find(|(k, _, _)| *k == first)
            .unwrap()
            .1
            .prefill_tokens
    };
    assert_eq!(with_prefill(&b), 64);
    a.routing.prefill_done(RequestId(1));
    b.routing.apply_replicas(a.message());
    assert_eq!(with_prefill(&b), 0);
    a.routing.finish(RequestId(1));
    b.routing.apply_replicas(a.message());
    assert_eq!(b.routing.replica_requests(), 0);
    assert_eq!(
        b.requests().iter().sum::<u32>(),
        1,
        "only b's own request is left"
    );
}

#[test]
fn lost_messages_are_repaired_and_silent_frontends_dropped() {
    let settings = ReplicaSettings {
        alive_interval: Duration::from_millis(10),
        peer_timeout: Duration::from_millis(50),
    };
    let mut a = Frontend::new(0xa, settings);
    let b = Frontend::new(0xb, settings);
    a.route(1);
    a.route(2);
    b.routing.apply_replicas(a.message());
    assert_eq!(b.routing.replica_requests(), 2);
    // Request 1 ends, and its message is lost; the next announcement repairs it.
    a.routing.finish(RequestId(1));
    let _lost = a.message();
    assert_eq!(a.routing.replica_tick(), 0);
    let alive = a.message();
    assert!(
        matches!(&alive.events[..], [ReplicaEvent::Alive { requests }] if requests == &vec![RequestId(2)])
    );
    b.routing.apply_replicas(alive);
    assert_eq!(b.routing.replica_requests(), 1);
    assert_eq!(b.requests().iter().sum::<u32>(), 1);
    // a goes silent: after the timeout b drops it and its requests.
    std::thread::sleep(Duration::from_millis(80));
    assert_eq!(b.routing.replica_tick(), 1);
    assert_eq!(b.routing.replica_requests(), 0);
    assert_eq!(b.requests().iter().sum::<u32>(), 0);
}

#[test]
fn traffic_reports_are_for_planners_and_make_no_peer() {
    let settings = ReplicaSettings {
        alive_interval: Duration::from_millis(10),
        peer_timeout: Duration::from_millis(50),
    };
    let mut a = Frontend::new(0xa, settings);
    let b = Frontend::new(0xb, settings);
    let traffic = |frontend: u64| ReplicaMessage {
        frontend,
        events: vec![ReplicaEvent::Traffic(TrafficCounters {
            requests: 5,
            queued: 1,
            ..TrafficCounters::default()
        })],
    };
    // A frontend with replica sync off sends only traffic: b does not take it for a peer
    // (it would later drop it as gone silent).
    b.routing.apply_replicas(traffic(0xc));
    std::thread::sleep(Duration::from_millis(80));
    assert_eq!(b.routing.replica_tick(), 0);
    // Beside routing events, a traffic report changes nothing of them.
    a.route(1);
    let mut message = a.message();
    message.events.push(traffic(0xa).events[0].clone());
    b.routing.apply_replicas(message);
    assert_eq!(b.routing.replica_requests(), 1);
    std::thread::sleep(Duration::from_millis(80));
    assert_eq!(b.routing.replica_tick(), 1, "a is a peer, and went silent");
}
