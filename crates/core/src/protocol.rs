//! The engine protocol: what a frontend sends a worker, and what streams back.
//!
//! A [`GenerateRequest`] carries a [`Prompt`] (tokens, media spans, LoRA adapter), sampling
//! options and what kind of work it is: a whole generation, a generation resumed on another
//! worker after the first one failed ([`Resume`]), a prefill-only pass that leaves its KV
//! blocks for a decode worker, or a decode that starts from such blocks ([`Phase`]). The
//! response is a stream of [`GenerateOutput`] items ending with `Finished`; failures are
//! [`EngineError`]s, which say whether trying another worker can help.

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::hash::SequenceHash;
use crate::worker::WorkerKey;
use crate::{RequestId, Token};

/// The kind of media a span of the prompt holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Modality {
    Image,
    Audio,
    Video,
}

impl Modality {
    pub fn name(self) -> &'static str {
        match self {
            Modality::Image => "image",
            Modality::Audio => "audio",
            Modality::Video => "video",
        }
    }
}

/// A set of modalities: what an encoder worker encodes. Empty stands for every one (an
/// encoder that has not said). Written as a list (`["image", "video"]`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(from = "Vec<Modality>", into = "Vec<Modality>")]
pub struct Modalities(u8);

impl Modalities {
    const EVERY: [Modality; 3] = [Modality::Image, Modality::Audio, Modality::Video];

    fn bit(m: Modality) -> u8 {
        match m {
            Modality::Image => 1,
            Modality::Audio => 2,
            Modality::Video => 4,
        }
    }

    /// Whether it takes `m` (an empty set takes every modality).
    pub fn contains(self, m: Modality) -> bool {
        self.0 == 0 || self.0 & Self::bit(m) != 0
    }

    /// Whether it takes every modality.
    pub fn is_all(&self) -> bool {
        Self::EVERY.iter().all(|&m| self.contains(m))
    }
}

impl From<Vec<Modality>> for Modalities {
    fn from(list: Vec<Modality>) -> Self {
        Modalities(list.into_iter().fold(0, |bits, m| bits | Self::bit(m)))
    }
}

impl From<Modalities> for Vec<Modality> {
    fn from(set: Modalities) -> Self {
        if set.0 == 0 {
            return Vec::new();
        }
        Modalities::EVERY
            .into_iter()
            .filter(|&m| set.contains(m))
            .collect()
    }
}

/// A media item in a prompt: its embeddings take the `length` placeholder positions from
/// `offset`. `media_hash` names the item's content (decoded pixels or samples and the
/// preprocessing settings), so two different images never share cached KV and the same one
/// twice does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MediaSpan {
    pub modality: Modality,
    pub media_hash: u64,
    pub offset: u32,
    pub length: u32,
}

impl MediaSpan {
    /// One past the last position the span covers.
    pub fn end(&self) -> u64 {
        u64::from(self.offset) + u64::from(self.length)
    }

    /// Where a prompt's media start and how many positions they take in all; none
    /// without media.
    pub fn extent(spans: &[MediaSpan]) -> Option<(u32, u32)> {
        let first = spans.iter().map(|m| m.offset).min()?;
        Some((first, spans.iter().map(|m| m.length).sum()))
    }
}

/// What an encoder computes a media item's embeddings from: the item as the frontend
/// prepared it. Carried by `encode` requests, one per media span, in the spans' order.
/// The buffers are shared, so cloning a request does not copy them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum MediaInput {
    /// RGB squares `side` pixels a side, 3 bytes a pixel row by row, one square after
    /// another: an image's tiles (and overview), or a video's kept frames.
    Squares { side: u32, rgb: bytes::Bytes },
    /// Log-mel windows of `bins` rows of `frames` values (f32, little-endian), one window
    /// after another.
    Mel {
        bins: u32,
        frames: u32,
        values: bytes::Bytes,
    },
    /// An item's embeddings as its encoder computed them: `tokens` rows of `dim` values
    /// (f32, little-endian), one row after another. Carried by requests to LLM workers that
    /// merge media embeddings into the sequence they prefill (`media_embeddings` in their
    /// registration), one per media span; and by an encoder's answer.
    Embeddings {
        tokens: u32,
        dim: u32,
        values: bytes::Bytes,
    },
}

