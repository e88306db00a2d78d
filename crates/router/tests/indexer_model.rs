//! The indexer against a naive model, on random event streams over several workers.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, HashMap, HashSet};

use proptest::prelude::*;
use switchyard_core::hash::{sequence_hash, sequence_hashes};
use switchyard_core::{
    KvEvent, KvEventData, LocalBlockHash, SequenceHash, StorageTier, StoredBlock, WorkerId,
    WorkerKey,
};
use switchyard_router::{ApplyOutcome, EventGap, Indexer, IndexerConfig, OverlapScores};

/// The obvious model: per worker, each live sequence hash maps to the full path of local
/// hashes of its block. A worker holds a path if any live hash maps to it.
#[derive(Default)]
struct Naive {
    workers: BTreeMap<WorkerKey, NaiveWorker>,
}

#[derive(Default, Clone)]
struct NaiveWorker {
    blocks: HashMap<SequenceHash, Vec<LocalBlockHash>>,
    last: Option<u64>,
}

impl Naive {
    fn apply(&mut self, event: &KvEvent) -> ApplyOutcome {
        let key = event.worker();
        let worker = self.workers.entry(key).or_default();
        let mut outcome = ApplyOutcome::Applied;
        if let Some(last) = worker.last {
            if event.event_id <= last {
                return ApplyOutcome::Stale {
                    last_event_id: last,
                };
            }
            if event.event_id > last + 1 {
                outcome = ApplyOutcome::AppliedAfterGap(EventGap {
                    worker: key,
                    expected: last + 1,
                    received: event.event_id,
                });
            }
        }
        worker.last = Some(event.event_id);
        if event.tier != StorageTier::Device {
            return ApplyOutcome::OtherTier;
        }
        apply_data(worker, &event.data);
        outcome
    }

    fn find_matches(&self, query: &[LocalBlockHash]) -> OverlapScores {
        let mut scores = Vec::new();
        let mut cached_blocks = Vec::new();
        for (&key, worker) in &self.workers {
            let held: HashSet<&Vec<LocalBlockHash>> = worker.blocks.values().collect();
            let depth = (0..query.len())
                .take_while(|&k| held.contains(&query[..=k].to_vec()))
                .count();
            if depth > 0 {
                scores.push((key, depth as u32));
            }
            cached_blocks.push((key, held.len() as u64));
        }
        OverlapScores {
            scores,
            cached_blocks,
        }
    }

    fn held_paths(&self) -> Vec<Vec<LocalBlockHash>> {
        let mut paths: Vec<_> = self
            .workers
            .values()
            .flat_map(|w| w.blocks.values().cloned())
            .collect();
        paths.sort();
        paths.dedup();
        paths
    }
}

fn apply_data(worker: &mut NaiveWorker, data: &KvEventData) {
    match data {
        KvEventData::Stored { parent, blocks } => {
            let mut path = match parent {
                None => Vec::new(),
                Some(p) => match worker.blocks.get(p) {
                    Some(path) => path.clone(),
                    None => return,
                },
            };
            for block in blocks {
                path.push(block.local_hash);
                worker.blocks.insert(block.seq_hash, path.clone());
            }
        }
        KvEventData::Removed { seq_hashes } => {
            for h in seq_hashes {
                worker.blocks.remove(h);
            }
        }
        KvEventData::Cleared => worker.blocks.clear(),
    }
}

/// An abstract operation, resolved against the model's state when it runs.
#[derive(Debug, Clone)]
enum Op {
    Store {
        worker: u8,
        parent: Option<u16>,
        locals: Vec<u8>,
        odd_hash: Option<(u8, u8)>,
        id: IdMode,
        tier: u8,
    },
    Remove {
        worker: u8,
        picks: Vec<u16>,
        id: IdMode,
    },
    Clear {
        worker: u8,
        id: IdMode,
    },
    RemoveWorker {
        worker: u8,
    },
}

#[derive(Debug, Clone, Copy)]
enum IdMode {
    Next,
    Skip(u8),
    Repeat,
}

