//! A token sequence cut into fixed-size blocks.
//!
//! Only full blocks are hashed and cacheable; the partial last block is kept apart until
//! enough tokens arrive to fill it (during decode, for instance), at which point it is
//! hashed and joins the chain.
//!
//! [`blocks_for`] is the one way a prompt becomes blocks, for the router, the workers and
//! the simulator alike: the LoRA adapter seeds every hash, and a block covering media
//! placeholders folds the media's content hashes into its local hash, so two different
//! images behind the same placeholder tokens never share cached KV.

use thiserror::Error;

use crate::Token;
use crate::hash::{self, HashSeed, LocalBlockHash, SequenceHash};
use crate::protocol::{MediaSpan, Prompt};

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

/// A prompt that cannot be cut into blocks.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum InvalidPrompt {
    #[error(transparent)]
    BlockSize(#[from] InvalidBlockSize),
    #[error("media span {index} is empty")]
    EmptySpan { index: usize },
    #[error("media span {index} ends at position {end} but the prompt has {len} tokens")]
    SpanOutOfRange { index: usize, end: u64, len: usize },
    #[error("media span {index} starts before the previous one ends")]
    SpansOverlap { index: usize },
}

/// The blocks of a prompt, as every component hashes them: seeded by the prompt's LoRA
/// adapter, with media content folded into the blocks its spans cover.
pub fn blocks_for(prompt: &Prompt, block_size: u32) -> Result<TokenBlocks, InvalidPrompt> {
    let seed = HashSeed::for_lora(prompt.lora.as_deref());
    if prompt.media.is_empty() {
        return Ok(TokenBlocks::new(&prompt.token_ids, block_size, seed)?);
    }
    if block_size == 0 {
        return Err(InvalidBlockSize(block_size).into());
    }
    check_spans(&prompt.media, prompt.token_ids.len())?;
    let tokens = &prompt.token_ids;
    let size = block_size as usize;
    let mut blocks = TokenBlocks {
        block_size,
        seed,
        local_hashes: Vec::with_capacity(tokens.len() / size),
        sequence_hashes: Vec::with_capacity(tokens.len() / size),
        partial: Vec::with_capacity(size),
        partial_media: None,
    };
    let mut spans = prompt.media.iter().peekable();
    let mut chunks = tokens.chunks_exact(size);
    let mut start = 0u64;
    for chunk in chunks.by_ref() {
        let end = start + size as u64;
        let media = media_key(&mut spans, start, end);
        blocks.push_full(chunk, media);
        start = end;
    }
    blocks.partial.extend_from_slice(chunks.remainder());
    if !blocks.partial.is_empty() {
        blocks.partial_media = media_key(&mut spans, start, start + size as u64);
    }
    Ok(blocks)
}

fn check_spans(spans: &[MediaSpan], len: usize) -> Result<(), InvalidPrompt> {
    let mut previous_end = 0;
    for (index, span) in spans.iter().enumerate() {
        if span.length == 0 {
            return Err(InvalidPrompt::EmptySpan { index });
        }
        if span.end() > len as u64 {
            return Err(InvalidPrompt::SpanOutOfRange {
                index,
                end: span.end(),
                len,
            });
        }
        if u64::from(span.offset) < previous_end {
            return Err(InvalidPrompt::SpansOverlap { index });
        }
        previous_end = span.end();
    }
    Ok(())
}

/// The media key of the block covering positions `start..end`: every span overlapping it,
/// with where it starts relative to the block, folded in order. `None` when no span does.
/// Spans ending inside the block are consumed; one running past it stays for the next.
fn media_key<'a>(
    spans: &mut std::iter::Peekable<impl Iterator<Item = &'a MediaSpan>>,
    start: u64,
    end: u64,
) -> Option<u64> {
    let mut key: Option<u64> = None;
    while let Some(span) = spans.peek() {
        if u64::from(span.offset) >= end {
            break;
        }
        let relative = (i128::from(span.offset) - i128::from(start)) as i64;
        let mut bytes = [0u8; 24];
        bytes[..8].copy_from_slice(&key.unwrap_or(0).to_le_bytes());
        bytes[8..16].copy_from_slice(&span.media_hash.to_le_bytes());
        bytes[16..].copy_from_slice(&relative.to_le_bytes());
        key = Some(xxhash_rust::xxh3::xxh3_64_with_seed(
            &bytes,
            hash::DEFAULT_SEED,
        ));
        if span.end() > end {
            break;
        }
        spans.next();
    }
    key
}

