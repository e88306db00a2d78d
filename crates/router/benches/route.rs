//! The cost of one routing decision, so a policy change shows what it costs per request.
//!
//! - `select/<policy>/<n>`: [`Router::select`] among `n` candidates (no recording), for
//!   each policy.
//! - `pair/<n>`: [`RoutingCore::route_pair`] in a fleet of `n` workers, half prefill and half
//!   decode, each already running a few requests; the decision is recorded and then
//!   finished, so every iteration sees the same fleet.
//!
//! Run: `cargo bench -p switchyard-router --bench route` (results in `docs/benchmarks.md`).

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use switchyard_core::{HashSeed, RequestId, TokenBlocks, WorkerId, WorkerKey, WorkerRole};
use switchyard_router::{
    Candidate, DisaggConfig, OverlapScores, PolicyKind, RouteQuery, RouteRequest, Router,
    RouterConfig, RoutingConfig, RoutingCore, RoutingOverrides, WorkerSpec,
};

const SIZES: [usize; 4] = [8, 64, 256, 1024];
const BLOCK: u32 = 16;

/// Candidates that differ the way a busy fleet's do: some hold part of the prompt, loads
/// spread over a range.
fn candidates(n: usize) -> Vec<Candidate> {
    (0..n)
        .map(|i| {
            let i64 = i as u64;
            Candidate {
                worker: WorkerKey::from(WorkerId(i64)),
                overlap_blocks: (i % 7) as u32 * 4,
                cached_blocks: 1_000 + 37 * i64 % 5_000,
                active_blocks: 200 + 53 * i64 % 3_000,
                new_blocks: 64 - (i % 7) as u64 * 4,
                prefill_tokens: 97 * i64 % 8_192,
                prefill_elapsed_ms: (i % 5) as f64 * 3.0,
                active_requests: (i % 40) as u32,
                timing: 0,
            }
        })
        .collect()
}

fn select(c: &mut Criterion) {
    let tokens: Vec<u32> = (0..1024).collect();
    let prompt = TokenBlocks::new(&tokens, BLOCK, HashSeed::default()).expect("prompt");
    let mut group = c.benchmark_group("select");
    for &kind in PolicyKind::ALL {
        for n in SIZES {
            let mut router = Router::new(RouterConfig {
                policy: kind,
                block_size: BLOCK,
                ..RouterConfig::default()
            });
            let candidates = candidates(n);
            for c in &candidates {
                router.add_worker(c.worker);
            }
            let request = RouteRequest {
                id: RequestId(1),
                isl_tokens: tokens.len() as u64,
                seq_hashes: prompt.sequence_hashes(),
                overrides: RoutingOverrides::default(),
            };
            group.bench_with_input(BenchmarkId::new(kind.name(), n), &n, |b, _| {
                b.iter(|| router.select(black_box(&request), black_box(&candidates)))
            });
        }
    }
    group.finish();
}

/// A fleet of `n` workers, half prefill and half decode, each running a few requests.
fn fleet(n: usize) -> RoutingCore {
    let mut core = RoutingCore::new(RoutingConfig {
        router: RouterConfig {
            policy: PolicyKind::Kv,
            block_size: BLOCK,
            ..RouterConfig::default()
        },
        disagg: DisaggConfig {
            local_prefill_tokens: 64,
            max_prefill_queue_tokens: u64::MAX,
        },
        ..RoutingConfig::default()
    });
    for i in 0..n as u64 {
        let role = if i % 2 == 0 {
            WorkerRole::Prefill
        } else {
            WorkerRole::Decode
        };
        core.add_worker(WorkerSpec {
            role,
            capacity_blocks: Some(16_384),
            max_num_seqs: Some(256),
            ..WorkerSpec::new(WorkerId(i), BLOCK)
        })
        .expect("a new worker joins");
    }
    let none = OverlapScores::default();
    for r in 0..4 * n as u64 {
        let tokens: Vec<u32> = (0..512).map(|t| (r * 1_000 + t) as u32).collect();
        let prompt = TokenBlocks::new(&tokens, BLOCK, HashSeed::default()).expect("prompt");
        let query = RouteQuery {
            id: RequestId(1_000_000 + r),
            blocks: &prompt,
            overrides: RoutingOverrides::default(),
            exclude: &[],
        };
        core.route_pair(&query, &none, Duration::ZERO)
            .expect("the fleet routes");
    }
    core
}

fn pair(c: &mut Criterion) {
    let tokens: Vec<u32> = (0..2048).collect();
    let prompt = TokenBlocks::new(&tokens, BLOCK, HashSeed::default()).expect("prompt");
    let none = OverlapScores::default();
    let mut group = c.benchmark_group("pair");
    for n in SIZES {
        let mut core = fleet(n);
        let now = Duration::from_millis(1);
        group.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
            b.iter(|| {
                let query = RouteQuery {
                    id: RequestId(7),
                    blocks: &prompt,
                    overrides: RoutingOverrides::default(),
                    exclude: &[],
                };
                let decision = core.route_pair(black_box(&query), &none, now);
                core.prefill_finished(RequestId(7));
                core.finish(RequestId(7));
                decision
            })
        });
    }
    group.finish();
}

criterion_group!(benches, select, pair);
criterion_main!(benches);
