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

/// A set of free ids: it hands out the lowest, a given one, or the first of the lowest word
/// of 64 ids that are all free (where a chain of nodes has room to grow into consecutive
/// ids). Bits per id, and per word of those, one saying whether it has any set and one
/// whether all are.
#[derive(Debug, Clone, Default)]
pub(crate) struct FreeIds {
    words: Vec<u64>,
    summary: Vec<u64>,
    /// One bit per word of ids: set when all 64 of its ids are free.
    full: Vec<u64>,
    /// No summary word below this one has a bit set.
    low: usize,
    /// No `full` word below this one has a bit set.
    low_full: usize,
    len: usize,
}

impl FreeIds {
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Adds `id`; it must not be in the set already.
    pub(crate) fn insert(&mut self, id: u32) {
        let w = id as usize / 64;
        if w >= self.words.len() {
            self.words.resize(w + 1, 0);
            self.summary.resize(w / 64 + 1, 0);
            self.full.resize(w / 64 + 1, 0);
        }
        debug_assert!(self.words[w] & (1 << (id % 64)) == 0, "id {id} freed twice");
        self.words[w] |= 1 << (id % 64);
        self.summary[w / 64] |= 1 << (w % 64);
        self.low = self.low.min(w / 64);
        if self.words[w] == u64::MAX {
            self.full[w / 64] |= 1 << (w % 64);
            self.low_full = self.low_full.min(w / 64);
        }
        self.len += 1;
    }

    /// Removes `id` if it is in the set; whether it was.
    pub(crate) fn remove(&mut self, id: u32) -> bool {
        let w = id as usize / 64;
        match self.words.get(w) {
            Some(word) if word & (1 << (id % 64)) != 0 => {}
            _ => return false,
        }
        self.take(w, id % 64);
        true
    }

    /// Removes and returns the first id of the lowest word whose 64 ids are all free, so
    /// that a chain started there has room to grow into consecutive ids.
    pub(crate) fn pop_word(&mut self) -> Option<u32> {
        while self.low_full < self.full.len() && self.full[self.low_full] == 0 {
            self.low_full += 1;
        }
        let f = *self.full.get(self.low_full)?;
        let w = self.low_full * 64 + f.trailing_zeros() as usize;
        self.take(w, 0);
        Some(w as u32 * 64)
    }

    fn take(&mut self, w: usize, bit: u32) {
        self.words[w] &= !(1 << bit);
        self.full[w / 64] &= !(1 << (w % 64));
        if self.words[w] == 0 {
            self.summary[w / 64] &= !(1 << (w % 64));
        }
        self.len -= 1;
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
        self.take(w, bit);
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
        fn free_ids_match_an_ordered_set(
            ops in proptest::collection::vec((0u8..5, 0u32..3_000), 0..400)
        ) {
            let (mut set, mut model) = (FreeIds::default(), std::collections::BTreeSet::new());
            let whole = |model: &std::collections::BTreeSet<u32>| {
                // The first id of the lowest word whose 64 ids are all in the set.
                model
                    .iter()
                    .copied()
                    .filter(|id| id % 64 == 0)
                    .find(|&id| model.range(id..id + 64).count() == 64)
            };
            for (op, id) in ops {
                match op {
                    0 => {
                        if model.insert(id) {
                            set.insert(id);
                        }
                    }
                    // A whole word at once, so that some words are all free.
                    1 => {
                        for id in id / 64 * 64..id / 64 * 64 + 64 {
                            if model.insert(id) {
                                set.insert(id);
                            }
                        }
                    }
                    2 => prop_assert_eq!(set.pop_lowest(), model.pop_first()),
                    3 => prop_assert_eq!(set.remove(id), model.remove(&id)),
                    _ => {
                        let expected = whole(&model);
                        if let Some(first) = expected {
                            model.remove(&first);
                        }
                        prop_assert_eq!(set.pop_word(), expected);
                    }
                }
                prop_assert_eq!(set.len(), model.len());
            }
            while let Some(id) = model.pop_first() {
                prop_assert_eq!(set.pop_lowest(), Some(id));
            }
            prop_assert_eq!(set.pop_lowest(), None);
            prop_assert_eq!(set.pop_word(), None);
        }
    }
}
