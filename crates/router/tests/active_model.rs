//! Active sequences against a naive model.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use proptest::prelude::*;
use switchyard_core::hash::sequence_hashes;
use switchyard_core::{LocalBlockHash, RequestId, SequenceHash, WorkerKey};
use switchyard_router::ActiveSequences;

#[derive(Debug, Clone)]
enum Op {
    Add {
        worker: u8,
        path: Vec<u8>,
        prefill: u16,
    },
    Prefilled(u8),
    /// The last tokens of a request's prefill wait for its media, then join the queue.
    Hold(u8, u16),
    Release(u8),
    Free(u8),
    Advance(u8),
    RemoveWorker(u8),
    AddWorker(u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (0u8..3, prop::collection::vec(0u8..3, 0..5), any::<u16>()).prop_map(|(worker, path, prefill)| Op::Add { worker, path, prefill }),
        2 => any::<u8>().prop_map(Op::Prefilled),
        1 => (any::<u8>(), any::<u16>()).prop_map(|(pick, tokens)| Op::Hold(pick, tokens)),
        1 => any::<u8>().prop_map(Op::Release),
        3 => any::<u8>().prop_map(Op::Free),
        1 => (0u8..20).prop_map(Op::Advance),
        1 => (0u8..3).prop_map(Op::RemoveWorker),
        1 => (0u8..3).prop_map(Op::AddWorker),
    ]
}

#[derive(Debug, Clone)]
struct NaiveRequest {
    worker: WorkerKey,
    blocks: Vec<SequenceHash>,
    prefill: u64,
    /// Of `prefill`, the tokens held out of the queue.
    held: u64,
    added: Duration,
}

impl NaiveRequest {
    fn queued(&self) -> u64 {
        self.prefill - self.held
    }
}

fn chain(path: &[u8]) -> Vec<SequenceHash> {
    sequence_hashes(
        &path
            .iter()
            .map(|&l| LocalBlockHash(u64::from(l)))
            .collect::<Vec<_>>(),
    )
}