fn id_mode() -> impl Strategy<Value = IdMode> {
    prop_oneof![8 => Just(IdMode::Next), 1 => (1u8..4).prop_map(IdMode::Skip), 1 => Just(IdMode::Repeat)]
}

fn op() -> impl Strategy<Value = Op> {
    let store = (
        0u8..4,
        prop::option::weighted(0.7, any::<u16>()),
        prop::collection::vec(0u8..5, 1..6),
        prop::option::weighted(0.1, (0u8..6, 0u8..8)),
        id_mode(),
        prop_oneof![9 => Just(0u8), 1 => Just(1u8)],
    )
        .prop_map(|(worker, parent, locals, odd_hash, id, tier)| Op::Store {
            worker,
            parent,
            locals,
            odd_hash,
            id,
            tier,
        });
    prop_oneof![
        6 => store,
        3 => (0u8..4, prop::collection::vec(any::<u16>(), 1..4), id_mode()).prop_map(|(worker, picks, id)| Op::Remove { worker, picks, id }),
        1 => (0u8..4, id_mode()).prop_map(|(worker, id)| Op::Clear { worker, id }),
        1 => (0u8..4).prop_map(|worker| Op::RemoveWorker { worker }),
    ]
}

struct Driver {
    naive: Naive,
    indexer: Indexer,
    next_id: HashMap<WorkerKey, u64>,
}

fn key(worker: u8) -> WorkerKey {
    // Two dp ranks of the same worker id are distinct streams.
    WorkerKey::new(u64::from(worker / 2) + 100, u32::from(worker % 2))
}

impl Driver {
    fn event_id(&mut self, worker: WorkerKey, mode: IdMode) -> u64 {
        let next = self.next_id.entry(worker).or_insert(1);
        match mode {
            IdMode::Next => {
                *next += 1;
                *next - 1
            }
            IdMode::Skip(n) => {
                *next += u64::from(n) + 1;
                *next - 1
            }
            IdMode::Repeat => next.saturating_sub(1),
        }
    }

    /// Known hashes of a worker, sorted, to resolve picks deterministically.
    fn known(&self, worker: WorkerKey) -> Vec<SequenceHash> {
        let mut known: Vec<_> = self
            .naive
            .workers
            .get(&worker)
            .map(|w| w.blocks.keys().copied().collect())
            .unwrap_or_default();
        known.sort();
        known
    }

    /// Turns an op into an event, or performs a worker removal on the model and returns the
    /// worker for the caller to remove from the indexes under test.
    fn resolve(&mut self, op: &Op) -> Result<KvEvent, WorkerKey> {
        let (worker, id, data, tier) = match op {
            Op::Store {
                worker,
                parent,
                locals,
                odd_hash,
                id,
                tier,
            } => {
                let w = key(*worker);
                let known = self.known(w);
                let parent = parent.map(|p| {
                    // Mostly a known parent; one pick in eight names an unknown one.
                    if known.is_empty() || p % 8 == 0 {
                        SequenceHash(u64::from(p) | 1 << 40)
                    } else {
                        known[p as usize % known.len()]
                    }
                });
                let mut prev = parent;
                let mut blocks = Vec::new();
                for (i, &l) in locals.iter().enumerate() {
                    let local_hash = LocalBlockHash(u64::from(l));
                    let mut seq_hash = sequence_hash(prev, local_hash);
                    if let Some((at, small)) = odd_hash
                        && usize::from(*at) == i
                    {
                        // An engine-chosen hash that may collide with others: remaps.
                        seq_hash = SequenceHash(u64::from(*small));
                    }
                    blocks.push(StoredBlock {
                        seq_hash,
                        local_hash,
                    });
                    prev = Some(seq_hash);
                }
                let tier = if *tier == 0 {
                    StorageTier::Device
                } else {
                    StorageTier::Host
                };
                (w, *id, KvEventData::Stored { parent, blocks }, tier)
            }
            Op::Remove { worker, picks, id } => {
                let w = key(*worker);
                let known = self.known(w);
                let seq_hashes = picks
                    .iter()
                    .map(|&p| {
                        if known.is_empty() || p % 5 == 0 {
                            SequenceHash(u64::from(p) | 1 << 41)
                        } else {
                            known[p as usize % known.len()]
                        }
                    })
                    .collect();
                (
                    w,
                    *id,
                    KvEventData::Removed { seq_hashes },
                    StorageTier::Device,
                )
            }
            Op::Clear { worker, id } => {
                (key(*worker), *id, KvEventData::Cleared, StorageTier::Device)
            }
            Op::RemoveWorker { worker } => {
                let w = key(*worker);
                self.naive.workers.remove(&w);
                self.next_id.remove(&w);
                return Err(w);
            }
        };
        let event_id = self.event_id(worker, id);
        Ok(KvEvent {
            worker_id: worker.worker_id,
            dp_rank: worker.dp_rank,
            event_id,
            tier,
            data,
        })
    }
}

