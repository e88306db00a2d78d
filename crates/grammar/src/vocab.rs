//! A vocabulary as `llguidance` sees it: the bytes each token stands for, and which ends
//! the sequence.

use std::sync::Arc;

use switchyard_core::Token;
use switchyard_core::builtin_vocab::{self, Piece, smollm2};
use toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};

/// The bytes of every token of a model's vocabulary, by id; special tokens (which never
/// stand for text) marked as `llguidance` expects, so no grammar allows them as text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vocabulary {
    /// Names the vocabulary: a worker and a frontend agree on what a token means only when
    /// their vocabularies have the same name.
    pub name: String,
    pub tokens: Vec<Vec<u8>>,
    /// The token that ends a sequence (what a finished constraint is followed by).
    pub eos: Token,
}

/// The byte `llguidance` puts before a special token's name.
const SPECIAL: u8 = TokTrie::SPECIAL_TOKEN_MARKER;

impl Vocabulary {
    /// The built-in byte-level vocabulary (`switchyard serve` without model files; see
    /// [`switchyard_core::builtin_vocab`]).
    pub fn builtin() -> Self {
        let tokens = (0..builtin_vocab::VOCAB_SIZE)
            .map(|id| match builtin_vocab::piece(id) {
                Some(Piece::Byte(byte)) => vec![byte],
                Some(Piece::Word(word)) => {
                    let mut bytes = Vec::with_capacity(word.len() + 1);
                    bytes.push(b' ');
                    bytes.extend_from_slice(word.as_bytes());
                    bytes
                }
                Some(Piece::Special(name)) => {
                    let mut bytes = vec![SPECIAL];
                    bytes.extend_from_slice(name.as_bytes());
                    bytes
                }
                None => Vec::new(),
            })
            .collect();
        Vocabulary {
            name: builtin_vocab::NAME.to_owned(),
            tokens,
            eos: builtin_vocab::EOS,
        }
    }

    /// SmolLM2's vocabulary (the default tokenizer of `switchyard serve`; see
    /// [`switchyard_core::builtin_vocab::smollm2`]): its byte-level BPE tokens as bytes,
    /// its special tokens marked, `<|im_end|>` ending a sequence.
    pub fn smollm2() -> Result<Self, String> {
        let vocabulary = Self::from_tokenizer_json(smollm2::TOKENIZER, smollm2::EOS)
            .map_err(|e| format!("SmolLM2's {e}"))?;
        Ok(Vocabulary {
            name: smollm2::NAME.to_owned(),
            ..vocabulary
        })
    }

    /// A Hugging Face `tokenizer.json`'s vocabulary (byte-level BPE or with byte
    /// fallback), named by [`fingerprint`] of its tokens, `eos` ending a sequence.
    pub fn from_tokenizer_json(tokenizer: &str, eos: Token) -> Result<Self, String> {
        let tokens = token_bytes(tokenizer)?;
        if eos as usize >= tokens.len() {
            return Err(format!(
                "its end-of-sequence token {eos} is past its {} tokens",
                tokens.len()
            ));
        }
        Ok(Vocabulary {
            name: fingerprint(&tokens),
            tokens,
            eos,
        })
    }

    /// The vocabulary as `llguidance` takes it.
    pub(crate) fn env(&self) -> TokEnv {
        let info = TokRxInfo::new(self.tokens.len() as u32, self.eos);
        Arc::new(Env {
            trie: TokTrie::from(&info, &self.tokens),
        })
    }
}

/// Names a vocabulary by what its tokens spell: `xxh3:` and the XXH3-64 of every token's
/// length and bytes, in id order. Two tokenizers whose tokens spell the same bytes get the
/// same name, whatever files they came from.
pub fn fingerprint(tokens: &[Vec<u8>]) -> String {
    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    for token in tokens {
        hasher.update(&(token.len() as u32).to_le_bytes());
        hasher.update(token);
    }
    format!("xxh3:{:016x}", hasher.digest())
}

/// The name of a `tokenizer.json`'s vocabulary ([`fingerprint`]), if `llguidance` reads it.
pub fn name_of_tokenizer_json(tokenizer: &str) -> Option<String> {
    token_bytes(tokenizer)
        .ok()
        .map(|tokens| fingerprint(&tokens))
}

/// What each token of a `tokenizer.json` spells, special tokens marked.
fn token_bytes(tokenizer: &str) -> Result<Vec<Vec<u8>>, String> {
    let json: serde_json::Value =
        serde_json::from_str(tokenizer).map_err(|e| format!("tokenizer.json: {e}"))?;
    llguidance::token_bytes_from_tokenizer_json(&json).map_err(|e| format!("tokenizer.json: {e}"))
}

/// A vocabulary whose text is split greedily (longest token first): `llguidance` needs a
/// tokenizer only for text a grammar forces, and told the split is not canonical, it lets
/// the model choose how to spell it.
struct Env {
    trie: TokTrie,
}

impl TokenizerEnv for Env {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, bytes: &[u8]) -> Vec<TokenId> {
        self.trie.greedy_tokenize(bytes)
    }

    fn tokenize_is_canonical(&self) -> bool {
        false
    }
}
