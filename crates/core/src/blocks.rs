//! A token sequence cut into fixed-size blocks.
//!
//! Only full blocks are hashed and cacheable; the partial last block is kept apart until
//! enough tokens arrive to fill it (during decode, for instance), at which point it is
//! hashed and joins the chain.

use thiserror::Error;

use crate::Token;
use crate::hash::{self, HashSeed, LocalBlockHash, SequenceHash};

/// A block size that cannot be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[error("block size must be at least 1 token, got {0}")]
pub struct InvalidBlockSize(pub u32);

/// Parts that do not make a valid [`TokenBlocks`].
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum InvalidBlocks {
    #[error(transparent)]
    BlockSize(#[from] InvalidBlockSize),
    #[error("{local} local hashes but {sequence} sequence hashes")]
    HashCounts { local: usize, sequence: usize },
    #[error("a partial block of {tokens} tokens does not fit blocks of {block_size}")]
    PartialTooLong { tokens: usize, block_size: u32 },
}

/// A token sequence split into full hashed blocks plus a partial tail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenBlocks {
    block_size: u32,
    seed: HashSeed,
    local_hashes: Vec<LocalBlockHash>,
    sequence_hashes: Vec<SequenceHash>,
    partial: Vec<Token>,
}

impl TokenBlocks {
    /// Splits `tokens` into blocks of `block_size` tokens hashed under `seed`.
    pub fn new(
        tokens: &[Token],
        block_size: u32,
        seed: HashSeed,
    ) -> Result<Self, InvalidBlockSize> {
        if block_size == 0 {
            return Err(InvalidBlockSize(block_size));
        }
        let mut blocks = TokenBlocks {
            block_size,
            seed,
            local_hashes: Vec::with_capacity(tokens.len() / block_size as usize),
            sequence_hashes: Vec::with_capacity(tokens.len() / block_size as usize),
            partial: Vec::with_capacity(block_size as usize),
        };
        blocks.extend(tokens);
        Ok(blocks)
    }

    /// Rebuilds a sequence from already-hashed full blocks and the tokens of its partial
    /// last block, as when a trace gives block hashes but no tokens.
    pub fn from_parts(
        block_size: u32,
        seed: HashSeed,
        local_hashes: Vec<LocalBlockHash>,
        sequence_hashes: Vec<SequenceHash>,
        partial: Vec<Token>,
    ) -> Result<Self, InvalidBlocks> {
        if block_size == 0 {
            return Err(InvalidBlocks::BlockSize(InvalidBlockSize(block_size)));
        }
        if local_hashes.len() != sequence_hashes.len() {
            return Err(InvalidBlocks::HashCounts {
                local: local_hashes.len(),
                sequence: sequence_hashes.len(),
            });
        }
        if partial.len() >= block_size as usize {
            return Err(InvalidBlocks::PartialTooLong {
                tokens: partial.len(),
                block_size,
            });
        }
        Ok(TokenBlocks {
            block_size,
            seed,
            local_hashes,
            sequence_hashes,
            partial,
        })
    }

    /// Appends tokens, hashing every block they complete. Returns how many blocks completed.
    pub fn extend(&mut self, mut tokens: &[Token]) -> usize {
        let size = self.block_size as usize;
        let before = self.local_hashes.len();
        if !self.partial.is_empty() {
            let take = (size - self.partial.len()).min(tokens.len());
            self.partial.extend_from_slice(&tokens[..take]);
            tokens = &tokens[take..];
            if self.partial.len() == size {
                let full = std::mem::take(&mut self.partial);
                self.push_full(&full);
            }
        }
        let mut chunks = tokens.chunks_exact(size);
        for chunk in chunks.by_ref() {
            self.push_full(chunk);
        }
        self.partial.extend_from_slice(chunks.remainder());
        self.local_hashes.len() - before
    }

    fn push_full(&mut self, block: &[Token]) {
        let local = hash::local_block_hash(block, self.seed);
        let seq = hash::sequence_hash(self.sequence_hashes.last().copied(), local);
        self.local_hashes.push(local);
        self.sequence_hashes.push(seq);
    }

    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    /// Local hashes of the full blocks, in order.
    pub fn local_hashes(&self) -> &[LocalBlockHash] {
        &self.local_hashes
    }

