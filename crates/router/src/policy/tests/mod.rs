//! The policies' tests: shared helpers here, one file per policy family.

use super::*;
use rand::SeedableRng;
use rand::rngs::SmallRng;

fn worker(i: u64) -> WorkerKey {
    WorkerKey::new(i, 0)
}

fn cand(i: u64) -> Candidate {
    Candidate {
        worker: worker(i),
        overlap_blocks: 0,
        cached_blocks: 0,
        active_blocks: 0,
        new_blocks: 0,
        prefill_tokens: 0,
        prefill_elapsed_ms: 0.0,
        active_requests: 0,
        timing: 0,
    }
}

fn select(
    policy: &mut dyn Policy,
    isl: u64,
    candidates: &[Candidate],
    overrides: RoutingOverrides,
    seed: u64,
) -> usize {
    let mut rng = SmallRng::seed_from_u64(seed);
    let s = Selection {
        isl_tokens: isl,
        block_size: 16,
        candidates,
        overrides: &overrides,
        timings: &[],
    };
    policy.select(&s, &mut rng).expect("a candidate")
}

mod baselines;
mod kv;
mod latency;
