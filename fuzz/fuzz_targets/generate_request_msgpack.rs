//! The worker's side of the request plane: the body of `POST /v1/internal/generate`, a
//! MessagePack `GenerateRequest` with field names (crates/runtime/src/net/http.rs, `generate`,
//! which calls `rmp_serde::from_slice::<GenerateRequest>`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use switchyard_core::event::from_msgpack;
use switchyard_core::protocol::GenerateRequest;
use switchyard_fuzz::{named_round_trip, samples, seed};

fuzz_target!(
    init: seed(
        samples::generate_requests()
            .iter()
            .map(|r| rmp_serde::to_vec_named(r).expect("encodes"))
    ),
    |data: &[u8]| {
        let Ok(request) = from_msgpack::<GenerateRequest>(data) else {
            return;
        };
        // The frontend sends field names (optional fields may be left out), so that is the
        // encoding that must read back.
        named_round_trip(&request);
        let _ = (request.generated(), request.stream_key(), request.prompt.len());
        for span in &request.prompt.media {
            let _ = span.end();
        }
    }
);
