//! The built-in vocabularies, so `switchyard serve` runs without model files: the frontend
//! tokenizes and detokenizes with them, and the mocker's constrained draws know what each
//! of their tokens spells. This module is the byte-level one; [`smollm2`] holds SmolLM2's
//! (the default).
//!
//! Ids 0..=255 are the bytes 0x00..=0xFF, so any text round-trips exactly. 256 and 257 are
//! the special `<|bos|>` and `<|eos|>`, which spell nothing. Every id from 258 up spells a
//! common English word with a leading space ([`words::WORDS`], cycled through), so the
//! mocker's uniformly drawn ids read as words.

pub mod smollm2;
pub mod words;

use words::WORDS;

/// Names the vocabulary: workers and frontends agree on what its tokens mean.
pub const NAME: &str = "switchyard-builtin-32000";
/// Size of the vocabulary: valid ids are `0..VOCAB_SIZE`.
pub const VOCAB_SIZE: u32 = 32_000;
/// Beginning of sequence (special).
pub const BOS: u32 = 256;
/// End of sequence (special); the built-in stop token.
pub const EOS: u32 = 257;
/// The first id that spells a word.
pub const FIRST_WORD: u32 = 258;

/// What one token spells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Piece {
    Byte(u8),
    /// A special token, by name; it spells no text.
    Special(&'static str),
    /// A word, spelled with a space before it.
    Word(&'static str),
}

/// What token `id` spells; none beyond the vocabulary.
pub fn piece(id: u32) -> Option<Piece> {
    if let Ok(byte) = u8::try_from(id) {
        return Some(Piece::Byte(byte));
    }
    match id {
        BOS => Some(Piece::Special("<|bos|>")),
        EOS => Some(Piece::Special("<|eos|>")),
        FIRST_WORD..VOCAB_SIZE => {
            let index = (id - FIRST_WORD) as usize % WORDS.len();
            WORDS.get(index).map(|&word| Piece::Word(word))
        }
        _ => None,
    }
}