/// Why a [`MediaInput`]'s buffer does not hold what it is read as.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum InvalidMedia {
    #[error("the media input is not embeddings")]
    NotEmbeddings,
    #[error("{bytes} bytes are not {tokens} embedding rows of {dim} values")]
    EmbeddingRows {
        bytes: usize,
        tokens: usize,
        dim: usize,
    },
    #[error("{bytes} bytes are not a whole number of {what} of {unit} bytes")]
    Units {
        bytes: usize,
        what: &'static str,
        unit: usize,
    },
}

impl MediaInput {
    /// Embeddings of `dim` values a row (`values.len() / dim` rows).
    pub fn embeddings(dim: u32, values: &[f32]) -> Self {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        MediaInput::Embeddings {
            tokens: (values.len() / dim.max(1) as usize) as u32,
            dim,
            values: bytes.into(),
        }
    }

    /// The rows of [`MediaInput::Embeddings`]: (rows, dim, values); an error for other
    /// inputs, or when the buffer does not hold `tokens` rows of `dim` values.
    pub fn embedding_rows(&self) -> Result<(usize, usize, Vec<f32>), InvalidMedia> {
        let MediaInput::Embeddings {
            tokens,
            dim,
            values,
        } = self
        else {
            return Err(InvalidMedia::NotEmbeddings);
        };
        let (tokens, dim) = (*tokens as usize, *dim as usize);
        if tokens == 0 || dim == 0 || values.len() != tokens * dim * 4 {
            return Err(InvalidMedia::EmbeddingRows {
                bytes: values.len(),
                tokens,
                dim,
            });
        }
        let rows = values
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        Ok((tokens, dim, rows))
    }

    /// Squares from separate buffers.
    pub fn squares(side: u32, squares: &[Vec<u8>]) -> Self {
        MediaInput::Squares {
            side,
            rgb: squares.concat().into(),
        }
    }

    /// Log-mel windows from separate buffers.
    pub fn mel(bins: u32, frames: u32, windows: &[Vec<f32>]) -> Self {
        let values: Vec<u8> = windows
            .iter()
            .flatten()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        MediaInput::Mel {
            bins,
            frames,
            values: values.into(),
        }
    }

    /// The units an encoder batches: squares, or windows; an error when the buffer is not
    /// a whole number of them.
    pub fn units(&self) -> Result<usize, InvalidMedia> {
        let (unit, len, what) = match self {
            MediaInput::Squares { side, rgb } => (
                *side as usize * *side as usize * 3,
                rgb.len(),
                "RGB squares",
            ),
            MediaInput::Mel {
                bins,
                frames,
                values,
            } => (
                *bins as usize * *frames as usize * 4,
                values.len(),
                "mel windows",
            ),
            MediaInput::Embeddings { dim, values, .. } => {
                (*dim as usize * 4, values.len(), "embedding rows")
            }
        };
        if unit == 0 || len % unit != 0 {
            return Err(InvalidMedia::Units {
                bytes: len,
                what,
                unit,
            });
        }
        Ok(len / unit)
    }
}

/// A prompt as engines and the router see it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Prompt {
    pub token_ids: Vec<Token>,
    /// Media spans, in order, not overlapping.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub media: Vec<MediaSpan>,
    /// The LoRA adapter serving the request; its name seeds the block hashes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lora: Option<String>,
    /// The prompt as text, special tokens included, for engines that take text (an
    /// OpenAI-compatible upstream); frontends fill it in for workers that ask for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
}

impl Prompt {
    /// A text prompt on the base model.
    pub fn tokens(token_ids: Vec<Token>) -> Self {
        Prompt {
            token_ids,
            media: Vec::new(),
            lora: None,
            text: None,
        }
    }

    pub fn len(&self) -> usize {
        self.token_ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.token_ids.is_empty()
    }
}

