//! A worker's table of sequence hash → node: open addressing in one array of 16-byte slots.
//!
//! Ingestion inserts one entry per stored block and removes one per removed block, in a
//! table far larger than the caches; each operation is a cache miss. A `HashMap` keeps its
//! control bytes apart from its slots, so an operation touches two lines; here the key and
//! the node share a slot, and with linear probing at most half full, an operation touches
//! one line, rarely two. Removal shifts the following entries back instead of leaving
//! tombstones, so lookups never probe past stale slots.

use switchyard_core::SequenceHash;

use super::tree::NodeId;

/// `Slot::node` of an empty slot (node ids are below 2^31).
const EMPTY: NodeId = NodeId::MAX;
/// The fewest slots a table with entries has.
const MIN_SLOTS: usize = 16;

#[derive(Debug, Clone, Copy)]
struct Slot {
    key: u64,
    node: NodeId,
}

const VACANT: Slot = Slot {
    key: 0,
    node: EMPTY,
};

#[derive(Debug, Clone, Default)]
pub(crate) struct HashTable {
    slots: Vec<Slot>,
    len: usize,
}

impl HashTable {
    #[cfg(test)]
    fn len(&self) -> usize {
        self.len
    }

    /// Where `key`'s probe starts: Fibonacci hashing (engines' hashes need not be
    /// uniform in their low bits).
    #[inline]
    fn home(&self, key: u64) -> usize {
        let bits = self.slots.len().trailing_zeros();
        (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - bits)) as usize
    }

    /// The slot holding `key`, or the empty slot where its probe ends.
    #[inline]
    fn find(&self, key: u64) -> Result<usize, usize> {
        let mask = self.slots.len() - 1;
        let mut i = self.home(key);
        loop {
            let slot = self.slots[i];
            if slot.node == EMPTY {
                return Err(i);
            }
            if slot.key == key {
                return Ok(i);
            }
            i = (i + 1) & mask;
        }
    }

    #[inline]
    pub(crate) fn get(&self, key: SequenceHash) -> Option<NodeId> {
        if self.len == 0 {
            return None;
        }
        self.find(key.0).ok().map(|i| self.slots[i].node)
    }

    pub(crate) fn contains_key(&self, key: SequenceHash) -> bool {
        self.get(key).is_some()
    }

    /// Maps `key` to `node`; returns the node it mapped to before.
    pub(crate) fn insert(&mut self, key: SequenceHash, node: NodeId) -> Option<NodeId> {
        debug_assert!(node != EMPTY);
        if 2 * (self.len + 1) > self.slots.len() {
            self.grow();
        }
        match self.find(key.0) {
            Ok(i) => Some(std::mem::replace(&mut self.slots[i].node, node)),
            Err(i) => {
                self.slots[i] = Slot { key: key.0, node };
                self.len += 1;
                None
            }
        }
    }

    pub(crate) fn remove(&mut self, key: SequenceHash) -> Option<NodeId> {
        if self.len == 0 {
            return None;
        }
        let mut hole = self.find(key.0).ok()?;
        let node = self.slots[hole].node;
        self.len -= 1;
        // Shift back each following entry whose probe passes the hole, so that no probe
        // meets an empty slot before its key.
        let mask = self.slots.len() - 1;
        let mut i = hole;
        loop {
            i = (i + 1) & mask;
            let slot = self.slots[i];
            if slot.node == EMPTY {
                break;
            }
            let home = self.home(slot.key);
            // The entry may move to the hole when the hole lies on its probe: cyclically
            // from its home up to where it is.
            if (i.wrapping_sub(home) & mask) >= (i.wrapping_sub(hole) & mask) {
                self.slots[hole] = slot;
                hole = i;
            }
        }
        self.slots[hole] = VACANT;
        Some(node)
    }

    /// Removes every entry, keeping the memory.
    pub(crate) fn clear(&mut self) {
        if self.len > 0 {
            self.slots.fill(VACANT);
            self.len = 0;
        }
    }

    fn grow(&mut self) {
        let size = (self.slots.len() * 2).max(MIN_SLOTS);
        let old = std::mem::replace(&mut self.slots, vec![VACANT; size]);
        for slot in old {
            if slot.node != EMPTY
                && let Err(i) = self.find(slot.key)
            {
                self.slots[i] = slot;
            }
        }
    }

    /// Every entry, in no particular order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (SequenceHash, NodeId)> + '_ {
        self.slots
            .iter()
            .filter(|s| s.node != EMPTY)
            .map(|s| (SequenceHash(s.key), s.node))
    }

    pub(crate) fn keys(&self) -> impl Iterator<Item = SequenceHash> + '_ {
        self.iter().map(|(k, _)| k)
    }

    pub(crate) fn values(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.iter().map(|(_, v)| v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    proptest! {
        /// The table behaves like a map, through growth and removals that shift entries,
        /// with keys crowded into few homes (small integers) or spread.
        #[test]
        fn behaves_like_a_map(
            ops in proptest::collection::vec((0u8..3, 0u64..64, 0u32..1000), 0..600),
            spread in any::<bool>(),
        ) {
            let (mut table, mut model) = (HashTable::default(), HashMap::new());
            for (op, k, node) in ops {
                let key = SequenceHash(if spread { k.wrapping_mul(0x2545_F491_4F6C_DD1D) } else { k });
                match op {
                    0 | 1 => prop_assert_eq!(table.insert(key, node), model.insert(key, node)),
                    _ => prop_assert_eq!(table.remove(key), model.remove(&key)),
                }
                prop_assert_eq!(table.len(), model.len());
                for k in 0..64u64 {
                    let key = SequenceHash(if spread { k.wrapping_mul(0x2545_F491_4F6C_DD1D) } else { k });
                    prop_assert_eq!(table.get(key), model.get(&key).copied());
                }
            }
            let mut entries: Vec<_> = table.iter().collect();
            entries.sort_unstable();
            let mut expected: Vec<_> = model.into_iter().collect();
            expected.sort_unstable();
            prop_assert_eq!(entries, expected);
        }
    }

    #[test]
    fn stays_at_most_half_full() {
        let mut table = HashTable::default();
        for k in 0..10_000u64 {
            table.insert(SequenceHash(k), k as NodeId);
            assert!(2 * table.len() <= table.slots.len());
        }
        for k in 0..10_000u64 {
            assert_eq!(table.remove(SequenceHash(k)), Some(k as NodeId));
        }
        assert_eq!(table.len(), 0);
        assert_eq!(table.get(SequenceHash(3)), None);
        let slots = table.slots.len();
        table.insert(SequenceHash(3), 1);
        table.clear();
        assert_eq!((table.len(), table.get(SequenceHash(3))), (0, None));
        assert_eq!(table.slots.len(), slots, "cleared, not shrunk");
    }
}