fn queries(naive: &Naive, extra: &[Vec<u8>]) -> Vec<Vec<LocalBlockHash>> {
    let mut queries: Vec<Vec<LocalBlockHash>> = naive.held_paths();
    // Extend held paths by one block, so partial matches are exercised too.
    let extended: Vec<_> = queries
        .iter()
        .map(|p| [p.clone(), vec![LocalBlockHash(1)]].concat())
        .collect();
    queries.extend(extended);
    queries.extend(
        extra
            .iter()
            .map(|q| q.iter().map(|&l| LocalBlockHash(u64::from(l))).collect()),
    );
    queries
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn indexer_matches_naive_model(
        ops in prop::collection::vec(op(), 1..60),
        extra in prop::collection::vec(prop::collection::vec(0u8..5, 0..7), 4),
        crowded in any::<bool>(),
    ) {
        let mut d = Driver { naive: Naive::default(), indexer: Indexer::new(IndexerConfig::default()), next_id: HashMap::new() };
        if crowded {
            // 330 idle workers first: the model's workers get slots past the 320 whose
            // bits a node keeps inline, so their bits live in extension blocks.
            for w in 0..330u64 {
                let event = KvEvent {
                    worker_id: WorkerId(10_000 + w),
                    dp_rank: 0,
                    event_id: 1,
                    tier: StorageTier::Device,
                    data: KvEventData::Cleared,
                };
                prop_assert_eq!(d.indexer.apply(&event), d.naive.apply(&event));
            }
        }
        for op in &ops {
            match d.resolve(op) {
                Ok(event) => {
                    let expected = d.naive.apply(&event);
                    let got = d.indexer.apply(&event);
                    prop_assert_eq!(got, expected, "outcome of {:?}", event);
                }
                Err(worker) => {
                    d.indexer.remove_worker(worker);
                }
            }
            if let Err(e) = d.indexer.validate() {
                prop_assert!(false, "invariant broken after {:?}: {}", op, e);
            }
            for q in queries(&d.naive, &extra) {
                let expected = d.naive.find_matches(&q);
                prop_assert_eq!(d.indexer.find_matches(&q), expected.clone(), "query {:?}", q);
                // With the query's sequence hashes (jumping along runs): the same answer,
                // whatever hashes the engines published.
                let hashed = d.indexer.find_matches_hashed(&q, &sequence_hashes(&q));
                prop_assert_eq!(hashed, expected, "hashed query {:?}", q);
            }
        }

        // Dump everything and rebuild it in a fresh indexer: same answers, same event ids.
        let snapshots = d.indexer.dump();
        let mut rebuilt = Indexer::new(IndexerConfig::default());
        for snapshot in &snapshots {
            rebuilt.restore(snapshot);
        }
        rebuilt.validate().map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(rebuilt.block_count(), d.indexer.block_count());
        for q in queries(&d.naive, &extra) {
            prop_assert_eq!(rebuilt.find_matches(&q), d.indexer.find_matches(&q));
        }
        for w in d.indexer.workers() {
            prop_assert_eq!(rebuilt.last_event_id(w), d.indexer.last_event_id(w));
        }
        // The snapshot travels as JSON too.
        let text = serde_json::to_string(&snapshots).unwrap();
        let decoded: Vec<switchyard_router::WorkerSnapshot> = serde_json::from_str(&text).unwrap();
        prop_assert_eq!(decoded, snapshots);

        // Later events apply identically to the original and the rebuilt index.
        for op in ops.iter().take(10) {
            match d.resolve(op) {
                Ok(event) => {
                    let expected = d.naive.apply(&event);
                    prop_assert_eq!(d.indexer.apply(&event), expected);
                    prop_assert_eq!(rebuilt.apply(&event), expected);
                }
                Err(worker) => {
                    d.indexer.remove_worker(worker);
                    rebuilt.remove_worker(worker);
                }
            }
        }
        for q in queries(&d.naive, &extra) {
            prop_assert_eq!(rebuilt.find_matches(&q), d.naive.find_matches(&q));
        }

        // Removing every worker leaves an empty tree.
        let workers: Vec<_> = d.indexer.workers().collect();
        for w in workers {
            d.indexer.remove_worker(w);
        }
        prop_assert_eq!(d.indexer.block_count(), 0);
        d.indexer.validate().map_err(|e| TestCaseError::fail(e.to_string()))?;
    }
}

