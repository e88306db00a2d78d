//! What the NATS replica plane decodes from every message on a model's replicas subject: a
//! `ReplicaMessage` (crates/runtime/src/net/nats.rs, `NatsEventPlane::forward`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use switchyard_core::event::from_msgpack;
use switchyard_fuzz::{msgpack_round_trip, samples, seed};
use switchyard_runtime::ReplicaMessage;

fuzz_target!(
    init: seed(samples::msgpack(&samples::replica_messages())),
    |data: &[u8]| {
        let Ok(message) = from_msgpack::<ReplicaMessage>(data) else {
            return;
        };
        msgpack_round_trip(&message);
    }
);
