//! What the NATS event plane decodes from every message on a model's events subject: a
//! `WorkerEvent` (crates/runtime/src/net/nats.rs, `NatsEventPlane::forward`, which calls
//! `rmp_serde::from_slice::<WorkerEvent>`; the same as `switchyard_core::event::from_msgpack`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use switchyard_core::event::from_msgpack;
use switchyard_fuzz::{msgpack_round_trip, samples, seed};
use switchyard_router::{Indexer, IndexerConfig};
use switchyard_runtime::WorkerEvent;

fuzz_target!(
    init: seed(samples::msgpack(&samples::worker_events())),
    |data: &[u8]| {
        let Ok(event) = from_msgpack::<WorkerEvent>(data) else {
            return;
        };
        msgpack_round_trip(&event);
        // What the frontend does with it: KV events go to the indexer.
        if let WorkerEvent::Kv(events) = &event {
            let mut indexer = Indexer::new(IndexerConfig::default());
            switchyard_fuzz::apply_and_check(&mut indexer, events);
        }
    }
);
