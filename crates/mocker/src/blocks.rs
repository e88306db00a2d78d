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

use std::collections::VecDeque;

use rustc_hash::FxHashMap;
use switchyard_core::{KvEventData, LocalBlockHash, SequenceHash, StoredBlock};

/// A physical KV block.
pub type BlockId = u32;

/// No block could be found for an allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutOfBlocks;

#[derive(Debug, Clone, Copy, Default)]
struct Block {
    /// Content hash; meaningful while `cached`.
    hash: SequenceHash,
    refcount: u32,
    /// The block's content is registered for reuse (a full block with prefix caching on).
    cached: bool,
    /// An unfilled tail block.
    partial: bool,
    /// When it last became inactive; matches its entry in the eviction queue.
    released: u64,
}

/// Whether a block's content is cached, and in use or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    /// Not cached: a new block is needed.
    Miss,
    /// Cached and in use by a sequence.
    Active(BlockId),
    /// Cached and unused: reusing it takes it off the eviction queue.
    Inactive(BlockId),
}

#[derive(Debug)]
pub struct BlockManager {
    prefix_caching: bool,
    blocks: Vec<Block>,
    /// Blocks holding nothing.
    free: Vec<BlockId>,
    /// Content hash -> block, for every cached block in use or not.
    cached: FxHashMap<SequenceHash, BlockId>,
    /// Inactive blocks in release order, least recent first. Entries whose block was reused
    /// or released again since are stale and skipped (their stamp no longer matches).
    eviction_queue: VecDeque<(BlockId, u64)>,
    in_use: usize,
    inactive: usize,
    partial: usize,
    next_stamp: u64,
    events: Vec<KvEventData>,
}

impl BlockManager {
    pub fn new(capacity: usize, prefix_caching: bool) -> Self {
        BlockManager {
            prefix_caching,
            blocks: vec![Block::default(); capacity],
            free: (0..capacity as BlockId).rev().collect(),
            cached: FxHashMap::default(),
            eviction_queue: VecDeque::new(),
            in_use: 0,
            inactive: 0,
            partial: 0,
            next_stamp: 0,
            events: Vec::new(),
        }
    }

    pub fn capacity(&self) -> usize {
        self.blocks.len()
    }

    pub fn prefix_caching(&self) -> bool {
        self.prefix_caching
    }

    /// Blocks in use by running sequences.
    pub fn in_use(&self) -> usize {
        self.in_use
    }

    /// Blocks holding reusable content no sequence uses.
    pub fn inactive(&self) -> usize {
        self.inactive
    }

    /// Blocks neither in use nor cached.
    pub fn free(&self) -> usize {
        self.free.len()
    }

    pub fn partial_blocks(&self) -> usize {
        self.partial
    }

    pub fn lookup(&self, hash: SequenceHash) -> Lookup {
        if !self.prefix_caching {
            return Lookup::Miss;
        }
        match self.cached.get(&hash) {
            None => Lookup::Miss,
            Some(&id) if self.blocks[id as usize].refcount > 0 => Lookup::Active(id),
            Some(&id) => Lookup::Inactive(id),
        }
    }

    /// How many leading blocks of `hashes` are cached (in use or not).
    pub fn cached_prefix(&self, hashes: &[SequenceHash]) -> usize {
        if !self.prefix_caching {
            return 0;
        }
        hashes
            .iter()
            .take_while(|h| self.cached.contains_key(h))
            .count()
    }

    pub fn refcount(&self, id: BlockId) -> u32 {
        self.blocks[id as usize].refcount
    }

    /// The content hash of a cached block.
    pub fn hash_of(&self, id: BlockId) -> Option<SequenceHash> {
        let block = &self.blocks[id as usize];
        block.cached.then_some(block.hash)
    }

    pub fn is_partial(&self, id: BlockId) -> bool {
        self.blocks[id as usize].partial
    }

