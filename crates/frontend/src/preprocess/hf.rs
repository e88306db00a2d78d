//! A Hugging Face `tokenizer.json`, loaded offline with the `tokenizers` crate.

use std::collections::HashSet;
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use tokenizers::Tokenizer;

use super::error::PreprocessError;

/// How a prompt should get special tokens (BOS/EOS) beyond those already in its text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SpecialTokenPolicy {
    /// The tokenizer's own post-processor decides (tokenizer_config.json said nothing).
    PostProcessor,
    /// tokenizer_config.json's `add_bos_token` / `add_eos_token` decide, as the slow
    /// tokenizers of Llama-family models do; `None` means the model has no such token.
    Explicit { bos: Option<u32>, eos: Option<u32> },
}

/// Real vocabularies stay below a few hundred thousand ids; a larger id means a broken file,
/// and would make the id table below needlessly large.
const MAX_VOCAB_SIZE: u32 = 1 << 24;

pub(crate) struct HfTokenizer {
    tokenizer: Tokenizer,
    path: PathBuf,
    /// Ids of added tokens flagged special: decoding skips them, as `skip_special_tokens`.
    special_ids: HashSet<u32>,
    /// One past the largest id, model vocabulary and added tokens together.
    vocab_size: u32,
    /// Which ids below `vocab_size` exist (a vocabulary may have holes).
    known_ids: Vec<bool>,
    plain_prompt_policy: SpecialTokenPolicy,
    /// The fewest input bytes per token, as a divisor, when it is known (see
    /// [`super::bytes_bound`]).
    bytes_per_token: Option<u64>,
    /// What each token spells, by id (special ones marked as `switchyard_grammar` marks
    /// them); empty when `llguidance` cannot read the file.
    token_bytes: Vec<Vec<u8>>,
}

impl fmt::Debug for HfTokenizer {
    // The derived form would print the whole vocabulary.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HfTokenizer")
            .field("path", &self.path)
            .field("vocab_size", &self.vocab_size)
            .field("special_ids", &self.special_ids.len())
            .field("plain_prompt_policy", &self.plain_prompt_policy)
            .finish()
    }
}

impl HfTokenizer {
    /// Reads and parses `path` (a `tokenizer.json`).
    pub(crate) fn load(path: &Path) -> Result<Self, PreprocessError> {
        let json = std::fs::read_to_string(path).map_err(|source| PreprocessError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&json, path)
    }

