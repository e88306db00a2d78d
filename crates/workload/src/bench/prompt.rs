//! Prompt text from trace hash ids.
//!
//! Tokenizer assumption: one vocabulary word = one token. Every word of [`VOCABULARY`] is a
//! common lowercase English word that the BPE and SentencePiece tokenizers of current open
//! models (Llama 2/3, Mistral, Qwen 2, GPT-2/4 style) encode as a single token, with or
//! without a leading space, and words are separated by single spaces (which those
//! tokenizers fold into the next word's token). So a prompt of `n` words is about `n`
//! tokens on the completions endpoint; the chat endpoint adds the model's chat template
//! (typically 5–20 tokens). Servers that report `usage` give the exact count, and the
//! report uses theirs.
//!
//! Block `i` of a request is the `block_size` words derived from hash id `i` (and the
//! seed), so requests with equal hash-id prefixes have equal text prefixes: the shared
//! prefixes of the trace hit the server's prefix cache as they would in production. The
//! last block is cut to fit `input_length`.

use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Words that are single tokens for common tokenizers (see the module docs).
pub const VOCABULARY: [&str; 130] = [
    "the", "of", "and", "to", "in", "is", "you", "that", "it", "he", "was", "for", "on", "are",
    "as", "with", "his", "they", "at", "be", "this", "have", "from", "or", "one", "had", "by",
    "word", "but", "not", "what", "all", "were", "we", "when", "your", "can", "said", "there",
    "use", "an", "each", "which", "she", "do", "how", "their", "if", "will", "up", "other",
    "about", "out", "many", "then", "them", "these", "so", "some", "her", "would", "make", "like",
    "him", "into", "time", "has", "look", "two", "more", "write", "go", "see", "number", "no",
    "way", "could", "people", "my", "than", "first", "water", "been", "call", "who", "now", "find",
    "long", "down", "day", "did", "get", "come", "made", "may", "part", "over", "new", "sound",
    "take", "only", "little", "work", "know", "place", "year", "live", "me", "back", "give",
    "most", "very", "after", "thing", "our", "just", "name", "good", "man", "think", "say",
    "great", "where", "help", "through", "much", "before", "line", "right", "too",
];

/// Builds prompts from hash ids; cheap to copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PromptBuilder {
    /// Tokens (words) per hash id.
    pub block_size: u32,
    /// Salts the words, so a new seed gives text no cache has seen.
    pub seed: u64,
}

impl PromptBuilder {
    pub fn new(block_size: u32, seed: u64) -> Self {
        Self {
            block_size: block_size.max(1),
            seed,
        }
    }

    /// A prompt of exactly `input_length` words whose block `i` derives from `hash_ids[i]`.
    /// Should the ids cover fewer tokens than `input_length`, the rest derives from the
    /// last id and the position, so the count is still exact.
    pub fn prompt(&self, hash_ids: &[u64], input_length: u64) -> String {
        let block = u64::from(self.block_size);
        let mut text = String::with_capacity(input_length as usize * 5);
        for position in 0..input_length {
            let index = (position / block) as usize;
            let id = match hash_ids.get(index) {
                Some(&id) => id,
                None => {
                    let last = hash_ids.last().copied().unwrap_or(u64::MAX);
                    last ^ (index as u64).rotate_left(32)
                }
            };
            if position > 0 {
                text.push(' ');
            }
            text.push_str(self.word(id, position % block));
        }
        text
    }

    fn word(&self, id: u64, offset: u64) -> &'static str {
        let mut key = [0u8; 16];
        key[..8].copy_from_slice(&id.to_le_bytes());
        key[8..].copy_from_slice(&offset.to_le_bytes());
        let pick = xxh3_64_with_seed(&key, self.seed) as usize % VOCABULARY.len();
        VOCABULARY[pick]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn word_count_is_the_input_length() {
        let builder = PromptBuilder::new(4, 0);
        for (ids, len) in [(&[1u64, 2, 3][..], 10), (&[1], 4), (&[], 0), (&[7], 9)] {
            let prompt = builder.prompt(ids, len);
            assert_eq!(
                prompt.split(' ').filter(|w| !w.is_empty()).count() as u64,
                len
            );
        }
    }

    #[test]
    fn equal_ids_give_equal_text_and_different_ids_differ() {
        let builder = PromptBuilder::new(16, 0);
        let a = builder.prompt(&[1, 2, 3], 48);
        let b = builder.prompt(&[1, 2, 9], 40);
        let words = |s: &str| s.split(' ').map(str::to_string).collect::<Vec<_>>();
        let (a, b) = (words(&a), words(&b));
        assert_eq!(a[..32], b[..32]);
        assert_ne!(a[32..40], b[32..40]);
        let salted = PromptBuilder::new(16, 1).prompt(&[1, 2, 3], 48);
        assert_ne!(words(&salted), a);
    }

    #[test]
    fn vocabulary_words_are_distinct_lowercase_words() {
        let mut sorted = VOCABULARY.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), VOCABULARY.len());
        assert!(
            VOCABULARY
                .iter()
                .all(|w| w.chars().all(|c| c.is_ascii_lowercase()))
        );
    }
}