/// A token sequence split into full hashed blocks plus a partial tail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenBlocks {
    block_size: u32,
    seed: HashSeed,
    local_hashes: Vec<LocalBlockHash>,
    sequence_hashes: Vec<SequenceHash>,
    partial: Vec<Token>,
    /// Media key of the partial block, folded in when it fills.
    partial_media: Option<u64>,
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
            partial_media: None,
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
            partial_media: None,
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
                let media = self.partial_media.take();
                self.push_full(&full, media);
            }
        }
        let mut chunks = tokens.chunks_exact(size);
        for chunk in chunks.by_ref() {
            self.push_full(chunk, None);
        }
        self.partial.extend_from_slice(chunks.remainder());
        self.local_hashes.len() - before
    }

    fn push_full(&mut self, block: &[Token], media: Option<u64>) {
        let local = match media {
            None => hash::local_block_hash(block, self.seed),
            Some(key) => hash::local_block_hash_with_media(block, key, self.seed),
        };
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

    fn prompt(tokens: Vec<u32>, media: Vec<MediaSpan>) -> Prompt {
        Prompt {
            token_ids: tokens,
            media,
            lora: None,
            text: None,
        }
    }

    fn image(hash: u64, offset: u32, length: u32) -> MediaSpan {
        MediaSpan {
            modality: crate::protocol::Modality::Image,
            media_hash: hash,
            offset,
            length,
        }
    }

    #[test]
    fn text_prompts_hash_as_before_and_lora_changes_every_block() {
        let tokens: Vec<u32> = (1..=10).collect();
        let plain = blocks_for(&prompt(tokens.clone(), vec![]), 4).expect("valid");
        assert_eq!(
            plain,
            TokenBlocks::new(&tokens, 4, HashSeed::default()).expect("valid")
        );
        let mut with_lora = prompt(tokens, vec![]);
        with_lora.lora = Some("sql".into());
        let lora = blocks_for(&with_lora, 4).expect("valid");
        assert_eq!(lora.full_blocks(), 2);
        assert!(
            lora.local_hashes()
                .iter()
                .zip(plain.local_hashes())
                .all(|(a, b)| a != b)
        );
    }

    #[test]
    fn media_changes_exactly_the_blocks_it_covers() {
        // Placeholder tokens are the same for every image; only the media hash differs.
        let tokens: Vec<u32> = vec![1, 2, 3, 4, 9, 9, 9, 9, 9, 9, 5, 6, 7, 8, 10, 11];
        let a = blocks_for(&prompt(tokens.clone(), vec![image(111, 4, 6)]), 4).expect("valid");
        let b = blocks_for(&prompt(tokens.clone(), vec![image(222, 4, 6)]), 4).expect("valid");
        let again = blocks_for(&prompt(tokens.clone(), vec![image(111, 4, 6)]), 4).expect("valid");
        let text = blocks_for(&prompt(tokens, vec![]), 4).expect("valid");
        assert_eq!(a, again, "the same image hashes the same");
        // Block 0 has no media; blocks 1 and 2 hold the image; block 3 is text after it.
        assert_eq!(a.local_hashes()[0], text.local_hashes()[0]);
        assert_ne!(a.local_hashes()[1], b.local_hashes()[1]);
        assert_ne!(a.local_hashes()[2], b.local_hashes()[2]);
        assert_ne!(a.local_hashes()[1], text.local_hashes()[1]);
        assert_eq!(a.local_hashes()[3], b.local_hashes()[3]);
        // ...but its prefix differs, so its sequence hash does too: no shared KV past an image.
        assert_ne!(a.sequence_hashes()[3], b.sequence_hashes()[3]);
        assert_eq!(a.sequence_hashes()[0], b.sequence_hashes()[0]);
    }

    #[test]
    fn media_in_the_partial_block_counts_once_it_fills() {
        let tokens: Vec<u32> = vec![1, 2, 3, 4, 9, 9];
        let mut a = blocks_for(&prompt(tokens.clone(), vec![image(1, 4, 2)]), 4).expect("valid");
        let mut b = blocks_for(&prompt(tokens, vec![image(2, 4, 2)]), 4).expect("valid");
        assert_eq!(a.full_blocks(), 1);
        a.extend(&[7, 7]);
        b.extend(&[7, 7]);
        assert_eq!(a.full_blocks(), 2);
        assert_ne!(a.local_hashes()[1], b.local_hashes()[1]);
    }

    #[test]
    fn the_same_image_elsewhere_in_a_block_is_other_content() {
        let tokens: Vec<u32> = vec![9; 8];
        let early = blocks_for(&prompt(tokens.clone(), vec![image(5, 0, 2)]), 8).expect("valid");
        let late = blocks_for(&prompt(tokens, vec![image(5, 2, 2)]), 8).expect("valid");
        assert_ne!(early.local_hashes()[0], late.local_hashes()[0]);
    }

    #[test]
    fn bad_spans_are_errors() {
        let tokens: Vec<u32> = (0..8).collect();
        let check = |media| blocks_for(&prompt(tokens.clone(), media), 4);
        assert_eq!(
            check(vec![image(1, 6, 4)]),
            Err(InvalidPrompt::SpanOutOfRange {
                index: 0,
                end: 10,
                len: 8
            })
        );
        assert_eq!(
            check(vec![image(1, 0, 4), image(2, 3, 1)]),
            Err(InvalidPrompt::SpansOverlap { index: 1 })
        );
        assert_eq!(
            check(vec![image(1, 0, 0)]),
            Err(InvalidPrompt::EmptySpan { index: 0 })
        );
        assert_eq!(
            blocks_for(&prompt(tokens.clone(), vec![image(1, 0, 1)]), 0),
            Err(InvalidPrompt::BlockSize(InvalidBlockSize(0)))
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

        // With media, two prompts agree on a block exactly when they agree on everything
        // up to and including it: tokens and the media covering it.
        #[test]
        fn media_blocks_match_a_naive_model(
            tokens in proptest::collection::vec(0u32..4, 1..40),
            spans in proptest::collection::vec((0u32..40, 1u32..10, 0u64..3), 0..4),
            other_hash in 0u64..3,
            block_size in 1u32..6,
        ) {
            // Non-overlapping spans inside the prompt, in order.
            let mut media = Vec::new();
            let mut next = 0u32;
            for (gap, len, hash) in spans {
                let offset = next + gap % 5;
                if u64::from(offset) + u64::from(len) > tokens.len() as u64 { break; }
                media.push(image(hash, offset, len));
                next = offset + len;
            }
            let a = blocks_for(&prompt(tokens.clone(), media.clone()), block_size).unwrap();
            let mut changed = media.clone();
            if let Some(first) = changed.first_mut() { first.media_hash = other_hash; }
            let b = blocks_for(&prompt(tokens.clone(), changed.clone()), block_size).unwrap();
            // Naive: what each position holds (token, and the media item and its start).
            let label = |media: &[MediaSpan], p: usize| {
                let m = media.iter().find(|s| (s.offset as usize..s.end() as usize).contains(&p));
                (tokens[p], m.map(|s| (s.media_hash, s.offset)))
            };
            let bs = block_size as usize;
            for i in 0..a.full_blocks() {
                let same = (0..(i + 1) * bs).all(|p| label(&media, p) == label(&changed, p));
                prop_assert_eq!(a.sequence_hashes()[i] == b.sequence_hashes()[i], same);
            }
        }
    }
}
