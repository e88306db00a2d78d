//! The KV block manager.
//!
//! Blocks in use are *active*: full blocks keyed by their sequence hash and reference
//! counted (requests sharing a prefix share its blocks), plus *partial* blocks, the unfilled
//! tail of a sequence, which have no hash yet. A full block no request uses becomes
//! *inactive*: it keeps its content so a later request can reuse it, until space is needed
//! and it is evicted, least recently used first. Sequences release their blocks tail first,
//! so a tail is evicted before the prefix it hangs off.
//!
//! Every block stored and every block evicted or destroyed is recorded as a KV event, in
//! order, for the engine to publish.
//!
//! With prefix caching off nothing is hashed or shared: full blocks are anonymous, freed on
//! release, and no event is emitted.

use hashlink::LinkedHashMap;
use rustc_hash::{FxBuildHasher, FxHashMap};
use switchyard_core::{KvEventData, LocalBlockHash, SequenceHash, StoredBlock};

/// No block could be found for an allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutOfBlocks;

#[derive(Debug, Clone, Copy)]
struct ActiveBlock {
    refcount: u32,
}

#[derive(Debug)]
pub struct BlockManager {
    capacity: usize,
    prefix_caching: bool,
    active: FxHashMap<SequenceHash, ActiveBlock>,
    /// Cached blocks no request uses, least recently released first.
    inactive: LinkedHashMap<SequenceHash, LocalBlockHash, FxBuildHasher>,
    partial: usize,
    /// Full blocks in use when prefix caching is off.
    anonymous: usize,
    events: Vec<KvEventData>,
}

impl BlockManager {
    pub fn new(capacity: usize, prefix_caching: bool) -> Self {
        BlockManager {
            capacity,
            prefix_caching,
            active: FxHashMap::default(),
            inactive: LinkedHashMap::with_hasher(FxBuildHasher),
            partial: 0,
            anonymous: 0,
            events: Vec::new(),
        }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn prefix_caching(&self) -> bool {
        self.prefix_caching
    }

    /// Blocks in use by running sequences.
    pub fn in_use(&self) -> usize {
        self.active.len() + self.partial + self.anonymous
    }

    /// Blocks holding reusable content no sequence uses.
    pub fn inactive(&self) -> usize {
        self.inactive.len()
    }

    /// Blocks neither in use nor cached.
    pub fn free(&self) -> usize {
        self.capacity - self.in_use() - self.inactive.len()
    }

    /// How many leading blocks of `hashes` are cached (in use or not).
    pub fn cached_prefix(&self, hashes: &[SequenceHash]) -> usize {
        if !self.prefix_caching {
            return 0;
        }
        hashes
            .iter()
            .take_while(|h| self.active.contains_key(h) || self.inactive.contains_key(h))
            .count()
    }

    pub fn is_active(&self, hash: SequenceHash) -> bool {
        self.active.contains_key(&hash)
    }

    pub fn is_inactive(&self, hash: SequenceHash) -> bool {
        self.inactive.contains_key(&hash)
    }

    pub fn refcount(&self, hash: SequenceHash) -> u32 {
        self.active.get(&hash).map_or(0, |b| b.refcount)
    }

    /// Every cached block, in use or not: the content the engine would report.
    pub fn cached_hashes(&self) -> impl Iterator<Item = SequenceHash> + '_ {
        self.active.keys().chain(self.inactive.keys()).copied()
    }

    pub fn partial_blocks(&self) -> usize {
        self.partial
    }

