//! Sets of small integers as bits: walking a word of worker slots, and the tree's free node
//! ids.

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

/// A set of free ids that hands out the lowest first, so that nodes allocated one after
/// another (a chain stored by one event) take consecutive ids wherever the freed ids form a
/// run, and a chain freed together is reused together. Two levels of bits: one per id, and
/// one per word of those saying whether it has any set.
#[derive(Debug, Clone, Default)]
pub(crate) struct LowestFirst {
    words: Vec<u64>,
    summary: Vec<u64>,
    /// No summary word below this one has a bit set.
    low: usize,
    len: usize,
}

impl LowestFirst {
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Adds `id`; it must not be in the set already.
    pub(crate) fn insert(&mut self, id: u32) {
        let w = id as usize / 64;
        if w >= self.words.len() {
            self.words.resize(w + 1, 0);
            self.summary.resize(w / 64 + 1, 0);
        }
        debug_assert!(self.words[w] & (1 << (id % 64)) == 0, "id {id} freed twice");
        self.words[w] |= 1 << (id % 64);
        self.summary[w / 64] |= 1 << (w % 64);
        self.low = self.low.min(w / 64);
        self.len += 1;
    }

    /// Removes and returns the lowest id.
    pub(crate) fn pop_lowest(&mut self) -> Option<u32> {
        if self.len == 0 {
            return None;
        }
        while self.summary[self.low] == 0 {
            self.low += 1;
        }
        let w = self.low * 64 + self.summary[self.low].trailing_zeros() as usize;
        let bit = self.words[w].trailing_zeros();
        self.words[w] &= !(1 << bit);
        if self.words[w] == 0 {
            self.summary[self.low] &= !(1 << (w % 64));
        }
        self.len -= 1;
        Some(w as u32 * 64 + bit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn yields_every_set_bit_lowest_first(word: u64) {
            let expected: Vec<u32> = (0..64).filter(|b| word & (1 << b) != 0).collect();
            prop_assert_eq!(Ones(word).collect::<Vec<_>>(), expected);
        }

        #[test]
        fn lowest_first_matches_an_ordered_set(
            ops in proptest::collection::vec((any::<bool>(), 0u32..20_000), 0..400)
        ) {
            let (mut set, mut model) = (LowestFirst::default(), std::collections::BTreeSet::new());
            for (insert, id) in ops {
                if insert {
                    if model.insert(id) {
                        set.insert(id);
                    }
                } else {
                    prop_assert_eq!(set.pop_lowest(), model.pop_first());
                }
                prop_assert_eq!(set.len(), model.len());
            }
            while let Some(id) = model.pop_first() {
                prop_assert_eq!(set.pop_lowest(), Some(id));
            }
            prop_assert_eq!(set.pop_lowest(), None);
        }
    }
}
