//! The routing service's bookkeeping: block sizes, departed workers, and admission wake-ups.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use switchyard_core::protocol::Prompt;
use switchyard_core::{
    HashSeed, KvEvent, KvEventData, Priority, RequestId, StorageTier, StoredBlock, TokenBlocks,
    WorkerId,
};
use switchyard_frontend::routing::RoutingService;
use switchyard_router::{AdmissionConfig, Rejection, RoutingConfig, RoutingOverrides};
use switchyard_runtime::{Instances, WorkerEvent, WorkerInstance};

fn worker(id: u64, block_size: u32, max_num_seqs: u32) -> WorkerInstance {
    WorkerInstance {
        block_size: Some(block_size),
        capacity_blocks: Some(100_000),
        max_num_seqs: Some(max_num_seqs),
        ..WorkerInstance::new(WorkerId(id), "m")
    }
}

fn prompt(tokens: &[u32]) -> Prompt {
    Prompt::tokens(tokens.to_vec())
}

fn set(workers: &[WorkerInstance]) -> Instances {
    Arc::new(
        workers
            .iter()
            .map(|w| (w.worker_id, w.clone()))
            .collect::<BTreeMap<_, _>>(),
    )
}

/// The worker's KV event storing the full blocks of `tokens`.
fn stored(worker: u64, event_id: u64, tokens: &[u32], block_size: u32) -> WorkerEvent {
    let blocks = TokenBlocks::new(tokens, block_size, HashSeed::default()).unwrap();
    let blocks = blocks
        .sequence_hashes()
        .iter()
        .zip(blocks.local_hashes())
        .map(|(&seq_hash, &local_hash)| StoredBlock {
            seq_hash,
            local_hash,
        })
        .collect();
    WorkerEvent::Kv(vec![KvEvent {
        worker_id: WorkerId(worker),
        dp_rank: 0,
        event_id,
        tier: StorageTier::Device,
        data: KvEventData::Stored {
            parent: None,
            blocks,
        },
    }])
}

fn service() -> Arc<RoutingService> {
    Arc::new(RoutingService::new(
        "m".into(),
        RoutingConfig {
            admission: AdmissionConfig {
                queue_timeout: Duration::from_secs(2),
                ..AdmissionConfig::default()
            },
            ..RoutingConfig::default()
        },
    ))
}

#[test]
fn the_router_counts_in_the_workers_block_size() {
    for block_size in [16, 64] {
        let routing = service();
        routing.sync_workers(&set(&[worker(1, block_size, 8), worker(2, block_size, 8)]));
        let tokens: Vec<u32> = (0..128).collect();
        routing.apply_event(stored(1, 1, &tokens, block_size));
        let routed = routing
            .route(
                RequestId(1),
                &prompt(&tokens),
                RoutingOverrides::default(),
                &[],
            )
            .unwrap();
        assert_eq!(routed.instance.worker_id, WorkerId(1));
        assert_eq!(routed.decision.overlap_blocks, 128 / block_size);
        assert_eq!(
            routed.decision.prefill_tokens, 0,
            "block size {block_size}: the whole prompt is cached"
        );
        // Excluding the worker (it just failed this request) sends it elsewhere.
        routing.finish(RequestId(1));
        let routed = routing
            .route(
                RequestId(2),
                &prompt(&tokens),
                RoutingOverrides::default(),
                &[WorkerId(1)],
            )
            .unwrap();
        assert_eq!(routed.instance.worker_id, WorkerId(2));
        assert_eq!(routed.decision.prefill_tokens, 128);
    }
}

#[test]
fn a_new_block_size_takes_over_once_the_old_workers_are_gone() {
    let routing = service();
    routing.sync_workers(&set(&[worker(1, 16, 8)]));
    // Another block size, while the old one serves: ignored.
    routing.sync_workers(&set(&[worker(1, 16, 8), worker(2, 32, 8)]));
    assert_eq!(routing.worker_count(), 1);
    // The old one leaves: the new one is taken, in the same sync.
    routing.sync_workers(&set(&[worker(2, 32, 8)]));
    assert_eq!(routing.worker_count(), 1);
    let tokens: Vec<u32> = (0..64).collect();
    routing.apply_event(stored(2, 1, &tokens, 32));
    let routed = routing
        .route(
            RequestId(1),
            &prompt(&tokens),
            RoutingOverrides::default(),
            &[],
        )
        .unwrap();
    assert_eq!(routed.instance.worker_id, WorkerId(2));
    assert_eq!(
        routed.decision.overlap_blocks, 2,
        "hashed in 32-token blocks"
    );
}

