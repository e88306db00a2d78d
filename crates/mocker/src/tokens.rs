//! Deterministic output tokens, so two runs (or a run and a test) produce the same streams.
//!
//! A token depends on the model's seed, the request's stream key (its sampling seed, or its
//! id) and its absolute position in the sequence (prompt included), and on nothing about
//! the engine that produces it: a request resumed elsewhere, its prompt extended by what
//! was generated, continues the same sequence.

use switchyard_core::Token;
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Size of the vocabulary tokens are drawn from.
pub const VOCAB_SIZE: u32 = 32_000;

/// The token at absolute `position` of the stream keyed by `stream_key`.
pub fn token_at(seed: u64, stream_key: u64, position: u32) -> Token {
    let mut key = [0u8; 12];
    key[..8].copy_from_slice(&stream_key.to_le_bytes());
    key[8..].copy_from_slice(&position.to_le_bytes());
    (xxh3_64_with_seed(&key, seed) % u64::from(VOCAB_SIZE)) as Token
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_depend_on_seed_key_and_position() {
        let a: Vec<_> = (0..8).map(|i| token_at(1, 5, i)).collect();
        let b: Vec<_> = (0..8).map(|i| token_at(1, 5, i)).collect();
        assert_eq!(a, b);
        assert_ne!(a, (0..8).map(|i| token_at(2, 5, i)).collect::<Vec<_>>());
        assert_ne!(a, (0..8).map(|i| token_at(1, 6, i)).collect::<Vec<_>>());
        assert_ne!(a, (1..9).map(|i| token_at(1, 5, i)).collect::<Vec<_>>());
        assert!(a.iter().all(|&t| t < VOCAB_SIZE));
    }
}
