//! Block hashing compatible with Dynamo's router.
//!
//! A block's *local hash* covers only its own tokens, so a frontend can hash the blocks of a
//! prompt independently. A block's *sequence hash* chains the local hashes of every block up
//! to and including it, so it names a whole prefix: `seq[0] = local[0]`,
//! `seq[i] = xxh3(seq[i-1].to_le_bytes() ‖ local[i].to_le_bytes())`.

use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::Token;

/// The seed Dynamo uses for block hashing when no LoRA adapter is involved.
pub const DEFAULT_SEED: u64 = 1337;

/// Hash of one block's tokens, independent of what precedes it.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct LocalBlockHash(pub u64);

/// Hash naming a block together with its whole prefix.
///
/// Engines may publish their own sequence hashes (vLLM does); the indexer treats them as
/// opaque per-worker identifiers and only Switchyard's own components rely on the chained
/// definition above.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct SequenceHash(pub u64);

/// The seed of the local block hash. Blocks hashed under different LoRA adapters never match,
/// because the adapter's KV cache differs from the base model's for the same tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct HashSeed(pub u64);

impl Default for HashSeed {
    fn default() -> Self {
        HashSeed(DEFAULT_SEED)
    }
}

impl HashSeed {
    /// The seed for requests served by `lora_name`, or the base seed for `None`.
    ///
    /// The adapter name is hashed under the base seed; the result is the seed.
    pub fn for_lora(lora_name: Option<&str>) -> HashSeed {
        match lora_name {
            None => HashSeed::default(),
            Some(name) => HashSeed(xxh3_64_with_seed(name.as_bytes(), DEFAULT_SEED)),
        }
    }
}

/// Local hash of one block of tokens.
pub fn local_block_hash(tokens: &[Token], seed: HashSeed) -> LocalBlockHash {
    LocalBlockHash(xxh3_64_with_seed(token_bytes(tokens).as_ref(), seed.0))
}

/// Local hash of a block that covers media: its tokens, then the media key (see
/// [`crate::blocks::blocks_for`]). Differs from the plain hash of the same tokens.
pub fn local_block_hash_with_media(tokens: &[Token], media: u64, seed: HashSeed) -> LocalBlockHash {
    let mut hasher = xxhash_rust::xxh3::Xxh3::with_seed(seed.0);
    hasher.update(token_bytes(tokens).as_ref());
    hasher.update(&media.to_le_bytes());
    LocalBlockHash(hasher.digest())
}

/// Sequence hash of a block given its parent's sequence hash (`None` for the first block).
pub fn sequence_hash(parent: Option<SequenceHash>, local: LocalBlockHash) -> SequenceHash {
    match parent {
        None => SequenceHash(local.0),
        Some(parent) => {
            let mut bytes = [0u8; 16];
            bytes[..8].copy_from_slice(&parent.0.to_le_bytes());
            bytes[8..].copy_from_slice(&local.0.to_le_bytes());
            SequenceHash(xxh3_64_with_seed(&bytes, DEFAULT_SEED))
        }
    }
}

/// Sequence hashes for a chain of local hashes starting at the root.
pub fn sequence_hashes(locals: &[LocalBlockHash]) -> Vec<SequenceHash> {
    let mut out = Vec::with_capacity(locals.len());
    let mut parent = None;
    for &local in locals {
        let seq = sequence_hash(parent, local);
        out.push(seq);
        parent = Some(seq);
    }
    out
}

/// The little-endian byte image of a token slice, borrowed where the platform allows it.
fn token_bytes(tokens: &[Token]) -> std::borrow::Cow<'_, [u8]> {
    if cfg!(target_endian = "little") {
        std::borrow::Cow::Borrowed(bytemuck::cast_slice(tokens))
    } else {
        std::borrow::Cow::Owned(tokens.iter().flat_map(|t| t.to_le_bytes()).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Vectors from ARCHITECTURE.md (block size 4), shared with Dynamo.
    #[test]
    fn dynamo_vectors() {
        let seed = HashSeed::default();
        let a = local_block_hash(&[1, 2, 3, 4], seed);
        let b = local_block_hash(&[5, 6, 7, 8], seed);
        assert_eq!(a, LocalBlockHash(14643705804678351452));
        assert_eq!(b, LocalBlockHash(16777012769546811212));
        let seqs = sequence_hashes(&[a, b]);
        assert_eq!(seqs[0], SequenceHash(a.0));
        assert_eq!(seqs[1], SequenceHash(4945711292740353085));
    }

    #[test]
    fn lora_changes_seed_and_hash() {
        let base = HashSeed::for_lora(None);
        let lora = HashSeed::for_lora(Some("sql-adapter"));
        let other = HashSeed::for_lora(Some("chat-adapter"));
        assert_eq!(base, HashSeed(DEFAULT_SEED));
        assert_ne!(lora, base);
        assert_ne!(lora, other);
        let tokens = [1, 2, 3, 4];
        assert_ne!(
            local_block_hash(&tokens, base),
            local_block_hash(&tokens, lora)
        );
        assert_eq!(
            local_block_hash(&tokens, lora),
            local_block_hash(&tokens, lora)
        );
    }

    #[test]
    fn sequence_hash_depends_on_prefix() {
        let seed = HashSeed::default();
        let x = local_block_hash(&[9, 9, 9, 9], seed);
        let a = local_block_hash(&[1, 2, 3, 4], seed);
        let b = local_block_hash(&[5, 6, 7, 8], seed);
        let after_a = sequence_hashes(&[a, x])[1];
        let after_b = sequence_hashes(&[b, x])[1];
        assert_ne!(after_a, after_b);
    }
}