#[test]
fn events_of_workers_not_listed_are_dropped() {
    let routing = service();
    routing.sync_workers(&set(&[worker(1, 16, 8)]));
    let tokens: Vec<u32> = (0..64).collect();
    routing.apply_event(stored(1, 1, &tokens, 16));
    assert_eq!(routing.indexer().read(|i| i.block_count()), 4);
    // It leaves, then its last batch arrives on the other channel.
    routing.sync_workers(&set(&[]));
    assert_eq!(routing.indexer().read(|i| i.block_count()), 0);
    routing.apply_event(stored(1, 2, &(100..164).collect::<Vec<_>>(), 16));
    routing.apply_event(WorkerEvent::Load {
        worker: switchyard_core::WorkerKey::new(1, 0),
        load: Default::default(),
    });
    assert_eq!(routing.indexer().read(|i| i.block_count()), 0);
    assert!(routing.loads().is_empty());
}

#[tokio::test(flavor = "current_thread")]
async fn a_lower_tier_waiter_is_woken_when_the_higher_one_ahead_of_it_is_admitted() {
    // One worker running two requests, its maximum; a standard request queues, then a
    // premium one. Both running requests end: the premium request goes first and takes one
    // slot; the standard one must take the other without waiting for anything else.
    for premium_first in [false, true] {
        let routing = service();
        routing.sync_workers(&set(&[worker(1, 16, 2)]));
        let tokens: Vec<u32> = (0..32).collect();
        for id in [1, 2] {
            routing
                .route(
                    RequestId(id),
                    &prompt(&tokens),
                    RoutingOverrides::default(),
                    &[],
                )
                .unwrap();
        }
        assert!(routing.all_busy());
        let spawn = |id: u64, priority: Priority| {
            let routing = Arc::clone(&routing);
            tokio::spawn(async move {
                let started = tokio::time::Instant::now();
                let ticket = routing.admit(RequestId(id), priority).await;
                let admitted = ticket.is_ok();
                if admitted {
                    let tokens: Vec<u32> = (0..32).collect();
                    routing
                        .route(
                            RequestId(id),
                            &prompt(&tokens),
                            RoutingOverrides::default(),
                            &[],
                        )
                        .unwrap();
                }
                (admitted, started.elapsed())
            })
        };
        let (premium, standard) = if premium_first {
            let p = spawn(3, Priority::Premium);
            tokio::task::yield_now().await;
            (p, spawn(4, Priority::Standard))
        } else {
            let s = spawn(4, Priority::Standard);
            tokio::task::yield_now().await;
            (spawn(3, Priority::Premium), s)
        };
        for _ in 0..5 {
            tokio::task::yield_now().await;
        }
        assert_eq!(routing.queued(), [0, 1, 1]);
        // A best-effort request is shed at once.
        assert_eq!(
            routing
                .admit(RequestId(9), Priority::BestEffort)
                .await
                .err(),
            Some((Rejection::Shed, None))
        );
        routing.finish(RequestId(1));
        routing.finish(RequestId(2));
        assert!(premium.await.unwrap().0);
        let (admitted, waited) = standard.await.unwrap();
        assert!(
            admitted && waited < Duration::from_secs(1),
            "premium first: {premium_first}; standard admitted {admitted} after {waited:?}"
        );
        assert_eq!(routing.queued(), [0, 0, 0]);
    }
}

#[tokio::test(start_paused = true)]
async fn a_queued_request_times_out_and_one_whose_client_left_frees_its_place() {
    let routing = service();
    routing.sync_workers(&set(&[worker(1, 16, 1)]));
    let tokens: Vec<u32> = (0..32).collect();
    routing
        .route(
            RequestId(1),
            &prompt(&tokens),
            RoutingOverrides::default(),
            &[],
        )
        .unwrap();
    // The client of request 2 leaves while it waits: its place in the queue goes.
    let gone = {
        let routing = Arc::clone(&routing);
        tokio::spawn(async move {
            routing
                .admit(RequestId(2), Priority::Standard)
                .await
                .is_ok()
        })
    };
    tokio::task::yield_now().await;
    assert_eq!(routing.queued(), [0, 1, 0]);
    gone.abort();
    let _ = gone.await;
    assert_eq!(routing.queued(), [0, 0, 0]);
    // Request 3 waits the whole queue timeout (2 s here), then is refused.
    let started = tokio::time::Instant::now();
    let refused = routing.admit(RequestId(3), Priority::Premium).await.err();
    assert_eq!(refused, Some((Rejection::TimedOut, None)));
    assert_eq!(started.elapsed(), Duration::from_secs(2));
    assert_eq!(routing.queued(), [0, 0, 0]);
    // Capacity frees: nothing is left waiting, and the next request goes straight in.
    routing.finish(RequestId(1));
    assert!(
        routing
            .admit(RequestId(4), Priority::Standard)
            .await
            .is_ok()
    );
}