    /// Takes the events recorded since the last call.
    pub fn drain_events(&mut self) -> std::vec::Drain<'_, KvEventData> {
        self.events.drain(..)
    }

    /// Makes room for one new block, evicting the least recently used inactive block.
    fn make_room(&mut self) -> Result<(), OutOfBlocks> {
        if self.in_use() + self.inactive.len() < self.capacity {
            return Ok(());
        }
        let (hash, _) = self.inactive.pop_front().ok_or(OutOfBlocks)?;
        self.record_removed(hash);
        Ok(())
    }

    /// Shares an already cached block (in use or not). Returns whether it was cached.
    pub fn share(&mut self, hash: SequenceHash) -> bool {
        if !self.prefix_caching {
            return false;
        }
        if let Some(block) = self.active.get_mut(&hash) {
            block.refcount += 1;
            return true;
        }
        if self.inactive.remove(&hash).is_some() {
            self.active.insert(hash, ActiveBlock { refcount: 1 });
            return true;
        }
        false
    }

    /// Uses the full block `hash` (child of `parent`): shares it if cached, else allocates
    /// and stores it.
    pub fn use_full(
        &mut self,
        hash: SequenceHash,
        local: LocalBlockHash,
        parent: Option<SequenceHash>,
    ) -> Result<(), OutOfBlocks> {
        if !self.prefix_caching {
            self.make_room()?;
            self.anonymous += 1;
            return Ok(());
        }
        if self.share(hash) {
            return Ok(());
        }
        self.make_room()?;
        self.active.insert(hash, ActiveBlock { refcount: 1 });
        self.record_stored(parent, hash, local);
        Ok(())
    }

    /// Allocates an unfilled tail block.
    pub fn use_partial(&mut self) -> Result<(), OutOfBlocks> {
        self.make_room()?;
        self.partial += 1;
        Ok(())
    }

    /// A partial block filled up: it becomes the full block `hash`, or, if that content is
    /// already cached, the sequence shares the cached block and the partial one is freed.
    pub fn promote(
        &mut self,
        hash: SequenceHash,
        local: LocalBlockHash,
        parent: Option<SequenceHash>,
    ) {
        self.partial = self.partial.saturating_sub(1);
        if !self.prefix_caching {
            self.anonymous += 1;
            return;
        }
        if !self.share(hash) {
            self.active.insert(hash, ActiveBlock { refcount: 1 });
            self.record_stored(parent, hash, local);
        }
    }

    /// Drops one reference; an unused block stays cached as inactive.
    pub fn release(&mut self, hash: SequenceHash, local: LocalBlockHash) {
        if !self.prefix_caching {
            self.anonymous = self.anonymous.saturating_sub(1);
            return;
        }
        if let Some(block) = self.active.get_mut(&hash) {
            block.refcount -= 1;
            if block.refcount == 0 {
                self.active.remove(&hash);
                self.inactive.insert(hash, local);
            }
        }
    }

    /// Drops one reference; an unused block is discarded (preemption).
    pub fn destroy(&mut self, hash: SequenceHash) {
        if !self.prefix_caching {
            self.anonymous = self.anonymous.saturating_sub(1);
            return;
        }
        if let Some(block) = self.active.get_mut(&hash) {
            block.refcount -= 1;
            if block.refcount == 0 {
                self.active.remove(&hash);
                self.record_removed(hash);
            }
        }
    }

    pub fn release_partial(&mut self) {
        self.partial = self.partial.saturating_sub(1);
    }

    fn record_stored(
        &mut self,
        parent: Option<SequenceHash>,
        hash: SequenceHash,
        local: LocalBlockHash,
    ) {
        let block = StoredBlock {
            seq_hash: hash,
            local_hash: local,
        };
        // Extend the previous event when this block continues its chain.
        if let Some(KvEventData::Stored { blocks, .. }) = self.events.last_mut()
            && blocks.last().map(|b| b.seq_hash) == parent
            && parent.is_some()
        {
            blocks.push(block);
            return;
        }
        self.events.push(KvEventData::Stored {
            parent,
            blocks: vec![block],
        });
    }

    fn record_removed(&mut self, hash: SequenceHash) {
        if let Some(KvEventData::Removed { seq_hashes }) = self.events.last_mut() {
            seq_hashes.push(hash);
            return;
        }
        self.events.push(KvEventData::Removed {
            seq_hashes: vec![hash],
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(i: u64) -> SequenceHash {
        SequenceHash(i)
    }

    fn l(i: u64) -> LocalBlockHash {
        LocalBlockHash(i + 100)
    }

    #[test]
    fn stored_chains_batch_and_sharing_is_refcounted() {
        let mut m = BlockManager::new(4, true);
        m.use_full(h(1), l(1), None).unwrap();
        m.use_full(h(2), l(2), Some(h(1))).unwrap();
        m.use_full(h(1), l(1), None).unwrap();
        assert_eq!(m.refcount(h(1)), 2);
        assert_eq!(m.in_use(), 2);
        let events: Vec<_> = m.drain_events().collect();
        assert_eq!(
            events,
            vec![KvEventData::Stored {
                parent: None,
                blocks: vec![
                    StoredBlock {
                        seq_hash: h(1),
                        local_hash: l(1)
                    },
                    StoredBlock {
                        seq_hash: h(2),
                        local_hash: l(2)
                    }
                ]
            }]
        );
    }

    #[test]
    fn released_blocks_stay_cached_and_tails_are_evicted_first() {
        let mut m = BlockManager::new(3, true);
        m.use_full(h(1), l(1), None).unwrap();
        m.use_full(h(2), l(2), Some(h(1))).unwrap();
        m.use_full(h(3), l(3), Some(h(2))).unwrap();
        // Released tail first, as sequences do.
        for i in [3, 2, 1] {
            m.release(h(i), l(i));
        }
        assert_eq!((m.in_use(), m.inactive(), m.free()), (0, 3, 0));
        assert_eq!(m.cached_prefix(&[h(1), h(2), h(3), h(4)]), 3);
        m.drain_events().for_each(drop);
        // A new block evicts the tail (3), not the prefix.
        m.use_full(h(9), l(9), None).unwrap();
        assert!(!m.is_inactive(h(3)) && m.is_inactive(h(1)) && m.is_inactive(h(2)));
        let events: Vec<_> = m.drain_events().collect();
        assert_eq!(
            events[0],
            KvEventData::Removed {
                seq_hashes: vec![h(3)]
            }
        );
        // Reusing a cached block reactivates it without a new event.
        m.use_full(h(1), l(1), None).unwrap();
        assert_eq!(m.refcount(h(1)), 1);
        assert_eq!(m.drain_events().count(), 0);
    }

    #[test]
    fn out_of_blocks_when_everything_is_in_use() {
        let mut m = BlockManager::new(2, true);
        m.use_full(h(1), l(1), None).unwrap();
        m.use_partial().unwrap();
        assert_eq!(m.use_partial(), Err(OutOfBlocks));
        assert_eq!(m.use_full(h(2), l(2), Some(h(1))), Err(OutOfBlocks));
    }

    #[test]
    fn promote_stores_or_shares_and_destroy_discards() {
        let mut m = BlockManager::new(4, true);
        m.use_full(h(1), l(1), None).unwrap();
        m.use_partial().unwrap();
        m.promote(h(2), l(2), Some(h(1)));
        assert_eq!((m.partial_blocks(), m.refcount(h(2))), (0, 1));
        // A second sequence fills a block with the same content: it shares, freeing its own.
        m.use_partial().unwrap();
        m.promote(h(2), l(2), Some(h(1)));
        assert_eq!(
            (m.partial_blocks(), m.refcount(h(2)), m.in_use()),
            (0, 2, 2)
        );
        m.drain_events().for_each(drop);
        m.destroy(h(2));
        m.destroy(h(2));
        assert!(!m.is_active(h(2)) && !m.is_inactive(h(2)));
        assert_eq!(
            m.drain_events().collect::<Vec<_>>(),
            vec![KvEventData::Removed {
                seq_hashes: vec![h(2)]
            }]
        );
    }

    #[test]
    fn without_prefix_caching_nothing_is_shared_or_reported() {
        let mut m = BlockManager::new(3, false);
        m.use_full(h(1), l(1), None).unwrap();
        m.use_full(h(1), l(1), None).unwrap();
        assert_eq!(m.in_use(), 2);
        assert_eq!(m.cached_prefix(&[h(1)]), 0);
        m.release(h(1), l(1));
        assert_eq!((m.in_use(), m.inactive(), m.free()), (1, 0, 2));
        assert_eq!(m.drain_events().count(), 0);
    }
}
