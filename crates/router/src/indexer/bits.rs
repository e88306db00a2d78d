//! A growable bitset of dense worker slots, inline up to 256 workers.
//!
//! Tree nodes keep the set of workers that hold them as bits so that the match walk
//! intersects worker sets a word at a time instead of hashing worker ids.

use smallvec::SmallVec;

const INLINE_WORDS: usize = 4;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct WorkerBits {
    words: SmallVec<[u64; INLINE_WORDS]>,
}

impl WorkerBits {
    pub(crate) fn contains(&self, slot: u32) -> bool {
        let (word, bit) = split(slot);
        self.words.get(word).is_some_and(|w| w & bit != 0)
    }

    /// Sets the bit; returns whether it was clear.
    pub(crate) fn insert(&mut self, slot: u32) -> bool {
        let (word, bit) = split(slot);
        if self.words.len() <= word {
            self.words.resize(word + 1, 0);
        }
        let was_clear = self.words[word] & bit == 0;
        self.words[word] |= bit;
        was_clear
    }

    /// Clears the bit; returns whether it was set.
    pub(crate) fn remove(&mut self, slot: u32) -> bool {
        let (word, bit) = split(slot);
        match self.words.get_mut(word) {
            Some(w) if *w & bit != 0 => {
                *w &= !bit;
                true
            }
            _ => false,
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.words.iter().all(|&w| w == 0)
    }

    pub(crate) fn words(&self) -> &[u64] {
        &self.words
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.words
            .iter()
            .enumerate()
            .flat_map(|(i, &w)| Ones(w).map(move |b| (i as u32) * 64 + b))
    }
}

/// The positions of the set bits of a word, lowest first.
pub(crate) struct Ones(pub(crate) u64);

impl Iterator for Ones {
    type Item = u32;

    fn next(&mut self) -> Option<u32> {
        if self.0 == 0 {
            return None;
        }
        let bit = self.0.trailing_zeros();
        self.0 &= self.0 - 1;
        Some(bit)
    }
}

fn split(slot: u32) -> (usize, u64) {
    ((slot / 64) as usize, 1u64 << (slot % 64))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    proptest! {
        #[test]
        fn behaves_like_a_set(ops in proptest::collection::vec((any::<bool>(), 0u32..700), 0..200)) {
            let mut bits = WorkerBits::default();
            let mut model = BTreeSet::new();
            for (insert, slot) in ops {
                if insert {
                    prop_assert_eq!(bits.insert(slot), model.insert(slot));
                } else {
                    prop_assert_eq!(bits.remove(slot), model.remove(&slot));
                }
                prop_assert_eq!(bits.is_empty(), model.is_empty());
            }
            prop_assert_eq!(bits.iter().collect::<Vec<_>>(), model.iter().copied().collect::<Vec<_>>());
            for slot in 0..700 {
                prop_assert_eq!(bits.contains(slot), model.contains(&slot));
            }
        }
    }
}
