//! The shared (left-right) indexer gives the same answers as a plain one, across threads.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use switchyard_core::hash::sequence_hashes;
use switchyard_core::{
    KvEvent, KvEventData, LocalBlockHash, StorageTier, StoredBlock, WorkerId, WorkerKey,
};
use switchyard_router::indexer::shared::SharedIndexer;
use switchyard_router::{EventGap, Indexer, IndexerConfig};

fn path(seed: u64, len: usize) -> Vec<LocalBlockHash> {
    // Paths share their first blocks when seeds share a residue.
    (0..len as u64)
        .map(|i| {
            LocalBlockHash(if i < 4 {
                seed % 3 * 100 + i
            } else {
                seed * 1000 + i
            })
        })
        .collect()
}

fn stored(worker: u64, id: u64, locals: &[LocalBlockHash]) -> KvEvent {
    let blocks = locals
        .iter()
        .zip(sequence_hashes(locals))
        .map(|(&local_hash, seq_hash)| StoredBlock {
            seq_hash,
            local_hash,
        })
        .collect();
    KvEvent {
        worker_id: WorkerId(worker),
        dp_rank: 0,
        event_id: id,
        tier: StorageTier::Device,
        data: KvEventData::Stored {
            parent: None,
            blocks,
        },
    }
}

fn removed(worker: u64, id: u64, locals: &[LocalBlockHash]) -> KvEvent {
    let seq_hashes = sequence_hashes(locals).into_iter().rev().collect();
    KvEvent {
        worker_id: WorkerId(worker),
        dp_rank: 0,
        event_id: id,
        tier: StorageTier::Device,
        data: KvEventData::Removed { seq_hashes },
    }
}

fn stream() -> Vec<KvEvent> {
    let mut events = Vec::new();
    let mut ids = [0u64; 4];
    for s in 0..400u64 {
        let w = s % 4;
        ids[w as usize] += 1;
        events.push(stored(w, ids[w as usize], &path(s, 8 + (s % 5) as usize)));
        if s % 3 == 0 && s >= 8 {
            ids[w as usize] += 1;
            events.push(removed(
                w,
                ids[w as usize],
                &path(s - 8, 8 + ((s - 8) % 5) as usize),
            ));
        }
    }
    events
}

#[test]
fn shared_matches_plain_and_reads_concurrently() {
    let events = stream();
    let mut plain = Indexer::new(IndexerConfig::default());
    for e in &events {
        plain.apply(e);
    }
    // A small publish bound forces many publishes while a reader thread queries.
    let shared = Arc::new(SharedIndexer::with_publish_bound(
        Indexer::new(IndexerConfig::default()),
        16,
    ));
    let reader = {
        let shared = Arc::clone(&shared);
        std::thread::spawn(move || {
            // Every answer is internally consistent: a worker never matches more blocks
            // than it caches or than the query has.
            for i in 0..20_000u64 {
                let scores = shared.find_matches(&path(i % 400, 12));
                for &(worker, score) in &scores.scores {
                    assert!(score <= 12);
                    assert!(
                        u64::from(score) <= scores.cached(worker),
                        "{worker}: {score}"
                    );
                }
            }
        })
    };
    for chunk in events.chunks(7) {
        assert!(shared.apply_all(chunk.iter().cloned()).is_empty());
    }
    reader.join().unwrap();
    for s in 0..400 {
        let q = path(s, 12);
        assert_eq!(shared.find_matches(&q), plain.find_matches(&q));
    }
    shared.read(|i| i.validate()).unwrap();
    assert_eq!(shared.read(|i| i.stats().clone()), plain.stats().clone());
}

#[test]
fn shared_reports_gaps_and_supports_removal_and_restore() {
    let shared = SharedIndexer::new(Indexer::new(IndexerConfig::default()));
    let p = path(1, 6);
    assert_eq!(shared.apply(stored(1, 1, &p)), None);
    assert_eq!(
        shared.apply(stored(1, 5, &path(2, 6))),
        Some(EventGap {
            worker: WorkerKey::new(1, 0),
            expected: 2,
            received: 5
        })
    );
    let snapshot = shared
        .read(|i| i.dump_worker(WorkerKey::new(1, 0)))
        .unwrap();
    shared.remove_worker(WorkerKey::new(1, 0));
    assert_eq!(shared.find_matches(&p).best(), 0);
    shared.restore(snapshot);
    assert_eq!(shared.find_matches(&p).best(), 6);
    // The restored stream continues from the snapshot's last id.
    assert_eq!(shared.apply(stored(1, 6, &path(3, 6))), None);
    assert_eq!(
        shared.read(|i| i.last_event_id(WorkerKey::new(1, 0))),
        Some(6)
    );
}