    /// Every cached block, in use or not: the content the engine would report.
    pub fn cached_hashes(&self) -> impl Iterator<Item = SequenceHash> + '_ {
        self.cached.keys().copied()
    }

    /// Takes the events recorded since the last call.
    pub fn drain_events(&mut self) -> std::vec::Drain<'_, KvEventData> {
        self.events.drain(..)
    }

    /// Evicts least recently released inactive blocks until `n` blocks are free.
    ///
    /// Allocations reserve all their blocks first, so one step's evictions form one Removed
    /// event and its stores one Stored chain, instead of alternating block by block.
    pub fn reserve(&mut self, n: usize) -> Result<(), OutOfBlocks> {
        while self.free.len() < n {
            let (id, stamp) = self.eviction_queue.pop_front().ok_or(OutOfBlocks)?;
            let block = &mut self.blocks[id as usize];
            if block.cached && block.refcount == 0 && block.released == stamp {
                block.cached = false;
                let hash = block.hash;
                self.cached.remove(&hash);
                self.inactive -= 1;
                self.free.push(id);
                self.record_removed(hash);
            }
        }
        Ok(())
    }

    /// A block to fill, evicting one if none is free.
    fn take(&mut self) -> Result<BlockId, OutOfBlocks> {
        self.reserve(1)?;
        self.free.pop().ok_or(OutOfBlocks)
    }

    /// Adds a reference to a block (in use or inactive).
    pub fn share(&mut self, id: BlockId) {
        let block = &mut self.blocks[id as usize];
        if block.refcount == 0 {
            self.inactive -= 1;
            self.in_use += 1;
        }
        block.refcount += 1;
    }

    /// Allocates the full block `hash` (child of `parent`), known not to be cached, and
    /// stores it.
    pub fn store_new(
        &mut self,
        hash: SequenceHash,
        local: LocalBlockHash,
        parent: Option<SequenceHash>,
    ) -> Result<BlockId, OutOfBlocks> {
        let id = self.take()?;
        let caching = self.prefix_caching;
        self.blocks[id as usize] = Block {
            hash,
            refcount: 1,
            cached: caching,
            partial: false,
            released: 0,
        };
        self.in_use += 1;
        if caching {
            self.cached.insert(hash, id);
            self.record_stored(parent, hash, local);
        }
        Ok(id)
    }

    /// Stores the full block `hash`, or shares it if it turns out to be cached already.
    pub fn store_or_share(
        &mut self,
        hash: SequenceHash,
        local: LocalBlockHash,
        parent: Option<SequenceHash>,
    ) -> Result<BlockId, OutOfBlocks> {
        if let Lookup::Active(id) | Lookup::Inactive(id) = self.lookup(hash) {
            self.share(id);
            return Ok(id);
        }
        self.store_new(hash, local, parent)
    }

    /// Allocates an unfilled tail block.
    pub fn use_partial(&mut self) -> Result<BlockId, OutOfBlocks> {
        let id = self.take()?;
        self.blocks[id as usize] = Block {
            refcount: 1,
            partial: true,
            ..Block::default()
        };
        self.in_use += 1;
        self.partial += 1;
        Ok(id)
    }

    /// The partial block `id` filled up as content `hash`. If that content is cached
    /// already, the sequence shares the cached block and `id` is freed; otherwise `id`
    /// becomes the full block and is stored. Returns the block now holding the content.
    pub fn promote(
        &mut self,
        id: BlockId,
        hash: SequenceHash,
        local: LocalBlockHash,
        parent: Option<SequenceHash>,
    ) -> BlockId {
        self.partial -= 1;
        self.blocks[id as usize].partial = false;
        match self.lookup(hash) {
            Lookup::Active(other) | Lookup::Inactive(other) => {
                self.share(other);
                self.release(id);
                other
            }
            Lookup::Miss => {
                if self.prefix_caching {
                    let block = &mut self.blocks[id as usize];
                    block.hash = hash;
                    block.cached = true;
                    self.cached.insert(hash, id);
                    self.record_stored(parent, hash, local);
                }
                id
            }
        }
    }

    /// Drops one reference; an unused full block stays cached as inactive.
    pub fn release(&mut self, id: BlockId) {
        let block = &mut self.blocks[id as usize];
        if block.refcount == 0 {
            return;
        }
        block.refcount -= 1;
        if block.refcount > 0 {
            return;
        }
        self.in_use -= 1;
        if block.partial {
            block.partial = false;
            self.partial -= 1;
        }
        if block.cached {
            self.next_stamp += 1;
            block.released = self.next_stamp;
            self.eviction_queue.push_back((id, self.next_stamp));
            self.inactive += 1;
            self.compact_queue();
        } else {
            self.free.push(id);
        }
    }

    /// Drops one reference; an unused block is discarded (preemption).
    pub fn destroy(&mut self, id: BlockId) {
        let block = &mut self.blocks[id as usize];
        if block.refcount == 0 {
            return;
        }
        block.refcount -= 1;
        if block.refcount > 0 {
            return;
        }
        self.in_use -= 1;
        if block.partial {
            block.partial = false;
            self.partial -= 1;
        }
        if block.cached {
            block.cached = false;
            let hash = block.hash;
            self.cached.remove(&hash);
            self.record_removed(hash);
        }
        self.free.push(id);
    }

    /// Drops stale queue entries once they outnumber the live ones, bounding the queue.
    fn compact_queue(&mut self) {
        if self.eviction_queue.len() > 2 * self.inactive + 1024 {
            let blocks = &self.blocks;
            self.eviction_queue.retain(|&(id, stamp)| {
                let b = &blocks[id as usize];
                b.cached && b.refcount == 0 && b.released == stamp
            });
        }
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

    fn events(m: &mut BlockManager) -> Vec<KvEventData> {
        m.drain_events().collect()
    }

    #[test]
    fn stored_chains_batch_and_sharing_is_refcounted() {
        let mut m = BlockManager::new(4, true);
        let a = m.store_new(h(1), l(1), None).unwrap();
        m.store_new(h(2), l(2), Some(h(1))).unwrap();
        assert_eq!(m.lookup(h(1)), Lookup::Active(a));
        m.share(a);
        assert_eq!(m.refcount(a), 2);
        assert_eq!(m.in_use(), 2);
        assert_eq!(
            events(&mut m),
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
        let ids: Vec<_> = (1..=3)
            .map(|i| m.store_new(h(i), l(i), (i > 1).then(|| h(i - 1))).unwrap())
            .collect();
        // Released tail first, as sequences do.
        for &id in ids.iter().rev() {
            m.release(id);
        }
        assert_eq!((m.in_use(), m.inactive(), m.free()), (0, 3, 0));
        assert_eq!(m.cached_prefix(&[h(1), h(2), h(3), h(4)]), 3);
        events(&mut m);
        // A new block evicts the tail (3), not the prefix.
        m.store_new(h(9), l(9), None).unwrap();
        assert_eq!(m.lookup(h(3)), Lookup::Miss);
        assert!(matches!(m.lookup(h(1)), Lookup::Inactive(_)));
        assert_eq!(
            events(&mut m)[0],
            KvEventData::Removed {
                seq_hashes: vec![h(3)]
            }
        );
        // Reusing a cached block reactivates it without a new event.
        let Lookup::Inactive(first) = m.lookup(h(1)) else {
            panic!("cached")
        };
        m.share(first);
        assert_eq!((m.refcount(first), m.in_use(), m.inactive()), (1, 2, 1));
        assert!(events(&mut m).is_empty());
        // Its stale queue entry is skipped: the next eviction takes block 2.
        m.store_new(h(8), l(8), None).unwrap();
        assert_eq!(
            events(&mut m)[0],
            KvEventData::Removed {
                seq_hashes: vec![h(2)]
            }
        );
    }

    #[test]
    fn out_of_blocks_when_everything_is_in_use() {
        let mut m = BlockManager::new(2, true);
        m.store_new(h(1), l(1), None).unwrap();
        m.use_partial().unwrap();
        assert_eq!(m.use_partial(), Err(OutOfBlocks));
        assert_eq!(m.store_new(h(2), l(2), Some(h(1))), Err(OutOfBlocks));
    }

    #[test]
    fn promote_stores_or_shares_and_destroy_discards() {
        let mut m = BlockManager::new(4, true);
        m.store_new(h(1), l(1), None).unwrap();
        let p = m.use_partial().unwrap();
        let full = m.promote(p, h(2), l(2), Some(h(1)));
        assert_eq!((full, m.partial_blocks(), m.refcount(full)), (p, 0, 1));
        // A second sequence fills a block with the same content: it shares, freeing its own.
        let q = m.use_partial().unwrap();
        let shared = m.promote(q, h(2), l(2), Some(h(1)));
        assert_eq!(
            (shared, m.partial_blocks(), m.refcount(p), m.in_use()),
            (p, 0, 2, 2)
        );
        events(&mut m);
        m.destroy(p);
        m.destroy(p);
        assert_eq!(m.lookup(h(2)), Lookup::Miss);
        assert_eq!(
            events(&mut m),
            vec![KvEventData::Removed {
                seq_hashes: vec![h(2)]
            }]
        );
        assert_eq!(m.free(), 3);
    }

    #[test]
    fn without_prefix_caching_nothing_is_shared_or_reported() {
        let mut m = BlockManager::new(3, false);
        let a = m.store_new(h(1), l(1), None).unwrap();
        m.store_new(h(1), l(1), None).unwrap();
        assert_eq!(m.in_use(), 2);
        assert_eq!(m.cached_prefix(&[h(1)]), 0);
        assert_eq!(m.lookup(h(1)), Lookup::Miss);
        m.release(a);
        assert_eq!((m.in_use(), m.inactive(), m.free()), (1, 0, 2));
        assert!(events(&mut m).is_empty());
    }
}
