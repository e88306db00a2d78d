//! Preprocessing: chat templates, tokenization and incremental detokenization.
//!
//! A [`Preprocessor`] is either built in ([`Preprocessor::builtin`]: a byte-level tokenizer
//! and a simple chat template, so `switchyard serve` needs no model files) or read from a
//! Hugging Face model directory ([`Preprocessor::from_dir`]: `tokenizer.json` through the
//! `tokenizers` crate, the Jinja chat template through minijinja with Python compatibility).
//!
//! Layout:
//! - `builtin`: the built-in vocabulary's tokenizer (the vocabulary itself is
//!   `switchyard_core::builtin_vocab`).
//! - `hf`: the Hugging Face tokenizer; `hf_stream` its incremental decoder.
//! - `utf8_stream`: lossy UTF-8 decoding of a byte stream that arrives in pieces.
//! - `decoder`: [`IncrementalDecoder`], one per response stream.
//! - `template`: [`ChatMessage`] and the chat templates.
//! - `config_files`, `model_dir`: reading a model directory.
//! - `error`: [`PreprocessError`].

mod builtin;
mod bytes_bound;
mod config_files;
mod decoder;
mod error;
mod hf;
mod hf_stream;
mod model_dir;
mod template;
mod utf8_stream;

use std::path::Path;
use std::sync::Arc;

pub use builtin::{BUILTIN_BOS, BUILTIN_EOS, BUILTIN_VOCAB_SIZE};
pub use decoder::IncrementalDecoder;
pub use error::PreprocessError;
pub use template::{ChatMessage, TemplateFunction, TemplateToolCall};

use builtin::BuiltinTokenizer;
use hf::HfTokenizer;
use hf_stream::HfStream;
use switchyard_core::builtin_vocab::{self, smollm2};
use template::ChatTemplate;

/// SmolLM2-135M-Instruct's tokenizer files (see `switchyard_core::builtin_vocab::smollm2`).
const SMOLLM2: model_dir::EmbeddedModel<'static> = model_dir::EmbeddedModel {
    label: "<built-in smollm2>",
    tokenizer: smollm2::TOKENIZER,
    tokenizer_config: smollm2::TOKENIZER_CONFIG,
    config: smollm2::CONFIG,
};

/// The name of a `tokenizer.json`'s vocabulary (what its tokens spell, fingerprinted), as
/// engines that enforce constraints over it name it.
fn vocabulary_of(tokenizer: &str) -> Option<String> {
    switchyard_grammar::vocab::name_of_tokenizer_json(tokenizer)
}

/// Turns chat messages into prompt tokens and generated tokens back into text for one model.
/// Immutable once built: share it behind an `Arc`.
#[derive(Debug)]
pub struct Preprocessor {
    tokenizer: Tokenizer,
    template: ChatTemplate,
    eos_token_ids: Vec<u32>,
    context_length: u32,
    /// The name of its vocabulary, when workers may know it too (a built-in one, or one
    /// named by what its tokens spell).
    vocabulary: Option<String>,
}

#[derive(Debug)]
enum Tokenizer {
    Builtin(BuiltinTokenizer),
    Hf(Arc<HfTokenizer>),
}

impl Preprocessor {
    /// No model files: the built-in byte-level tokenizer and a simple chat template.
    /// `context_length` is taken as given (the config loader validates it).
    pub fn builtin(context_length: u32) -> Self {
        Self {
            tokenizer: Tokenizer::Builtin(BuiltinTokenizer),
            template: ChatTemplate::Simple,
            eos_token_ids: vec![BUILTIN_EOS],
            context_length,
            vocabulary: Some(builtin_vocab::NAME.to_owned()),
        }
    }

    /// SmolLM2's tokenizer and chat template, built into the binary (a 49,152-token
    /// byte-level BPE, Apache-2.0): prompts count as many tokens as on a real model, with
    /// no model files. `context_length` overrides the model's 8,192.
    pub fn smollm2(context_length: Option<u32>) -> Result<Self, PreprocessError> {
        let files = model_dir::load_embedded(&SMOLLM2, context_length)?;
        Ok(Self {
            tokenizer: Tokenizer::Hf(Arc::new(files.tokenizer)),
            template: files.template,
            eos_token_ids: files.eos_token_ids,
            context_length: files.context_length,
            vocabulary: Some(smollm2::NAME.to_owned()),
        })
    }

