//! A worker's discovery record, the JSON value under the etcd prefix
//! (crates/runtime/src/net/etcd/mod.rs, `decode`, which calls
//! `serde_json::from_slice::<WorkerInstance>`), read by every frontend.
//!
//! Besides the round trip, a record that decodes must be usable: the frontend hands its
//! `perf` model to the router (`spec_of`, crates/frontend/src/routing/sync.rs), which
//! interpolates on it: a profile must be one `PerfModel::from_profile` accepts, and the
//! predictions must be finite (the router makes `Duration`s of them).
#![no_main]

use libfuzzer_sys::fuzz_target;
use switchyard_core::WorkerId;
use switchyard_core::perf::{PerfModel, Profile};
use switchyard_fuzz::{json_round_trip, seed};
use switchyard_router::WorkerTiming;
use switchyard_runtime::WorkerInstance;

fn samples() -> Vec<Vec<u8>> {
    let plain = WorkerInstance::new(WorkerId(3), "llama");
    let mut full = plain.clone();
    full.block_size = Some(16);
    full.capacity_blocks = Some(1000);
    full.max_num_seqs = Some(64);
    full.address = Some("10.0.0.1:8001".into());
    full.incarnation = 77;
    full.max_batched_tokens = Some(8192);
    full.perf = PerfModel::from_profile(Profile {
        prefill_isl: vec![100.0, 1000.0],
        prefill_ttft_ms: vec![10.0, 40.0],
        decode_active_kv_tokens: vec![0.0, 10_000.0],
        decode_context_length: vec![100.0, 1100.0],
        decode_itl: vec![vec![5.0, 7.0], vec![15.0, 25.0]],
        mixed_step_saving: 0.5,
        prefill_context_ms: 1e-3,
    })
    .ok();
    let mut poly = plain.clone();
    poly.perf = Some(PerfModel::Polynomial);
    [plain, full, poly]
        .iter()
        .map(|i| serde_json::to_vec(i).expect("encodes"))
        .collect()
}

fuzz_target!(
    init: seed(samples()),
    |data: &[u8]| {
        let Ok(instance) = serde_json::from_slice::<WorkerInstance>(data) else {
            return;
        };
        json_round_trip(&instance);
        // Opt out while the missing validation (README.md, findings) is open, to fuzz the
        // rest of the decoder.
        if std::env::var_os("SWITCHYARD_FUZZ_SKIP_PERF").is_some() {
            return;
        }
        if let Some(perf) = instance.perf {
            // What the router will compute with: a profile must be one `from_profile` accepts
            // (at least two strictly increasing finite points per axis, matching lengths).
            if let PerfModel::Interpolated(profile) = &perf {
                if let Err(e) = PerfModel::from_profile(profile.clone()) {
                    panic!("a discovery record with an unusable profile decodes ({e}): {profile:?}");
                }
            }
            let timing = WorkerTiming {
                perf,
                max_batched_tokens: instance.max_batched_tokens.unwrap_or(8192),
                capacity_blocks: instance.capacity_blocks.unwrap_or(16_384),
            };
            // The router turns predictions into `Duration`s (`Router::queued_prefill_time`),
            // which panics on an infinite or NaN number of seconds.
            for tokens in [1u64, 100, 5000, 100_000] {
                let (prefill, _) = timing.prefill_steps_ms(tokens);
                let step = timing.decode_step_ms(4, tokens, tokens / 16);
                assert!(
                    prefill.is_finite() && step.is_finite(),
                    "predictions for {tokens} tokens: prefill {prefill} ms, step {step} ms"
                );
            }
        }
    }
);