    /// Parses a `tokenizer.json` read from `path` (named in errors).
    pub(crate) fn parse(json: &str, path: &Path) -> Result<Self, PreprocessError> {
        let tokenizer = Tokenizer::from_str(json).map_err(|error| PreprocessError::Tokenizer {
            path: path.to_owned(),
            message: error.to_string(),
        })?;
        let special_ids = tokenizer
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, token)| token.special)
            .map(|(id, _)| id)
            .collect();
        let parsed: Option<serde_json::Value> = serde_json::from_str(json).ok();
        let bytes_per_token = parsed.as_ref().and_then(|json| {
            let longest = super::bytes_bound::longest_token(json, &tokenizer);
            super::bytes_bound::bytes_per_token(json, longest)
        });
        let token_bytes = parsed
            .as_ref()
            .and_then(|json| switchyard_grammar::vocab::token_bytes_of(json).ok())
            .unwrap_or_default();
        let ids: Vec<u32> = tokenizer.get_vocab(true).into_values().collect();
        let Some(max_id) = ids.iter().copied().max() else {
            return Err(PreprocessError::Tokenizer {
                path: path.to_owned(),
                message: "the vocabulary is empty".into(),
            });
        };
        if max_id >= MAX_VOCAB_SIZE {
            return Err(PreprocessError::Tokenizer {
                path: path.to_owned(),
                message: format!("token id {max_id} is beyond the supported {MAX_VOCAB_SIZE}"),
            });
        }
        let vocab_size = max_id + 1;
        let mut known_ids = vec![false; vocab_size as usize];
        for id in ids {
            if let Some(known) = known_ids.get_mut(id as usize) {
                *known = true;
            }
        }
        Ok(Self {
            tokenizer,
            path: path.to_owned(),
            special_ids,
            vocab_size,
            known_ids,
            plain_prompt_policy: SpecialTokenPolicy::PostProcessor,
            bytes_per_token,
            token_bytes,
        })
    }

    /// The fewest tokens a text of `bytes` bytes can take, when that is known.
    pub(crate) fn fewest_tokens(&self, bytes: usize) -> Option<u64> {
        self.bytes_per_token.map(|per| bytes as u64 / per)
    }

    pub(crate) fn set_plain_prompt_policy(&mut self, policy: SpecialTokenPolicy) {
        self.plain_prompt_policy = policy;
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    pub(crate) fn vocab_size(&self) -> u32 {
        self.vocab_size
    }

    pub(crate) fn token_to_id(&self, token: &str) -> Option<u32> {
        self.tokenizer.token_to_id(token)
    }

    /// What token `id` spells, as bytes (a special token's text as it is written); `None`
    /// outside the vocabulary or when the file's tokens could not be read.
    pub(crate) fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        let bytes = self.token_bytes.get(id as usize)?;
        Some(match bytes.split_first() {
            Some((&switchyard_grammar::vocab::SPECIAL_MARK, text)) => text,
            _ => bytes,
        })
    }

    pub(crate) fn is_special(&self, id: u32) -> bool {
        self.special_ids.contains(&id)
    }

    /// Fails for ids the tokenizer does not know, which `tokenizers` would drop silently.
    pub(crate) fn check_id(&self, id: u32) -> Result<(), PreprocessError> {
        if self.known_ids.get(id as usize).copied().unwrap_or(false) {
            Ok(())
        } else {
            Err(PreprocessError::UnknownToken {
                id,
                vocab_size: self.vocab_size,
            })
        }
    }

    /// Text that went through a chat template: the template already wrote every special token
    /// the model expects (as text the tokenizer recognises), so none is added, as in
    /// `transformers`' `apply_chat_template` and vLLM's chat endpoint.
    pub(crate) fn encode_templated(&self, text: &str) -> Result<Vec<u32>, PreprocessError> {
        self.encode_raw(text, false)
    }

    /// A plain prompt (no template): gets BOS/EOS as the tokenizer config says.
    pub(crate) fn encode_plain(&self, text: &str) -> Result<Vec<u32>, PreprocessError> {
        match self.plain_prompt_policy {
            SpecialTokenPolicy::PostProcessor => self.encode_raw(text, true),
            SpecialTokenPolicy::Explicit { bos, eos } => {
                let ids = self.encode_raw(text, false)?;
                let mut out = Vec::with_capacity(ids.len() + 2);
                // A prompt that spells out its own BOS keeps just that one.
                if let Some(bos) = bos.filter(|&bos| ids.first() != Some(&bos)) {
                    out.push(bos);
                }
                out.extend(ids);
                out.extend(eos);
                Ok(out)
            }
        }
    }

    fn encode_raw(
        &self,
        text: &str,
        add_special_tokens: bool,
    ) -> Result<Vec<u32>, PreprocessError> {
        self.tokenizer
            .encode_fast(text, add_special_tokens)
            .map(|encoding| encoding.get_ids().to_vec())
            .map_err(|error| PreprocessError::Encode(error.to_string()))
    }

    /// Decodes with special tokens skipped. Ids are checked first: `tokenizers` would drop
    /// unknown ones without a word.
    pub(crate) fn decode(&self, tokens: &[u32]) -> Result<String, PreprocessError> {
        for &id in tokens {
            self.check_id(id)?;
        }
        self.decode_known(tokens)
    }

    /// Decodes ids already checked with [`Self::check_id`].
    /// Decodes a sequence keeping its special tokens (`<|im_start|>`, ...) as text.
    pub(crate) fn decode_with_special(&self, tokens: &[u32]) -> Result<String, PreprocessError> {
        for &id in tokens {
            self.check_id(id)?;
        }
        self.tokenizer
            .decode(tokens, false)
            .map_err(|error| PreprocessError::Decode(error.to_string()))
    }

    /// The vocabulary's piece for `id`.
    pub(crate) fn piece(&self, id: u32) -> Option<String> {
        self.tokenizer.id_to_token(id)
    }

    pub(crate) fn decode_known(&self, tokens: &[u32]) -> Result<String, PreprocessError> {
        self.tokenizer
            .decode(tokens, true)
            .map_err(|error| PreprocessError::Decode(error.to_string()))
    }
}
