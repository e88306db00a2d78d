//! Approximate indexing for engines that publish no KV events.
//!
//! Each routed request's blocks are assumed cached on the chosen worker from the moment it is
//! routed. Since nothing reports evictions, entries expire after a TTL and each worker's
//! assumed cache is capped; both prune oldest first. A request's blocks are touched from the
//! last to the first, so a shared prefix is always newer than any tail hanging off it and
//! pruning never cuts a prefix out from under a longer cached sequence.
//!
//! The assumed state feeds an ordinary [`Indexer`] through synthetic events, so matching,
//! dumps and statistics behave exactly as in event-driven mode.

use std::time::Duration;

use hashlink::LinkedHashMap;
use rustc_hash::{FxBuildHasher, FxHashMap};
use switchyard_core::{
    KvEvent, KvEventData, LocalBlockHash, SequenceHash, StorageTier, StoredBlock, TokenBlocks,
    WorkerKey,
};

use super::{Indexer, IndexerConfig, OverlapScores};

/// Approximate-mode settings (`[frontend.router.approx]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ApproxConfig {
    /// How long a routed block is assumed to stay cached.
    #[serde(with = "humantime_serde")]
    pub ttl: Duration,
    /// The most blocks assumed cached per worker.
    pub max_blocks_per_worker: usize,
}

impl Default for ApproxConfig {
    fn default() -> Self {
        ApproxConfig {
            ttl: Duration::from_secs(120),
            max_blocks_per_worker: 16_384,
        }
    }
}

#[derive(Debug, Default)]
struct AssumedCache {
    next_event_id: u64,
    /// Sequence hash -> last time it was routed, oldest first.
    blocks: LinkedHashMap<SequenceHash, Duration, FxBuildHasher>,
}

/// An indexer fed by routing decisions instead of engine events.
#[derive(Debug, Default)]
pub struct ApproxIndexer {
    config: ApproxConfig,
    indexer: Indexer,
    workers: FxHashMap<WorkerKey, AssumedCache>,
}

impl ApproxIndexer {
    pub fn new(config: ApproxConfig) -> Self {
        ApproxIndexer {
            config,
            indexer: Indexer::new(IndexerConfig {
                tier: StorageTier::Device,
            }),
            workers: FxHashMap::default(),
        }
    }

    /// The underlying indexer, holding the assumed state.
    pub fn indexer(&self) -> &Indexer {
        &self.indexer
    }

    /// Records that a request with these blocks was routed to `worker` at `now`.
    ///
    /// `locals` and `seqs` are the request's local and sequence hashes from its first block.
    pub fn record_routed(
        &mut self,
        worker: WorkerKey,
        locals: &[LocalBlockHash],
        seqs: &[SequenceHash],
        now: Duration,
    ) {
        let len = locals.len().min(seqs.len());
        let cache = self.workers.entry(worker).or_default();
        // The assumed cache is prefix-closed, so the missing blocks are a suffix.
        let held = seqs[..len].partition_point(|h| cache.blocks.contains_key(h));
        if held < len {
            let blocks = (held..len)
                .map(|i| StoredBlock {
                    seq_hash: seqs[i],
                    local_hash: locals[i],
                })
                .collect();
            let parent = held.checked_sub(1).map(|i| seqs[i]);
            cache.next_event_id += 1;
            self.indexer.apply(&event(
                worker,
                cache.next_event_id,
                KvEventData::Stored { parent, blocks },
            ));
        }
        for &hash in seqs[..len].iter().rev() {
            cache.blocks.insert(hash, now);
        }
        let removed = prune(cache, self.config, now);
        if !removed.is_empty() {
            cache.next_event_id += 1;
            let data = KvEventData::Removed {
                seq_hashes: removed,
            };
            self.indexer
                .apply(&event(worker, cache.next_event_id, data));
        }
    }

    /// Drops every assumed block older than the TTL.
    pub fn prune(&mut self, now: Duration) {
        for (&worker, cache) in &mut self.workers {
            let removed = prune(cache, self.config, now);
            if !removed.is_empty() {
                cache.next_event_id += 1;
                let data = KvEventData::Removed {
                    seq_hashes: removed,
                };
                self.indexer
                    .apply(&event(worker, cache.next_event_id, data));
            }
        }
    }

