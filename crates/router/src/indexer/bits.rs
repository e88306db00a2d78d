//! Walking the set bits of a word of worker slots.

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
    }
}
