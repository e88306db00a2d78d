//! The shared indexer gives the same answers as a plain one, read from other threads while
//! events are applied.

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

/// Every worker of the stream, renumbered so that slots run past the 320 kept inline in a
/// node (`spread` workers in all).
fn spread(events: &[KvEvent], spread: u64) -> Vec<KvEvent> {
    let mut out = Vec::new();
    for copy in 0..spread / 4 {
        for e in events {
            let mut e = e.clone();
            e.worker_id = WorkerId(e.worker_id.0 + 4 * copy);
            out.push(e);
        }
    }
    out
}

#[test]
fn lookups_on_other_threads_match_the_writer_and_never_fail_meanwhile() {
    // 400 workers: bits in extension blocks too. Removals recycle nodes under the readers.
    let events = spread(&stream(), 400);
    let mut plain = Indexer::new(IndexerConfig::default());
    for e in &events {
        plain.apply(e);
    }
    let shared = Arc::new(SharedIndexer::new(Indexer::new(IndexerConfig::default())));
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|r| {
            let (shared, done) = (Arc::clone(&shared), Arc::clone(&done));
            std::thread::spawn(move || {
                // Answers taken mid-event may be a block early or late, but are always
                // well formed: sorted by worker, every scored worker known, no score
                // longer than the query.
                let mut lookups = 0u64;
                let mut i = r;
                while !done.load(std::sync::atomic::Ordering::Relaxed) || lookups < 1000 {
                    let seed = i % 400;
                    let q = path(seed, 12);
                    // By keys and by sequence hashes (jumping along runs), alternately.
                    let scores = if lookups.is_multiple_of(2) {
                        shared.find_matches(&q)
                    } else {
                        shared.find_matches_hashed(&q, &sequence_hashes(&q))
                    };
                    assert!(scores.scores.windows(2).all(|w| w[0].0 < w[1].0));
                    assert!(scores.cached_blocks.windows(2).all(|w| w[0].0 < w[1].0));
                    for &(worker, score) in &scores.scores {
                        // Path `seed` is stored 8 + seed % 5 blocks long, and no other
                        // path continues it.
                        assert!(
                            (1..=8 + seed % 5).contains(&u64::from(score)),
                            "{worker}: {score}"
                        );
                        assert!(
                            scores
                                .cached_blocks
                                .binary_search_by_key(&worker, |e| e.0)
                                .is_ok()
                        );
                    }
                    lookups += 1;
                    i += 7;
                }
                lookups
            })
        })
        .collect();
    for chunk in events.chunks(7) {
        assert!(shared.apply_all(chunk.iter().cloned()).is_empty());
    }
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    for reader in readers {
        assert!(reader.join().unwrap() >= 1000);
    }
    let mut best = 0;
    for s in 0..400 {
        let q = path(s, 12);
        let answer = shared.find_matches(&q);
        assert_eq!(answer, plain.find_matches(&q));
        let seqs = sequence_hashes(&q);
        assert_eq!(shared.find_matches_hashed(&q, &seqs), answer);
        assert_eq!(plain.find_matches_hashed(&q, &seqs), answer);
        best = best.max(answer.scores.len());
    }
    assert!(
        best > 320,
        "some query is held by workers past the inline slots"
    );
    shared.read(|i| i.validate()).unwrap();
    assert_eq!(shared.read(|i| i.stats().clone()), plain.stats().clone());
}

#[test]
fn an_index_shared_after_it_was_filled_answers_like_the_plain_one() {
    // 400 workers, so the copy shared carries extension blocks too.
    let events = spread(&stream(), 400);
    let mut plain = Indexer::new(IndexerConfig::default());
    for e in &events[..events.len() / 2] {
        plain.apply(e);
    }
    let shared = SharedIndexer::new(plain.clone());
    // Branches made before and after sharing are both visible to other threads.
    assert!(
        shared
            .apply_all(events[events.len() / 2..].iter().cloned())
            .is_empty()
    );
    for e in &events[events.len() / 2..] {
        plain.apply(e);
    }
    for s in 0..400 {
        let q = path(s, 12);
        assert_eq!(shared.find_matches(&q), plain.find_matches(&q));
        assert_eq!(
            shared.find_matches_hashed(&q, &sequence_hashes(&q)),
            plain.find_matches(&q)
        );
    }
    shared.read(|i| i.validate()).unwrap();
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

#[test]
fn a_racing_lookup_never_credits_a_worker_with_blocks_it_does_not_hold() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
    // Worker 1 holds the first 40 blocks of a 200-block path throughout; worker 2 stores a
    // prefix of the path of varying length and removes it again, tail first, over and over:
    // the run marks along the path flip as worker 2 comes and goes, and freed nodes are
    // reused for the next copy. Lookups on other threads, by keys and by sequence hashes,
    // must never credit worker 1 with other than its 40 blocks, nor worker 2 with more
    // than it held while the lookup ran: the writer publishes, with a count of its events,
    // a bound on what worker 2 holds (raised before a store, lowered after a removal), and
    // a lookup that spans at most one event is checked against the larger of the bounds
    // seen before and after it.
    let p = path(7, 200);
    let shared = Arc::new(SharedIndexer::new(Indexer::new(IndexerConfig::default())));
    assert!(shared.apply(stored(1, 1, &p[..40])).is_none());
    let bound = Arc::new(AtomicU64::new(0)); // events << 32 | blocks
    let done = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..2u64)
        .map(|r| {
            let (shared, done, bound, p) = (
                Arc::clone(&shared),
                Arc::clone(&done),
                Arc::clone(&bound),
                p.clone(),
            );
            std::thread::spawn(move || {
                let seqs = sequence_hashes(&p);
                let (mut lookups, mut checked) = (0u64, 0u64);
                while !done.load(SeqCst) || lookups < 2000 {
                    let before = bound.load(SeqCst);
                    let scores = if (lookups + r).is_multiple_of(2) {
                        shared.find_matches(&p)
                    } else {
                        shared.find_matches_hashed(&p, &seqs)
                    };
                    let after = bound.load(SeqCst);
                    assert_eq!(scores.score(WorkerKey::new(1, 0)), 40, "{scores:?}");
                    let second = u64::from(scores.score(WorkerKey::new(2, 0)));
                    if (after >> 32) - (before >> 32) <= 1 {
                        let most = (before & 0xffff_ffff).max(after & 0xffff_ffff);
                        assert!(
                            second <= most,
                            "worker 2 credited {second}, held at most {most}"
                        );
                        checked += 1;
                    }
                    lookups += 1;
                }
                checked
            })
        })
        .collect();
    let (mut id, mut events) = (0, 0u64);
    let mut publish = |blocks: u64| {
        events += 1;
        bound.store(events << 32 | blocks, SeqCst);
    };
    for round in 0..2000usize {
        let len = if round % 3 == 0 {
            200
        } else {
            41 + round % 150
        };
        publish(len as u64);
        id += 1;
        assert!(shared.apply(stored(2, id, &p[..len])).is_none());
        id += 1;
        assert!(shared.apply(removed(2, id, &p[..len])).is_none());
        publish(0);
    }
    done.store(true, SeqCst);
    for reader in readers {
        assert!(reader.join().unwrap() > 100, "too few lookups checked");
    }
    shared.read(|i| i.validate()).unwrap();
}
