//! A KV event as MessagePack (`switchyard_core::event::from_msgpack`, crates/core/src/event.rs),
//! compact or with field names.
#![no_main]

use libfuzzer_sys::fuzz_target;
use switchyard_core::KvEvent;
use switchyard_core::event::{from_msgpack, to_msgpack};
use switchyard_fuzz::{msgpack_round_trip, samples, seed, same};

fuzz_target!(
    init: seed(samples::msgpack(&samples::kv_events())),
    |data: &[u8]| {
        let Ok(event) = from_msgpack::<KvEvent>(data) else {
            return;
        };
        msgpack_round_trip(&event);
        // The crate's own pair agrees with the generic check.
        let bytes = to_msgpack(&event).expect("encodes");
        let back: KvEvent = from_msgpack(&bytes).expect("decodes");
        assert!(same(&back, &event));
        // block_count never disagrees with the data.
        let _ = event.block_count();
    }
);