/// Sampling options passed through to the engine.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SamplingParams {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    #[serde(default)]
    pub top_k: Option<u32>,
    pub seed: Option<u64>,
    /// Generation stops after any of these tokens (which are included in the output).
    #[serde(default)]
    pub stop_token_ids: Vec<Token>,
    /// OpenAI's penalties, in [-2, 2].
    #[serde(default)]
    pub frequency_penalty: Option<f32>,
    #[serde(default)]
    pub presence_penalty: Option<f32>,
    /// Additive biases on token logits, in [-100, 100], sorted by token; -100 bans a token.
    #[serde(default)]
    pub logit_bias: Vec<(Token, f32)>,
    /// What the answer must be (structured output); only workers that enforce its kind
    /// get the request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub constraint: Option<Constraint>,
    /// The name of the vocabulary the request's token ids are in, when the frontend knows
    /// one (an engine enforcing a constraint over token ids needs to know what they spell).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vocabulary: Option<String>,
    /// Report each generated token's log probability, and the `n` likeliest tokens' at
    /// each step (0: the generated token's only; see [`TokenLogprobs`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<u32>,
    /// Report the prompt's log probabilities too: each prompt token's after the first,
    /// with the `n` likeliest tokens' at its position ([`GenerateOutput::PromptLogprobs`]).
    /// An engine computes the whole prompt for them (its cached prefix has no logits).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_logprobs: Option<u32>,
}

/// What an engine may generate for a request: an answer it ends with `stop` is in the
/// constraint's language (one cut by its token budget ends with `length`). Enforced by
/// masking every step's tokens; the grammar's end is the answer's end.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Constraint {
    /// Any JSON object.
    JsonObject,
    /// A JSON value valid under this JSON Schema (its JSON text).
    JsonSchema(String),
    /// Text that this regular expression matches in full (Rust `regex` syntax).
    Regex(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
    /// Text in the language of this grammar, in the Lark syntax of `llguidance`.
    Grammar(String),
}

impl Constraint {
    pub fn kind(&self) -> ConstraintKind {
        match self {
            Constraint::JsonObject => ConstraintKind::JsonObject,
            Constraint::JsonSchema(_) => ConstraintKind::JsonSchema,
            Constraint::Regex(_) => ConstraintKind::Regex,
            Constraint::Choice(_) => ConstraintKind::Choice,
            Constraint::Grammar(_) => ConstraintKind::Grammar,
        }
    }
}

/// The kinds of [`Constraint`], as a worker states which it enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConstraintKind {
    JsonObject,
    JsonSchema,
    Regex,
    Choice,
    Grammar,
}

impl ConstraintKind {
    pub const ALL: [ConstraintKind; 5] = [
        ConstraintKind::JsonObject,
        ConstraintKind::JsonSchema,
        ConstraintKind::Regex,
        ConstraintKind::Choice,
        ConstraintKind::Grammar,
    ];

    fn bit(self) -> u8 {
        1 << (self as u8)
    }

    pub fn name(self) -> &'static str {
        match self {
            ConstraintKind::JsonObject => "json_object",
            ConstraintKind::JsonSchema => "json_schema",
            ConstraintKind::Regex => "regex",
            ConstraintKind::Choice => "choice",
            ConstraintKind::Grammar => "grammar",
        }
    }
}

/// The constraint kinds a worker enforces (on the wire, a list of their names).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "Vec<ConstraintKind>", into = "Vec<ConstraintKind>")]
pub struct ConstraintKinds(u8);

impl ConstraintKinds {
    pub const NONE: ConstraintKinds = ConstraintKinds(0);

    pub fn all() -> Self {
        ConstraintKind::ALL.into_iter().collect()
    }

    pub fn contains(self, kind: ConstraintKind) -> bool {
        self.0 & kind.bit() != 0
    }

    pub fn is_empty(&self) -> bool {
        self.0 == 0
    }
}

impl FromIterator<ConstraintKind> for ConstraintKinds {
    fn from_iter<I: IntoIterator<Item = ConstraintKind>>(kinds: I) -> Self {
        ConstraintKinds(kinds.into_iter().fold(0, |bits, kind| bits | kind.bit()))
    }
}

impl From<Vec<ConstraintKind>> for ConstraintKinds {
    fn from(kinds: Vec<ConstraintKind>) -> Self {
        kinds.into_iter().collect()
    }
}

