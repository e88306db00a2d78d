//! A vocabulary as `llguidance` sees it: the bytes each token stands for, and which ends
//! the sequence.

use std::path::Path;
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

    /// A Hugging Face model directory's vocabulary: its `tokenizer.json`, ending a
    /// sequence with `tokenizer_config.json`'s `eos_token`, else the first `eos_token_id`
    /// of `generation_config.json` or `config.json` (as the frontend reads the same
    /// directory, so both stop on the same token).
    pub fn from_model_dir(dir: &Path) -> Result<Self, String> {
        let read = |name: &str| std::fs::read_to_string(dir.join(name));
        let tokenizer = read("tokenizer.json")
            .map_err(|e| format!("{}: {e}", dir.join("tokenizer.json").display()))?;
        let json = |name: &str| -> Result<Option<serde_json::Value>, String> {
            match read(name) {
                Ok(text) => serde_json::from_str(&text)
                    .map(Some)
                    .map_err(|e| format!("{}: {e}", dir.join(name).display())),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(format!("{}: {e}", dir.join(name).display())),
            }
        };
        let named =
            json("tokenizer_config.json")?.and_then(|config| match config.get("eos_token")? {
                serde_json::Value::String(text) => Some(text.clone()),
                other => Some(other.get("content")?.as_str()?.to_owned()),
            });
        let eos = match named {
            Some(text) => token_id(&tokenizer, &text).ok_or_else(|| {
                format!(
                    "{}: its eos_token `{text}` is not a token of tokenizer.json",
                    dir.join("tokenizer_config.json").display()
                )
            })?,
            None => ["generation_config.json", "config.json"]
                .into_iter()
                .map(json)
                .collect::<Result<Vec<_>, _>>()?
                .into_iter()
                .flatten()
                .find_map(|config| first_id(config.get("eos_token_id")?))
                .ok_or_else(|| {
                    format!(
                        "{} names no end-of-sequence token (eos_token in tokenizer_config.json, or eos_token_id)",
                        dir.display()
                    )
                })?,
        };
        Self::from_tokenizer_json(&tokenizer, eos).map_err(|e| format!("{}: {e}", dir.display()))
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
    token_bytes_of(&json)
}

/// What each token of a parsed `tokenizer.json` spells, by id (a byte-level BPE's `Ġa` is
/// ` a`, a byte-fallback `<0x0A>` a newline); a special token's text is marked by a
/// leading [`SPECIAL_MARK`].
pub fn token_bytes_of(json: &serde_json::Value) -> Result<Vec<Vec<u8>>, String> {
    llguidance::token_bytes_from_tokenizer_json(json).map_err(|e| format!("tokenizer.json: {e}"))
}

/// The byte [`token_bytes_of`] puts before a special token's text (never the first byte of
/// UTF-8 text).
pub const SPECIAL_MARK: u8 = llguidance::toktrie::TokTrie::SPECIAL_TOKEN_MARKER;

/// The id of the token that spells `text` in a `tokenizer.json`: an added token, else a
/// piece of the model's vocabulary (a map for BPE and WordPiece, a list for Unigram).
fn token_id(tokenizer: &str, text: &str) -> Option<Token> {
    let json: serde_json::Value = serde_json::from_str(tokenizer).ok()?;
    let added = json.get("added_tokens").and_then(|a| a.as_array());
    let id = added
        .into_iter()
        .flatten()
        .find(|token| token.get("content").and_then(|c| c.as_str()) == Some(text))
        .and_then(|token| token.get("id")?.as_u64());
    let id = id.or_else(|| match json.get("model")?.get("vocab")? {
        serde_json::Value::Object(map) => map.get(text)?.as_u64(),
        serde_json::Value::Array(pieces) => pieces
            .iter()
            .position(|piece| piece.get(0).and_then(|p| p.as_str()) == Some(text))
            .map(|at| at as u64),
        _ => None,
    })?;
    Token::try_from(id).ok()
}

/// An `eos_token_id` that is an id, or the first of a list of them.
fn first_id(value: &serde_json::Value) -> Option<Token> {
    let id = match value {
        serde_json::Value::Array(ids) => ids.first()?.as_u64()?,
        other => other.as_u64()?,
    };
    Token::try_from(id).ok()
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