    /// A model's files given as text (`tokenizer.json`, `tokenizer_config.json` with its
    /// chat template, `config.json`), as read from elsewhere than a directory (a GGUF
    /// file's metadata); `label` names their source in errors.
    pub fn from_files(
        label: &str,
        tokenizer: &str,
        tokenizer_config: &str,
        config: &str,
        context_length: Option<u32>,
    ) -> Result<Self, PreprocessError> {
        let files = model_dir::load_embedded(
            &model_dir::EmbeddedModel {
                label,
                tokenizer,
                tokenizer_config,
                config,
            },
            context_length,
        )?;
        Ok(Self {
            tokenizer: Tokenizer::Hf(Arc::new(files.tokenizer)),
            template: files.template,
            eos_token_ids: files.eos_token_ids,
            context_length: files.context_length,
            vocabulary: vocabulary_of(tokenizer),
        })
    }

    /// A Hugging Face model directory: `tokenizer.json` (required), `tokenizer_config.json`
    /// (chat template, special tokens, `add_bos_token`...; optional), `chat_template.jinja` or
    /// `chat_template.json` (a template that overrides tokenizer_config.json's; optional),
    /// `config.json` (the context length, from `max_position_embeddings` or its equivalents;
    /// optional), `generation_config.json` (more EOS ids; optional). `context_length`
    /// overrides the files; without it, a directory that declares no context length is an
    /// error. Reads the files once; nothing is fetched from the network.
    pub fn from_dir(dir: &Path, context_length: Option<u32>) -> Result<Self, PreprocessError> {
        let files = model_dir::load(dir, context_length)?;
        let tokenizer = std::fs::read_to_string(dir.join("tokenizer.json")).unwrap_or_default();
        Ok(Self {
            tokenizer: Tokenizer::Hf(Arc::new(files.tokenizer)),
            template: files.template,
            eos_token_ids: files.eos_token_ids,
            context_length: files.context_length,
            vocabulary: vocabulary_of(&tokenizer),
        })
    }

    /// Renders the chat template over the messages, ending with the prompt for the
    /// assistant's turn (`add_generation_prompt`). A template that rejects the messages
    /// (`raise_exception`) gives [`PreprocessError::TemplateRaised`] with its message.
    pub fn render_chat(&self, messages: &[ChatMessage]) -> Result<String, PreprocessError> {
        self.template.render(messages, &[], true)
    }