#[test]
fn concurrent_scrapes_each_see_every_worker() {
    let routing = service();
    routing.sync_workers(&set(&(1..=4)
        .map(|id| worker(id, 16, 8))
        .collect::<Vec<_>>()));
    let metrics = Arc::new(switchyard_frontend::metrics::Metrics::default());
    let scrapes: Vec<_> = (0..4)
        .map(|_| {
            let (metrics, routing) = (Arc::clone(&metrics), Arc::clone(&routing));
            std::thread::spawn(move || {
                (0..500)
                    .filter(|_| {
                        let text = metrics.render(&routing);
                        text.lines()
                            .filter(|l| l.starts_with("switchyard_worker_requests{"))
                            .count()
                            != 4
                    })
                    .count()
            })
        })
        .collect();
    let incomplete: usize = scrapes.into_iter().map(|t| t.join().unwrap()).sum();
    assert_eq!(incomplete, 0, "scrapes missing a worker's series");
}

#[test]
fn a_worker_restarted_under_its_id_starts_afresh() {
    let routing = service();
    routing.sync_workers(&set(&[worker(1, 16, 8)]));
    routing.apply_event(stored(1, 1, &(0..64).collect::<Vec<_>>(), 16));
    routing.apply_event(stored(1, 2, &(100..164).collect::<Vec<_>>(), 16));
    assert_eq!(routing.indexer().read(|i| i.block_count()), 8);
    // The same id, a new incarnation: what the old one cached is gone, and the new one's
    // event ids start again from 1.
    let restarted = WorkerInstance {
        incarnation: 7,
        ..worker(1, 16, 8)
    };
    routing.sync_workers(&set(&[restarted]));
    assert_eq!(routing.worker_count(), 1);
    assert_eq!(routing.indexer().read(|i| i.block_count()), 0);
    routing.apply_event(stored(1, 1, &(200..232).collect::<Vec<_>>(), 16));
    assert_eq!(routing.indexer().read(|i| i.block_count()), 2);
}

/// A prompt of `len` tokens with one image at `offset..offset + length`.
fn with_image(len: u32, offset: u32, length: u32) -> Prompt {
    Prompt {
        media: vec![switchyard_core::MediaSpan {
            modality: switchyard_core::Modality::Image,
            media_hash: 42,
            offset,
            length,
        }],
        ..prompt(&(1000..1000 + len).collect::<Vec<_>>())
    }
}

/// The worker's KV event storing every full block of `prompt` (its media folded in).
fn stored_prompt(worker: u64, prompt: &Prompt, block_size: u32) -> WorkerEvent {
    let blocks = switchyard_core::blocks_for(prompt, block_size).unwrap();
    let blocks = blocks
        .sequence_hashes()
        .iter()
        .zip(blocks.local_hashes())
        .map(|(&seq_hash, &local_hash)| StoredBlock {
            seq_hash,
            local_hash,
        })
        .collect();
    WorkerEvent::Kv(vec![KvEvent {
        worker_id: WorkerId(worker),
        dp_rank: 0,
        event_id: 1,
        tier: StorageTier::Device,
        data: KvEventData::Stored {
            parent: None,
            blocks,
        },
    }])
}

#[test]
fn a_cache_stands_in_for_encoding_only_for_media_in_blocks_it_reuses() {
    // Worker 1 holds every full block of the prompt, its image included. With encoding
    // predicted to take long, joint routing sends the request there unencoded: but only
    // when the image lies in blocks an engine reuses. The last one, holding the prompt's
    // last token, is computed whatever is cached (and a partial block is never cached), so
    // an image reaching into it needs its embeddings (the server once counted it held).
    let encode = Duration::from_secs(10);
    for (len, offset, length, held) in [
        // 104 tokens: six full blocks, the last token in the seventh, partial.
        (104, 80, 16, true),
        (104, 86, 10, true),
        (104, 90, 12, false),
        // 96 tokens, exactly six blocks: the sixth holds the last token.
        (96, 64, 16, true),
        (96, 80, 16, false),
    ] {
        let routing = service();
        routing.sync_workers(&set(&[worker(1, 16, 8), worker(2, 16, 8)]));
        let prompt = with_image(len, offset, length);
        routing.apply_event(stored_prompt(1, &prompt, 16));
        let holder = routing.sooner_holder(&prompt, encode);
        assert_eq!(
            holder,
            held.then_some(WorkerId(1)),
            "{len} tokens, image at {offset}..{}",
            offset + length
        );
    }
}