impl From<ConstraintKinds> for Vec<ConstraintKind> {
    fn from(kinds: ConstraintKinds) -> Self {
        ConstraintKind::ALL
            .into_iter()
            .filter(|&kind| kinds.contains(kind))
            .collect()
    }
}

impl SamplingParams {
    /// Tokens the request bans (a bias of -100), which an engine must never produce.
    pub fn banned_tokens(&self) -> impl Iterator<Item = Token> + '_ {
        self.logit_bias
            .iter()
            .filter(|&&(_, bias)| bias <= -100.0)
            .map(|&(token, _)| token)
    }
}

/// A generation resumed on another worker: the prompt's last `generated` tokens were
/// already produced (and delivered) by the worker that failed. The engine continues the
/// same sequence: output positions count from `generated`, and a deterministic engine
/// produces the tokens the first worker would have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resume {
    pub generated: u32,
}

/// Where a request's KV blocks are, for a decode worker to pull.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvHandle {
    /// The worker (and rank) holding the blocks.
    pub source: WorkerKey,
    /// The prefill request that computed them.
    pub request: RequestId,
    /// The prompt's full blocks, from the first.
    pub blocks: Vec<SequenceHash>,
    /// Tokens the blocks hold.
    pub tokens: u32,
    /// The source's request-plane address, for network request planes (the frontend
    /// fills it in from discovery).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
}

/// What part of the work a request asks for.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Prefill and decode on the same worker.
    #[default]
    Aggregated,
    /// Compute the prompt's KV and the first token only; answer with a [`KvHandle`].
    PrefillOnly,
    /// Decode, starting from blocks computed elsewhere (pulling those not held here).
    Decode { kv: KvHandle },
    /// Encode the prompt's media items (its `media` spans; no tokens are generated):
    /// answered with `Finished` once every item is encoded. Sent to encoder workers.
    Encode,
}

/// A request for an engine: the prompt, already tokenized.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GenerateRequest {
    pub id: RequestId,
    pub prompt: Prompt,
    /// Tokens still to generate (for a resumed request: what is left of the original).
    pub max_tokens: u32,
    #[serde(default)]
    pub sampling: SamplingParams,
    /// The data-parallel rank chosen by the router.
    #[serde(default)]
    pub dp_rank: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume: Option<Resume>,
    #[serde(default)]
    pub phase: Phase,
    /// For `encode` requests: each media span's prepared input, for a real encoder (empty
    /// for encoders that only model the time).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub media_inputs: Vec<MediaInput>,
    /// The prompt's media are still being encoded (the frontend sent the request ahead of
    /// them): an engine that can computes the prompt up to its first media position and
    /// waits there for `media_ready`; one that cannot takes the placeholders as they are.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub media_pending: bool,
}

impl GenerateRequest {
    /// A plain text generation.
    pub fn text(id: RequestId, token_ids: Vec<Token>, max_tokens: u32) -> Self {
        GenerateRequest {
            id,
            prompt: Prompt::tokens(token_ids),
            max_tokens,
            sampling: SamplingParams::default(),
            dp_rank: 0,
            resume: None,
            phase: Phase::Aggregated,
            media_inputs: Vec::new(),
            media_pending: false,
        }
    }

    /// Output tokens already produced before this request (0 unless resumed).
    pub fn generated(&self) -> u32 {
        self.resume.map_or(0, |r| r.generated)
    }

    /// What keys a deterministic engine's output: the sampling seed when given, else the
    /// request id. It does not depend on the worker, so a resumed request continues the
    /// sequence its first worker started.
    pub fn stream_key(&self) -> u64 {
        self.sampling.seed.unwrap_or(self.id.0)
    }
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// The token limit was reached.
    Length,
    /// A stop token was produced.
    Stop,
    /// The engine gave the request up (it was cancelled, or the engine is stopping): the
    /// output is truncated and must never be reported as complete.
    Cancelled,
}