#[test]
fn anomalies_are_counted() {
    let w = WorkerKey::new(1, 0);
    let mut indexer = Indexer::new(IndexerConfig::default());
    let block = |s, l| StoredBlock {
        seq_hash: SequenceHash(s),
        local_hash: LocalBlockHash(l),
    };
    let ev = |id, data| KvEvent {
        worker_id: WorkerId(1),
        dp_rank: 0,
        event_id: id,
        tier: StorageTier::Device,
        data,
    };
    indexer.apply(&ev(
        1,
        KvEventData::Stored {
            parent: None,
            blocks: vec![block(10, 1), block(11, 2)],
        },
    ));
    indexer.apply(&ev(
        2,
        KvEventData::Stored {
            parent: None,
            blocks: vec![block(10, 1)],
        },
    ));
    indexer.apply(&ev(
        3,
        KvEventData::Stored {
            parent: Some(SequenceHash(99)),
            blocks: vec![block(12, 3)],
        },
    ));
    indexer.apply(&ev(
        4,
        KvEventData::Removed {
            seq_hashes: vec![SequenceHash(77)],
        },
    ));
    assert_eq!(
        indexer.apply(&ev(4, KvEventData::Cleared)),
        ApplyOutcome::Stale { last_event_id: 4 }
    );
    let gap = indexer.apply(&ev(7, KvEventData::Cleared));
    assert_eq!(
        gap.gap(),
        Some(EventGap {
            worker: w,
            expected: 5,
            received: 7
        })
    );
    indexer.apply(&ev(
        8,
        KvEventData::Removed {
            seq_hashes: vec![SequenceHash(10)],
        },
    ));
    let stats = indexer.stats();
    assert_eq!(stats.duplicate_stores, 1);
    assert_eq!(stats.unknown_parent_events, 1);
    assert_eq!(stats.unknown_parent_blocks, 1);
    assert_eq!(stats.unknown_removals, 2);
    assert_eq!(stats.stale_events, 1);
    assert_eq!(stats.gaps, 1);
    assert_eq!(stats.clears, 1);
    assert_eq!(indexer.block_count(), 0);
    indexer.validate().unwrap();
}

#[test]
fn other_tiers_are_not_indexed() {
    let mut indexer = Indexer::new(IndexerConfig {
        tier: StorageTier::Device,
    });
    let stored = KvEventData::Stored {
        parent: None,
        blocks: vec![StoredBlock {
            seq_hash: SequenceHash(1),
            local_hash: LocalBlockHash(1),
        }],
    };
    let event = KvEvent {
        worker_id: WorkerId(1),
        dp_rank: 0,
        event_id: 1,
        tier: StorageTier::Host,
        data: stored,
    };
    assert_eq!(indexer.apply(&event), ApplyOutcome::OtherTier);
    assert_eq!(indexer.find_matches(&[LocalBlockHash(1)]).best(), 0);
    assert_eq!(indexer.last_event_id(WorkerKey::new(1, 0)), Some(1));
}
