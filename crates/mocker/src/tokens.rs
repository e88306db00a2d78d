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

/// [`token_at`], redrawn (deterministically) while it is one of `banned`, so a request's
/// banned tokens never appear and a resumed request still continues the same sequence.
pub fn token_avoiding(seed: u64, stream_key: u64, position: u32, banned: &[Token]) -> Token {
    let mut token = token_at(seed, stream_key, position);
    let mut draw = 0u64;
    while banned.contains(&token) {
        draw += 1;
        token = token_at(seed, stream_key ^ draw.rotate_right(1), position);
    }
    token
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

    #[test]
    fn banned_tokens_are_redrawn_and_others_kept() {
        let plain: Vec<_> = (0..64).map(|i| token_at(1, 5, i)).collect();
        let banned = [plain[3], plain[10], plain[40]];
        let avoiding: Vec<_> = (0..64).map(|i| token_avoiding(1, 5, i, &banned)).collect();
        for (i, (&p, &a)) in plain.iter().zip(&avoiding).enumerate() {
            if banned.contains(&p) {
                assert!(!banned.contains(&a), "position {i} kept a banned token");
            } else {
                assert_eq!(p, a, "position {i} changed though its token was allowed");
            }
        }
        assert_eq!(
            avoiding,
            (0..64)
                .map(|i| token_avoiding(1, 5, i, &banned))
                .collect::<Vec<_>>()
        );
    }
}
