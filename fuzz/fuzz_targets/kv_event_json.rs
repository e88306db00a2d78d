//! A KV event as JSON (`switchyard_core::event::from_json`, crates/core/src/event.rs).
#![no_main]

use libfuzzer_sys::fuzz_target;
use switchyard_core::KvEvent;
use switchyard_core::event::{from_json, to_json};
use switchyard_fuzz::{json_round_trip, samples, seed};

fuzz_target!(
    init: seed(
        samples::kv_events()
            .iter()
            .map(|e| to_json(e).expect("encodes").into_bytes())
    ),
    |data: &[u8]| {
        let Ok(text) = std::str::from_utf8(data) else {
            return;
        };
        let Ok(event) = from_json::<KvEvent>(text) else {
            return;
        };
        json_round_trip(&event);
        let again = to_json(&event).expect("encodes");
        assert_eq!(from_json::<KvEvent>(&again).expect("decodes"), event);
    }
);
