//! What can go wrong while loading a model's tokenizer files or preprocessing a request.

use std::path::PathBuf;

/// Errors from loading model files (`from_dir`) name the file and what is wrong with it, so an
/// operator can fix the file; errors from requests say what the request did.
#[derive(Debug, thiserror::Error)]
pub enum PreprocessError {
    #[error("model directory {}: {problem}", path.display())]
    ModelDir {
        path: PathBuf,
        problem: &'static str,
    },

    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("{}: malformed JSON: {source}", path.display())]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },

    /// Well-formed JSON with a field of the wrong shape or an inconsistent value.
    #[error("{}: {message}", path.display())]
    InvalidFile { path: PathBuf, message: String },

    /// `tokenizer.json` parsed as JSON but is not a tokenizer the `tokenizers` crate accepts.
    #[error("{}: not a usable Hugging Face tokenizer: {message}", path.display())]
    Tokenizer { path: PathBuf, message: String },

    #[error("{}: the chat template does not compile: {message}", path.display())]
    TemplateSyntax { path: PathBuf, message: String },

    #[error(
        "{}: cannot tell the model's context length (config.json gives none of {keys}); \
         set the context length explicitly",
        dir.display()
    )]
    UnknownContextLength { dir: PathBuf, keys: String },

    #[error("the context length must be at least 1 token")]
    ZeroContextLength,

    /// The template called `raise_exception(message)`: it rejects these messages (for example
    /// roles that do not alternate). The request is at fault, not the model files.
    #[error("{0}")]
    TemplateRaised(String),

    /// The template failed while rendering (a template bug, or messages it cannot handle).
    #[error("the chat template failed: {0}")]
    TemplateRender(String),

    #[error("tokenization failed: {0}")]
    Encode(String),

    #[error("detokenization failed: {0}")]
    Decode(String),

    #[error("token id {id} is not in the vocabulary (size {vocab_size})")]
    UnknownToken { id: u32, vocab_size: u32 },
}