/// One output token of an engine step.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenOutput {
    pub request: RequestId,
    pub token: Token,
    /// Position among the request's output tokens, from 0 (a resumed request continues
    /// from what was generated before).
    pub index: u32,
    /// Prompt tokens found in the prefix cache when the request was admitted.
    pub cached_tokens: u32,
    /// Set on the request's last token.
    pub finish: Option<FinishReason>,
    /// The token's log probability and the likeliest alternatives', when the request
    /// asked ([`SamplingParams::logprobs`]).
    pub logprobs: Option<Box<TokenLogprobs>>,
    /// On the request's first token, when it asked ([`SamplingParams::prompt_logprobs`]):
    /// each prompt token's after the first.
    pub prompt_logprobs: Option<Box<Vec<TokenLogprobs>>>,
}

/// A generated token's log probability under the model's distribution (its raw logits,
/// before penalties, biases, temperature and constraints), and the `n` likeliest tokens'
/// the request asked for, likeliest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenLogprobs {
    pub logprob: f32,
    pub top: Vec<(Token, f32)>,
}

/// A generated token's log probability as an engine that streams text reports it: the
/// token and its likeliest alternatives by their text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TextLogprob {
    pub token: String,
    pub logprob: f32,
    pub top: Vec<(String, f32)>,
}

/// One item of an engine's response stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GenerateOutput {
    /// New tokens. `cached_tokens`, on the first item, counts the prompt tokens the engine
    /// found in its prefix cache.
    Tokens {
        token_ids: Vec<Token>,
        cached_tokens: Option<u32>,
        /// One per token, when the request asked for them (none otherwise, and then the
        /// field is not sent: a frontend older than it reads such frames).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        logprobs: Vec<TokenLogprobs>,
    },
    /// New text, from engines that stream text rather than tokens (an OpenAI-compatible
    /// upstream). `tokens` is how many tokens it stands for, when the engine says.
    Text {
        text: String,
        tokens: Option<u32>,
        cached_tokens: Option<u32>,
        /// The text's tokens with their log probabilities, when the request asked and the
        /// engine says (their texts, joined, are `text`).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        logprobs: Vec<TextLogprob>,
    },
    /// The prompt's log probabilities, before the first token, when the request asked
    /// ([`SamplingParams::prompt_logprobs`]): one per prompt token after the first.
    PromptLogprobs { logprobs: Vec<TokenLogprobs> },
    /// A prefill-only request is done: its first token, and where its KV blocks are.
    PrefillDone {
        first_token: Token,
        kv: KvHandle,
        cached_tokens: u32,
        /// The first token's log probabilities, when the request asked.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        logprobs: Option<TokenLogprobs>,
    },
    /// An encoder's embeddings of the request's media items, one per media span in the
    /// spans' order ([`MediaInput::Embeddings`]), before it finishes; encoders that only
    /// model their timing send none.
    Features { items: Vec<MediaInput> },
    /// The end of the stream. `cached_tokens`: the prompt tokens the engine found in its
    /// prefix cache, from an engine that says so only at the end (an OpenAI-compatible
    /// upstream's trailing usage chunk) rather than on its first item. Frames are
    /// positional MessagePack: a frontend reads a worker's `Finished` without the field
    /// (as `None`), but a frontend older than the field cannot read one with it, so
    /// frontends are upgraded before workers.
    Finished {
        reason: FinishReason,
        completion_tokens: u32,
        #[serde(default)]
        cached_tokens: Option<u32>,
    },
}

/// Why a request failed, typed so a caller knows whether another worker can help.
#[derive(Debug, Clone, PartialEq, Eq, Error, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EngineError {
    /// The worker could not be reached (connection refused, unknown here, not serving).
    #[error("cannot reach the worker: {0}")]
    Unreachable(String),
    /// The connection was lost mid-request (or the stream ended without finishing).
    #[error("the connection to the worker was lost mid-request")]
    Disconnected,
    /// The worker is shutting down and takes no more work.
    #[error("the worker is stopping")]
    Stopping,
    /// The worker has no room now (back-pressure, not a fault).
    #[error("the worker is overloaded: {0}")]
    Overloaded(String),
    /// This worker cannot serve the request (too large for its cache, a feature it lacks),
    /// but another might.
    #[error("the worker cannot serve this request: {0}")]
    Unsupported(String),
    /// The KV a decode request was to start from is gone (its prefill worker failed or
    /// evicted it): the request must be prefilled again; not this worker's fault.
    #[error("the KV to decode from is gone: {0}")]
    KvLost(String),
    /// The request is invalid for any worker (a 400 for the client).
    #[error("invalid request: {0}")]
    Invalid(String),
    /// The engine's memory cannot hold the request's work (an encoder's item too large for
    /// its device): a smaller input may fit; not a fault of the worker's.
    #[error("out of memory: {0}")]
    OutOfMemory(String),
    /// The engine failed while serving it.
    #[error("the engine failed: {0}")]
    Internal(String),
}

