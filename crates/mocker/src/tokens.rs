//! Deterministic output tokens, so two runs (or a run and a test) produce the same streams.

use switchyard_core::{RequestId, Token};
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Size of the vocabulary tokens are drawn from.
pub const VOCAB_SIZE: u32 = 32_000;

/// The `index`-th output token of a request.
pub fn token_at(seed: u64, request: RequestId, index: u32) -> Token {
    let mut key = [0u8; 12];
    key[..8].copy_from_slice(&request.0.to_le_bytes());
    key[8..].copy_from_slice(&index.to_le_bytes());
    (xxh3_64_with_seed(&key, seed) % u64::from(VOCAB_SIZE)) as Token
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_depend_on_seed_request_and_index() {
        let a: Vec<_> = (0..8).map(|i| token_at(1, RequestId(5), i)).collect();
        let b: Vec<_> = (0..8).map(|i| token_at(1, RequestId(5), i)).collect();
        assert_eq!(a, b);
        assert_ne!(
            a,
            (0..8)
                .map(|i| token_at(2, RequestId(5), i))
                .collect::<Vec<_>>()
        );
        assert_ne!(
            a,
            (0..8)
                .map(|i| token_at(1, RequestId(6), i))
                .collect::<Vec<_>>()
        );
        assert!(a.iter().all(|&t| t < VOCAB_SIZE));
    }
}