    /// [`Self::render_chat`] with tools (OpenAI tool objects) for a template that lays them
    /// out itself ([`Self::template_handles_tools`]), and with the assistant turn's opening
    /// or not.
    pub fn render_chat_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: &[serde_json::Value],
        add_generation_prompt: bool,
    ) -> Result<String, PreprocessError> {
        self.template.render(messages, tools, add_generation_prompt)
    }

    /// A token's own piece of the vocabulary (`Ġhello` in a byte-level BPE), or its text
    /// for the built-in tokenizer; `None` outside the vocabulary.
    pub fn token_piece(&self, id: u32) -> Option<String> {
        match &self.tokenizer {
            Tokenizer::Builtin(tokenizer) => tokenizer.decode(&[id]).ok(),
            Tokenizer::Hf(tokenizer) => tokenizer.piece(id),
        }
    }

    /// What token `id` spells, as bytes (a byte-level BPE's `Ġhello` is ` hello`; a special
    /// token's text as written); `None` outside the vocabulary.
    pub fn token_bytes(&self, id: u32) -> Option<Vec<u8>> {
        match &self.tokenizer {
            Tokenizer::Builtin(tokenizer) => match tokenizer.piece(id).ok()? {
                builtin::BuiltinPiece::Byte(byte) => Some(vec![byte]),
                builtin::BuiltinPiece::Special => Some(Vec::new()),
                builtin::BuiltinPiece::Word(word) => Some(format!(" {word}").into_bytes()),
            },
            Tokenizer::Hf(tokenizer) => tokenizer
                .token_bytes(id)
                .map(<[u8]>::to_vec)
                .or_else(|| tokenizer.piece(id).map(String::into_bytes)),
        }
    }

    /// Whether the chat template reads a `tools` variable.
    pub fn template_handles_tools(&self) -> bool {
        self.template.handles_tools()
    }

    /// The chat template's source, when it is a Jinja template.
    pub fn template_source(&self) -> Option<&str> {
        self.template.source()
    }

    /// This preprocessor with the chat template in `path` (`--chat-template FILE`) instead
    /// of the model's, keeping the model's special tokens.
    pub fn with_chat_template(mut self, path: &Path) -> Result<Self, PreprocessError> {
        let source = std::fs::read_to_string(path).map_err(|source| PreprocessError::Read {
            path: path.to_owned(),
            source,
        })?;
        self.template = self.template.replaced(source, path)?;
        Ok(self)
    }

    /// Tokenizes a prompt that already went through the chat template. No special token is
    /// added: templates write the ones their model expects (`{{ bos_token }}`, ...) into the
    /// text, and the tokenizer recognises them there; adding more would double the BOS.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, PreprocessError> {
        match &self.tokenizer {
            Tokenizer::Builtin(tokenizer) => Ok(tokenizer.encode(text)),
            Tokenizer::Hf(tokenizer) => tokenizer.encode_templated(text),
        }
    }

    /// Tokenizes a raw prompt that did not go through a chat template (`/v1/completions`):
    /// it gets the special tokens the model puts around plain text (usually a BOS), as
    /// `add_bos_token` / `add_eos_token` in tokenizer_config.json or else the tokenizer's
    /// post-processor say. A prompt that starts with the BOS text keeps just that one. For
    /// the built-in tokenizer this is [`encode`](Self::encode).
    pub fn encode_completion_prompt(&self, text: &str) -> Result<Vec<u32>, PreprocessError> {
        match &self.tokenizer {
            Tokenizer::Builtin(tokenizer) => Ok(tokenizer.encode(text)),
            Tokenizer::Hf(tokenizer) => tokenizer.encode_plain(text),
        }
    }

    /// Decodes a whole sequence, skipping special tokens (as the incremental decoder does).
    pub fn decode(&self, tokens: &[u32]) -> Result<String, PreprocessError> {
        match &self.tokenizer {
            Tokenizer::Builtin(tokenizer) => tokenizer.decode(tokens),
            Tokenizer::Hf(tokenizer) => tokenizer.decode(tokens),
        }
    }

    /// Renders tokens back to the text they came from, special tokens included (for
    /// engines that take a prompt as text).
    pub fn render_tokens(&self, tokens: &[u32]) -> Result<String, PreprocessError> {
        match &self.tokenizer {
            Tokenizer::Builtin(tokenizer) => tokenizer.decode(tokens),
            Tokenizer::Hf(tokenizer) => tokenizer.decode_with_special(tokens),
        }
    }

    /// A fresh incremental decoder for one response stream, skipping special tokens.
    pub fn decoder(&self) -> IncrementalDecoder {
        self.decoder_keeping_special(None)
    }

    /// [`Self::decoder`], with special tokens decoded as text when `keep_special` says,
    /// except the ones it lists (the built-in tokenizer's are always skipped).
    pub fn decoder_keeping_special(&self, keep_special: Option<Vec<u32>>) -> IncrementalDecoder {
        match &self.tokenizer {
            Tokenizer::Builtin(_) => IncrementalDecoder::builtin(),
            Tokenizer::Hf(tokenizer) => {
                IncrementalDecoder::hf(HfStream::new(Arc::clone(tokenizer), keep_special))
            }
        }
    }

    /// Token ids that end generation, for the engines' `stop_token_ids`: tokenizer_config's
    /// `eos_token`, then any other `eos_token_id` of config.json and generation_config.json.
    /// May be empty for a model directory that names none.
    pub fn eos_token_ids(&self) -> &[u32] {
        &self.eos_token_ids
    }

    pub fn context_length(&self) -> u32 {
        self.context_length
    }

    /// The name of its vocabulary when workers may know it too (a built-in one): a
    /// worker enforcing constraints over token ids must be in the same vocabulary.
    pub fn vocabulary(&self) -> Option<&str> {
        self.vocabulary.as_deref()
    }

    /// One past the largest token id: every id the tokenizer knows is below it.
    pub fn vocab_size(&self) -> u32 {
        match &self.tokenizer {
            Tokenizer::Builtin(_) => BUILTIN_VOCAB_SIZE,
            Tokenizer::Hf(tokenizer) => tokenizer.vocab_size(),
        }
    }

    /// The fewest tokens a prompt of `bytes` bytes can take at any tokenization, when the
    /// tokenizer says (see `bytes_bound`): a longer prompt is refused before it is
    /// tokenized. The built-in tokenizer makes one token of each byte.
    pub fn fewest_tokens(&self, bytes: usize) -> Option<u64> {
        match &self.tokenizer {
            Tokenizer::Builtin(_) => Some(bytes as u64),
            Tokenizer::Hf(tokenizer) => tokenizer.fewest_tokens(bytes),
        }
    }

    /// Whether token `id` is special (BOS, EOS, chat markers): it decodes to nothing.
    pub fn is_special_token(&self, id: u32) -> bool {
        match &self.tokenizer {
            Tokenizer::Builtin(_) => id == BUILTIN_BOS || id == BUILTIN_EOS,
            Tokenizer::Hf(tokenizer) => tokenizer.is_special(id),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync>() {}
    fn assert_send<T: Send>() {}

    #[test]
    fn shareable_across_tasks() {
        assert_send_sync::<Preprocessor>();
        assert_send::<IncrementalDecoder>();
    }

    #[test]
    fn builtin_basics() {
        let preprocessor = Preprocessor::builtin(2048);
        assert_eq!(preprocessor.context_length(), 2048);
        assert_eq!(preprocessor.vocab_size(), 32_000);
        assert_eq!(preprocessor.eos_token_ids(), &[257]);
        assert_eq!(preprocessor.encode("hé").ok(), Some(vec![104, 0xC3, 0xA9]));
        assert!(preprocessor.is_special_token(256) && !preprocessor.is_special_token(258));
    }

    #[test]
    fn smollm2_counts_like_a_real_model() {
        let preprocessor = Preprocessor::smollm2(None).unwrap();
        assert_eq!(preprocessor.context_length(), 8192);
        assert_eq!(preprocessor.vocab_size(), 49_152);
        // <|im_end|> ends a chat turn.
        assert_eq!(preprocessor.eos_token_ids(), &[2]);
        assert_eq!(
            preprocessor.encode("Hello, world!").unwrap(),
            vec![19556, 28, 905, 17]
        );
        // Digits split one by one, as SmolLM2's pre-tokenizer does.
        assert_eq!(preprocessor.encode("12345").unwrap().len(), 5);
        let prose = "The quick brown fox jumps over the lazy dog while the farmer watches \
                     from the porch, wondering whether the weather will hold until evening.";
        let tokens = preprocessor.encode(prose).unwrap();
        assert!(tokens.len() * 4 < prose.len(), "{} tokens", tokens.len());
        assert_eq!(preprocessor.decode(&tokens).unwrap(), prose);
        let chat = preprocessor
            .render_chat(&[ChatMessage::new("user", "hi")])
            .unwrap();
        assert!(
            chat.ends_with("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"),
            "{chat}"
        );
        let ids = preprocessor.encode(&chat).unwrap();
        assert_eq!(
            ids.iter().filter(|&&t| t == 1).count(),
            3,
            "one <|im_start|> per turn"
        );
        assert_eq!(
            Preprocessor::smollm2(Some(32_768))
                .unwrap()
                .context_length(),
            32_768
        );
    }
}
