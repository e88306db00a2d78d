//! The router end to end on hand-built cases: indexer overlaps plus active load.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use switchyard_core::{
    HashSeed, KvEvent, KvEventData, RequestId, StorageTier, StoredBlock, TokenBlocks, WorkerKey,
};
use switchyard_router::{
    Indexer, IndexerConfig, PolicyKind, RouteRequest, Router, RouterConfig, RoutingOverrides,
};

fn blocks(tokens: &[u32]) -> TokenBlocks {
    TokenBlocks::new(tokens, 4, HashSeed::default()).unwrap()
}

fn store(worker: WorkerKey, id: u64, b: &TokenBlocks) -> KvEvent {
    let stored = b
        .local_hashes()
        .iter()
        .zip(b.sequence_hashes())
        .map(|(&local_hash, &seq_hash)| StoredBlock {
            seq_hash,
            local_hash,
        })
        .collect();
    KvEvent {
        worker_id: worker.worker_id,
        dp_rank: worker.dp_rank,
        event_id: id,
        tier: StorageTier::Device,
        data: KvEventData::Stored {
            parent: None,
            blocks: stored,
        },
    }
}

#[test]
fn routes_to_the_cached_worker_and_tracks_load() {
    let (a, b) = (WorkerKey::new(1, 0), WorkerKey::new(2, 0));
    let mut router = Router::new(RouterConfig {
        block_size: 4,
        ..RouterConfig::default()
    });
    router.add_worker(a);
    router.add_worker(b);
    let mut indexer = Indexer::new(IndexerConfig::default());
    let prompt: Vec<u32> = (0..32).collect();
    let cached = blocks(&prompt[..24]);
    indexer.apply(&store(b, 1, &cached));

    let request_blocks = blocks(&prompt);
    let request = RouteRequest {
        id: RequestId(1),
        isl_tokens: prompt.len() as u64,
        seq_hashes: request_blocks.sequence_hashes(),
        overrides: RoutingOverrides::default(),
    };
    let overlaps = indexer.find_matches(request_blocks.local_hashes());
    assert_eq!(overlaps.score(b), 6);
    let decision = router.route(&request, &overlaps, Duration::ZERO).unwrap();
    assert_eq!(decision.worker, b);
    assert_eq!(decision.overlap_blocks, 6);
    assert_eq!(decision.prefill_tokens, 8);
    assert_eq!(router.load(b).active_blocks, 8);
    assert_eq!(router.load(b).prefill_tokens, 8);

    // Round-robin by override ignores the cache.
    let rr = RouteRequest {
        id: RequestId(2),
        overrides: RoutingOverrides {
            policy: Some(PolicyKind::RoundRobin),
            ..RoutingOverrides::default()
        },
        ..request
    };
    let first = router.route(&rr, &overlaps, Duration::ZERO).unwrap();
    assert_eq!(first.policy, PolicyKind::RoundRobin);
    assert_eq!(first.worker, a);

    // A second identical request shares the active prefix on b: no new active blocks.
    let again = RouteRequest {
        id: RequestId(3),
        ..request
    };
    let candidates = router.candidates(&again, &overlaps, Duration::ZERO);
    let on_b = candidates.iter().find(|c| c.worker == b).unwrap();
    assert_eq!(on_b.new_blocks, 0);
    assert_eq!(
        candidates
            .iter()
            .find(|c| c.worker == a)
            .unwrap()
            .new_blocks,
        0
    );

    assert!(router.mark_prefill_completed(RequestId(1), Duration::ZERO));
    assert_eq!(router.load(b).prefill_tokens, 0);
    assert_eq!(router.free(RequestId(1)), Some(b));
    assert_eq!(router.free(RequestId(2)), Some(a));
    assert_eq!(
        router.load(a).active_blocks + router.load(b).active_blocks,
        0
    );
    assert_eq!(router.free(RequestId(1)), None);
}

#[test]
fn no_workers_is_an_error_and_expiry_frees() {
    let mut router = Router::new(RouterConfig {
        request_ttl: Duration::from_secs(5),
        ..RouterConfig::default()
    });
    let request = RouteRequest {
        id: RequestId(1),
        isl_tokens: 10,
        seq_hashes: &[],
        overrides: RoutingOverrides::default(),
    };
    let overlaps = Default::default();
    assert!(router.route(&request, &overlaps, Duration::ZERO).is_err());
    let w = WorkerKey::new(9, 0);
    router.add_worker(w);
    router.route(&request, &overlaps, Duration::ZERO).unwrap();
    assert!(
        router.route(&request, &overlaps, Duration::ZERO).is_err(),
        "duplicate id"
    );
    assert!(router.expire(Duration::from_secs(4)).is_empty());
    assert_eq!(router.expire(Duration::from_secs(5)), vec![RequestId(1)]);
    assert_eq!(router.load(w).requests, 0);
}