proptest! {
    #[test]
    fn active_sequences_match_naive_model(ops in prop::collection::vec(op(), 1..80)) {
        let ttl = Duration::from_secs(30);
        let mut active = ActiveSequences::new(ttl);
        let mut workers: HashSet<WorkerKey> = HashSet::new();
        let mut naive: BTreeMap<RequestId, NaiveRequest> = BTreeMap::new();
        let mut now = Duration::ZERO;
        let mut next_id = 0u64;
        // When each worker started on the head of its prefill queue.
        let mut since: BTreeMap<WorkerKey, Duration> = BTreeMap::new();
        for w in 0..3 {
            active.add_worker(WorkerKey::new(w, 0));
            workers.insert(WorkerKey::new(w, 0));
        }
        for op in &ops {
            match op {
                Op::Add { worker, path, prefill } => {
                    let w = WorkerKey::new(u64::from(*worker), 0);
                    let id = RequestId(next_id);
                    next_id += 1;
                    let blocks = chain(path);
                    let queue_empty = naive.values().all(|r| r.worker != w || r.queued() == 0);
                    let result = active.add_request(id, w, &blocks, u64::from(*prefill), now);
                    prop_assert_eq!(result.is_ok(), workers.contains(&w));
                    if result.is_ok() {
                        if queue_empty {
                            since.insert(w, now);
                        }
                        naive.insert(id, NaiveRequest { worker: w, blocks, prefill: u64::from(*prefill), held: 0, added: now });
                    }
                    // Adding the same id twice is refused.
                    if workers.contains(&w) {
                        prop_assert!(active.add_request(id, w, &[], 0, now).is_err());
                    }
                }
                Op::Prefilled(pick) => {
                    let id = RequestId(u64::from(*pick) % next_id.max(1));
                    let known = naive.get_mut(&id).map(|r| {
                        if r.queued() > 0 {
                            since.insert(r.worker, now);
                        }
                        r.prefill = 0;
                        r.held = 0;
                    }).is_some();
                    prop_assert_eq!(active.mark_prefill_completed(id, now), known);
                }
                Op::Hold(pick, tokens) => {
                    let id = RequestId(u64::from(*pick) % next_id.max(1));
                    let known = naive.get_mut(&id).map(|r| {
                        r.held += u64::from(*tokens).min(r.queued());
                    }).is_some();
                    prop_assert_eq!(active.hold_prefill(id, u64::from(*tokens)), known);
                }
                Op::Release(pick) => {
                    let id = RequestId(u64::from(*pick) % next_id.max(1));
                    let worker = naive.get(&id).map(|r| r.worker);
                    if let Some(w) = worker {
                        let queue_empty = naive.values().all(|r| r.worker != w || r.queued() == 0);
                        let r = naive.get_mut(&id).unwrap();
                        if r.held > 0 && queue_empty {
                            since.insert(w, now);
                        }
                        r.held = 0;
                    }
                    prop_assert_eq!(active.release_prefill(id, now), worker.is_some());
                }
                Op::Free(pick) => {
                    let id = RequestId(u64::from(*pick) % next_id.max(1));
                    let expected = naive.remove(&id).map(|r| r.worker);
                    prop_assert_eq!(active.free(id), expected);
                }
                Op::Advance(secs) => {
                    now += Duration::from_secs(u64::from(*secs));
                    let mut expired: Vec<RequestId> = naive.iter().filter(|(_, r)| r.added + ttl <= now).map(|(&id, _)| id).collect();
                    for id in &expired {
                        naive.remove(id);
                    }
                    let mut got = active.expire(now);
                    got.sort();
                    expired.sort();
                    prop_assert_eq!(got, expired);
                }
                Op::RemoveWorker(worker) => {
                    let w = WorkerKey::new(u64::from(*worker), 0);
                    let mut expected: Vec<RequestId> = naive.iter().filter(|(_, r)| r.worker == w).map(|(&id, _)| id).collect();
                    naive.retain(|_, r| r.worker != w);
                    workers.remove(&w);
                    let mut got = active.remove_worker(w);
                    got.sort();
                    expected.sort();
                    prop_assert_eq!(got, expected);
                }
                Op::AddWorker(worker) => {
                    let w = WorkerKey::new(u64::from(*worker), 0);
                    active.add_worker(w);
                    workers.insert(w);
                }
            }
            // Loads, refcounts and new-block counts equal the naive recomputation.
            for &w in &workers {
                let live: Vec<&NaiveRequest> = naive.values().filter(|r| r.worker == w).collect();
                let distinct: HashSet<SequenceHash> = live.iter().flat_map(|r| r.blocks.iter().copied()).collect();
                let load = active.load(w);
                prop_assert_eq!(load.active_blocks, distinct.len() as u64);
                prop_assert_eq!(load.prefill_tokens, live.iter().map(|r| r.queued()).sum::<u64>());
                prop_assert_eq!(load.held_prefill_tokens, live.iter().map(|r| r.held).sum::<u64>());
                prop_assert_eq!(load.requests as usize, live.len());
                let queued = live.iter().any(|r| r.queued() > 0);
                let expected_since = if queued { since[&w] } else { Duration::ZERO };
                prop_assert_eq!(load.prefill_since, expected_since);
                for block in &distinct {
                    let count = live.iter().map(|r| r.blocks.iter().filter(|b| *b == block).count()).sum::<usize>();
                    prop_assert_eq!(active.refcount(w, *block) as usize, count);
                }
                for probe in [&[0u8, 1, 2][..], &[0, 0, 0, 0], &[1, 2], &[2]] {
                    let blocks = chain(probe);
                    let missing = blocks.iter().filter(|b| !distinct.contains(b)).count() as u64;
                    prop_assert_eq!(active.new_blocks(w, &blocks), missing);
                }
            }
            prop_assert_eq!(active.active_requests(), naive.len());
        }
        // Everything frees back to zero.
        let ids: Vec<RequestId> = naive.keys().copied().collect();
        for id in ids {
            prop_assert!(active.free(id).is_some());
        }
        for &w in &workers {
            prop_assert_eq!(active.load(w), switchyard_router::WorkerLoad::default());
        }
    }
}