    /// Prunes expired blocks, then matches.
    pub fn find_matches(&mut self, query: &[LocalBlockHash], now: Duration) -> OverlapScores {
        self.prune(now);
        self.indexer.find_matches(query)
    }

    /// [`ApproxIndexer::find_matches`] for a prompt's blocks, with their sequence hashes.
    pub fn find_matches_blocks(&mut self, blocks: &TokenBlocks, now: Duration) -> OverlapScores {
        self.prune(now);
        self.indexer.find_matches_blocks(blocks)
    }

    pub fn remove_worker(&mut self, worker: WorkerKey) {
        self.workers.remove(&worker);
        self.indexer.remove_worker(worker);
    }
}

fn prune(cache: &mut AssumedCache, config: ApproxConfig, now: Duration) -> Vec<SequenceHash> {
    let mut removed = Vec::new();
    while let Some((&hash, &touched)) = cache.blocks.front() {
        let expired = touched + config.ttl <= now;
        if !expired && cache.blocks.len() <= config.max_blocks_per_worker {
            break;
        }
        cache.blocks.pop_front();
        removed.push(hash);
    }
    removed
}

fn event(worker: WorkerKey, event_id: u64, data: KvEventData) -> KvEvent {
    KvEvent {
        worker_id: worker.worker_id,
        dp_rank: worker.dp_rank,
        event_id,
        tier: StorageTier::Device,
        data,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_core::hash::sequence_hashes;

    fn chain(ids: &[u64]) -> (Vec<LocalBlockHash>, Vec<SequenceHash>) {
        let locals: Vec<_> = ids.iter().map(|&i| LocalBlockHash(i)).collect();
        let seqs = sequence_hashes(&locals);
        (locals, seqs)
    }

    #[test]
    fn routed_blocks_match_until_they_expire() {
        let mut approx = ApproxIndexer::new(ApproxConfig {
            ttl: Duration::from_secs(10),
            max_blocks_per_worker: 100,
        });
        let w = WorkerKey::new(1, 0);
        let (locals, seqs) = chain(&[1, 2, 3]);
        approx.record_routed(w, &locals, &seqs, Duration::from_secs(0));
        assert_eq!(
            approx
                .find_matches(&locals, Duration::from_secs(9))
                .score(w),
            3
        );
        assert_eq!(
            approx
                .find_matches(&locals, Duration::from_secs(10))
                .score(w),
            0
        );
        assert_eq!(approx.indexer().block_count(), 0);
    }

    #[test]
    fn refresh_extends_life_and_cap_prunes_tails_first() {
        let mut approx = ApproxIndexer::new(ApproxConfig {
            ttl: Duration::from_secs(10),
            max_blocks_per_worker: 4,
        });
        let w = WorkerKey::new(1, 0);
        let (a_locals, a_seqs) = chain(&[1, 2, 3]);
        let (b_locals, b_seqs) = chain(&[1, 2, 7]);
        approx.record_routed(w, &a_locals, &a_seqs, Duration::from_secs(0));
        approx.record_routed(w, &b_locals, &b_seqs, Duration::from_secs(5));
        // 4 distinct blocks: at the cap, nothing pruned yet.
        assert_eq!(approx.indexer().cached_blocks(w), 4);
        // At t=12, block 3 (touched at 0) has expired; the shared prefix (touched at 5) lives.
        let scores = approx.find_matches(&a_locals, Duration::from_secs(12));
        assert_eq!(scores.score(w), 2);
        assert_eq!(
            approx
                .find_matches(&b_locals, Duration::from_secs(12))
                .score(w),
            3
        );
        // A new branch over the cap evicts the oldest tail, never the shared prefix.
        let (c_locals, c_seqs) = chain(&[1, 2, 8, 9]);
        approx.record_routed(w, &c_locals, &c_seqs, Duration::from_secs(13));
        assert_eq!(approx.indexer().cached_blocks(w), 4);
        assert_eq!(
            approx
                .find_matches(&c_locals, Duration::from_secs(13))
                .score(w),
            4
        );
        assert_eq!(
            approx
                .find_matches(&b_locals, Duration::from_secs(13))
                .score(w),
            2
        );
    }
}