    /// Sequence hashes of the full blocks, in order.
    pub fn sequence_hashes(&self) -> &[SequenceHash] {
        &self.sequence_hashes
    }

    /// Tokens of the last, not yet full, block.
    pub fn partial_tokens(&self) -> &[Token] {
        &self.partial
    }

    /// Number of full blocks.
    pub fn full_blocks(&self) -> usize {
        self.local_hashes.len()
    }

    /// Number of blocks the sequence occupies, counting a non-empty partial block.
    pub fn total_blocks(&self) -> usize {
        self.local_hashes.len() + usize::from(!self.partial.is_empty())
    }

    /// Total number of tokens seen.
    pub fn total_tokens(&self) -> usize {
        self.local_hashes.len() * self.block_size as usize + self.partial.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn partial_tail_is_kept_apart() {
        let blocks = TokenBlocks::new(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 4, HashSeed::default())
            .expect("valid block size");
        assert_eq!(blocks.full_blocks(), 2);
        assert_eq!(blocks.total_blocks(), 3);
        assert_eq!(blocks.partial_tokens(), &[9, 10]);
        assert_eq!(blocks.total_tokens(), 10);
        assert_eq!(
            blocks.local_hashes()[0],
            LocalBlockHash(14643705804678351452)
        );
        assert_eq!(
            blocks.sequence_hashes()[1],
            SequenceHash(4945711292740353085)
        );
    }

    #[test]
    fn from_parts_continues_like_the_original() {
        let tokens: Vec<u32> = (0..23).collect();
        let whole = TokenBlocks::new(&tokens, 4, HashSeed::default()).expect("valid");
        let mut rebuilt = TokenBlocks::from_parts(
            4,
            HashSeed::default(),
            whole.local_hashes().to_vec(),
            whole.sequence_hashes().to_vec(),
            whole.partial_tokens().to_vec(),
        )
        .expect("valid parts");
        let mut extended = whole.clone();
        assert_eq!(rebuilt.extend(&[100, 101, 102]), 1);
        extended.extend(&[100, 101, 102]);
        assert_eq!(rebuilt, extended);
        assert!(
            TokenBlocks::from_parts(4, HashSeed::default(), vec![], vec![], vec![1, 2, 3, 4])
                .is_err()
        );
        assert!(
            TokenBlocks::from_parts(
                4,
                HashSeed::default(),
                vec![LocalBlockHash(1)],
                vec![],
                vec![]
            )
            .is_err()
        );
    }

    #[test]
    fn zero_block_size_is_rejected() {
        assert_eq!(
            TokenBlocks::new(&[1], 0, HashSeed::default()),
            Err(InvalidBlockSize(0))
        );
    }

    proptest! {
        // Feeding tokens in arbitrary pieces gives the same blocks as all at once.
        #[test]
        fn extend_in_pieces_equals_whole(
            tokens in proptest::collection::vec(0u32..50_000, 0..200),
            cuts in proptest::collection::vec(0usize..200, 0..8),
            block_size in 1u32..9,
        ) {
            let whole = TokenBlocks::new(&tokens, block_size, HashSeed::default()).unwrap();
            let mut pieces = TokenBlocks::new(&[], block_size, HashSeed::default()).unwrap();
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(tokens.len())).collect();
            cuts.sort_unstable();
            let mut start = 0;
            for cut in cuts.into_iter().chain(std::iter::once(tokens.len())) {
                pieces.extend(&tokens[start..cut]);
                start = cut;
            }
            prop_assert_eq!(&pieces, &whole);
            prop_assert_eq!(whole.full_blocks(), tokens.len() / block_size as usize);
            prop_assert_eq!(whole.partial_tokens().len(), tokens.len() % block_size as usize);
            let expected = hash::sequence_hashes(whole.local_hashes());
            prop_assert_eq!(whole.sequence_hashes(), expected.as_slice());
        }
    }
}