impl EngineError {
    /// Whether sending the same request to another worker can succeed.
    pub fn retry_elsewhere(&self) -> bool {
        !matches!(self, EngineError::Invalid(_))
    }

    /// Whether the error says something is wrong with the worker (as opposed to the request,
    /// or back-pressure). Only these may count against a worker's health.
    pub fn is_worker_fault(&self) -> bool {
        matches!(
            self,
            EngineError::Unreachable(_) | EngineError::Disconnected | EngineError::Internal(_)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_invalid_requests_are_final_and_back_pressure_is_no_fault() {
        let all = [
            EngineError::Unreachable("x".into()),
            EngineError::Disconnected,
            EngineError::Stopping,
            EngineError::Overloaded("x".into()),
            EngineError::Unsupported("x".into()),
            EngineError::Invalid("x".into()),
            EngineError::Internal("x".into()),
        ];
        let final_: Vec<_> = all.iter().filter(|e| !e.retry_elsewhere()).collect();
        assert_eq!(final_, [&EngineError::Invalid("x".into())]);
        let faults: Vec<_> = all.iter().filter(|e| e.is_worker_fault()).collect();
        assert_eq!(faults.len(), 3);
        assert!(!EngineError::Overloaded("x".into()).is_worker_fault());
        assert!(!EngineError::Unsupported("x".into()).is_worker_fault());
        let lost = EngineError::KvLost("x".into());
        assert!(lost.retry_elsewhere() && !lost.is_worker_fault());
        let oom = EngineError::OutOfMemory("x".into());
        assert!(oom.retry_elsewhere() && !oom.is_worker_fault());
    }

    #[test]
    fn requests_round_trip_and_old_fields_default() {
        let mut request = GenerateRequest::text(RequestId(7), vec![1, 2, 3], 5);
        request.prompt.media.push(MediaSpan {
            modality: Modality::Image,
            media_hash: 42,
            offset: 1,
            length: 2,
        });
        request.resume = Some(Resume { generated: 2 });
        request.phase = Phase::Decode {
            kv: KvHandle {
                source: WorkerKey::new(3, 0),
                request: RequestId(6),
                blocks: vec![SequenceHash(9)],
                tokens: 16,
                address: Some("10.0.0.7:7001".into()),
            },
        };
        // Named encoding, as on the request plane: optional fields may be left out.
        let bytes = rmp_serde::to_vec_named(&request).expect("encodes");
        let back: GenerateRequest = rmp_serde::from_slice(&bytes).expect("decodes");
        assert_eq!(back, request);
        let plain = GenerateRequest::text(RequestId(2), vec![5], 1);
        let bytes = rmp_serde::to_vec_named(&plain).expect("encodes");
        assert_eq!(
            rmp_serde::from_slice::<GenerateRequest>(&bytes).ok(),
            Some(plain)
        );
        let json = r#"{"id":1,"prompt":{"token_ids":[4]},"max_tokens":2}"#;
        let plain: GenerateRequest = serde_json::from_str(json).expect("decodes");
        assert_eq!(plain, GenerateRequest::text(RequestId(1), vec![4], 2));
        assert_eq!(plain.stream_key(), 1);
        assert_eq!(back.generated(), 2);
    }

    #[test]
    fn log_probabilities_travel_only_when_asked_and_old_frames_still_read() {
        /// The frame as frontends and workers older than log probabilities know it.
        #[derive(Debug, PartialEq, Serialize, Deserialize)]
        #[serde(rename_all = "snake_case")]
        enum Old {
            Tokens {
                token_ids: Vec<Token>,
                cached_tokens: Option<u32>,
            },
        }
        let with = GenerateOutput::Tokens {
            token_ids: vec![5],
            cached_tokens: Some(2),
            logprobs: vec![TokenLogprobs {
                logprob: -0.25,
                top: vec![(5, -0.25), (9, -1.5)],
            }],
        };
        let bytes = rmp_serde::to_vec(&with).expect("encodes");
        assert_eq!(
            rmp_serde::from_slice::<GenerateOutput>(&bytes).ok(),
            Some(with)
        );
        let without = GenerateOutput::Tokens {
            token_ids: vec![5],
            cached_tokens: None,
            logprobs: Vec::new(),
        };
        let bytes = rmp_serde::to_vec(&without).expect("encodes");
        let old = Old::Tokens {
            token_ids: vec![5],
            cached_tokens: None,
        };
        assert_eq!(rmp_serde::from_slice::<Old>(&bytes).ok(), Some(old));
        let bytes = rmp_serde::to_vec(&Old::Tokens {
            token_ids: vec![5],
            cached_tokens: None,
        })
        .expect("encodes");
        assert_eq!(
            rmp_serde::from_slice::<GenerateOutput>(&bytes).ok(),
            Some(without)
        );
        // A request that asks, named as on the request plane.
        let mut request = GenerateRequest::text(RequestId(7), vec![1], 5);
        request.sampling.logprobs = Some(3);
        let bytes = rmp_serde::to_vec_named(&request).expect("encodes");
        assert_eq!(
            rmp_serde::from_slice::<GenerateRequest>(&bytes).ok(),
            Some(request)
        );
    }

    #[test]
    fn media_inputs_travel_as_binary_and_count_their_units() {
        let mut request = GenerateRequest::text(RequestId(3), Vec::new(), 0);
        request.phase = Phase::Encode;
        let squares = MediaInput::squares(20, &[vec![200u8; 1200], vec![201u8; 1200]]);
        let mel = MediaInput::mel(2, 3, &[vec![0.5f32; 6]]);
        assert_eq!((squares.units(), mel.units()), (Ok(2), Ok(1)));
        request.media_inputs = vec![squares, mel];
        let bytes = rmp_serde::to_vec_named(&request).expect("encodes");
        // 2,400 pixel bytes as binary (an array of numbers would take two bytes each).
        assert!(bytes.len() < 2_400 + 400, "{} bytes", bytes.len());
        let back: GenerateRequest = rmp_serde::from_slice(&bytes).expect("decodes");
        assert_eq!(back, request);
        let MediaInput::Mel { values, .. } = &back.media_inputs[1] else {
            panic!("{:?}", back.media_inputs[1]);
        };
        assert_eq!(values[..4], 0.5f32.to_le_bytes());
        let ragged = MediaInput::Squares {
            side: 2,
            rgb: vec![0u8; 13].into(),
        };
        assert!(ragged.units().is_err());
    }

    #[test]
    fn modality_sets_are_lists_and_empty_means_every_modality() {
        let audio = Modalities::from(vec![Modality::Audio]);
        assert!(audio.contains(Modality::Audio) && !audio.contains(Modality::Video));
        assert!(!audio.is_all());
        let every = Modalities::default();
        assert!(every.is_all() && every.contains(Modality::Image));
        assert!(Modalities::from(vec![Modality::Image, Modality::Audio, Modality::Video]).is_all());
        let json = serde_json::to_string(&Modalities::from(vec![Modality::Video, Modality::Image]))
            .expect("encodes");
        assert_eq!(json, r#"["image","video"]"#);
        let back: Modalities = serde_json::from_str(r#"["audio"]"#).expect("decodes");
        assert_eq!(back, audio);
    }

    #[test]
    fn errors_round_trip() {
        for e in [
            EngineError::Disconnected,
            EngineError::Invalid("bad".into()),
        ] {
            let bytes = rmp_serde::to_vec(&e).expect("encodes");
            assert_eq!(rmp_serde::from_slice::<EngineError>(&bytes).ok(), Some(e));
        }
    }
}
