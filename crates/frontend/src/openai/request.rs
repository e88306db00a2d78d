//! Request bodies. Every field is type-checked; an unknown top-level field is a 400 naming it
//! (a parameter is honoured, a documented no-op, or refused, never silently ignored).
//! Messages take the fields the OpenAI SDKs send back in an assistant turn (`refusal`,
//! `annotations`, `audio`) as documented no-ops: they describe a past answer, not this
//! one. Any other message field is a 400 naming it.

use std::collections::HashMap;

use serde::Deserialize;
use switchyard_router::PolicyKind;

use super::error::ApiError;
pub use super::tools::{ToolCallIn, ToolChoiceIn, ToolIn};

/// Declares a request body with the parameters both endpoints share, inline rather than
/// `#[serde(flatten)]`ed, so that type errors keep their path (`max_tokens`, not `.`).
macro_rules! request_body {
    ($(#[$meta:meta])* $name:ident { $($(#[$field_meta:meta])* $field:ident: $ty:ty,)* }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
        #[serde(deny_unknown_fields)]
        pub struct $name {
            $($(#[$field_meta])* pub $field: $ty,)*
            pub max_tokens: Option<u32>,
            pub max_completion_tokens: Option<u32>,
            pub temperature: Option<f32>,
            pub top_p: Option<f32>,
            /// vLLM's and SGLang's extension: sample among the `top_k` likeliest tokens
            /// (0 or -1: all of them).
            pub top_k: Option<i64>,
            pub stop: Option<StopInput>,
            pub seed: Option<i64>,
            pub stream: Option<bool>,
            pub stream_options: Option<StreamOptions>,
            pub n: Option<u32>,
            pub logprobs: Option<serde_json::Value>,
            pub frequency_penalty: Option<f64>,
            pub presence_penalty: Option<f64>,
            pub logit_bias: Option<HashMap<String, f64>>,
            pub top_logprobs: Option<u32>,
            pub response_format: Option<ResponseFormat>,
            pub modalities: Option<Vec<String>>,
            pub audio: Option<serde_json::Value>,
            /// vLLM's and SGLang's extension: generate up to `max_tokens` whatever the
            /// end-of-sequence tokens (for benchmarks).
            pub ignore_eos: Option<bool>,
            /// Documented no-ops: they describe the caller or ask OpenAI's platform to keep
            /// or bill the request, and change no answer.
            pub user: Option<String>,
            pub metadata: Option<HashMap<String, String>>,
            pub store: Option<bool>,
            pub service_tier: Option<String>,
            pub safety_identifier: Option<String>,
            pub prompt_cache_key: Option<String>,
            /// A predicted output speeds an answer up on OpenAI's platform and never changes
            /// it: a documented no-op, type-checked.
            #[schema(value_type = Option<Object>)]
            pub prediction: Option<Prediction>,
            /// Refused unless neutral (no engine here applies them yet).
            pub min_p: Option<f32>,
            pub min_tokens: Option<u32>,
            pub repetition_penalty: Option<f32>,
            pub reasoning_effort: Option<String>,
            pub verbosity: Option<String>,
            #[schema(value_type = Option<Object>)]
            pub web_search_options: Option<serde_json::Map<String, serde_json::Value>>,
            /// vLLM's structured-output parameters (see [`crate::constraint`]).
            #[schema(value_type = Option<Object>)]
            pub guided_json: Option<serde_json::Value>,
            pub guided_regex: Option<String>,
            pub guided_choice: Option<Vec<String>>,
            pub guided_grammar: Option<String>,
            #[schema(value_type = Option<Object>)]
            pub structured_outputs: Option<serde_json::Map<String, serde_json::Value>>,
            /// Switchyard's extension: routing overrides and a priority tier.
            pub switchyard: Option<Extension>,
        }

        impl $name {
            /// The shared parameters.
            pub fn common(&self) -> CommonParams {
                CommonParams {
                    max_tokens: self.max_tokens,
                    max_completion_tokens: self.max_completion_tokens,
                    temperature: self.temperature,
                    top_p: self.top_p,
                    top_k: self.top_k,
                    stop: self.stop.clone(),
                    seed: self.seed,
                    stream: self.stream,
                    stream_options: self.stream_options.clone(),
                    n: self.n,
                    logprobs: self.logprobs.clone(),
                    frequency_penalty: self.frequency_penalty,
                    presence_penalty: self.presence_penalty,
                    logit_bias: self.logit_bias.clone(),
                    top_logprobs: self.top_logprobs,
                    modalities: self.modalities.clone(),
                    audio: self.audio.clone(),
                    ignore_eos: self.ignore_eos,
                    min_p: self.min_p,
                    min_tokens: self.min_tokens,
                    repetition_penalty: self.repetition_penalty,
                    reasoning_effort: self.reasoning_effort.clone(),
                    verbosity: self.verbosity.clone(),
                    web_search: self.web_search_options.is_some(),
                    structured: crate::constraint::Structured {
                        response_format: self.response_format.clone(),
                        guided_json: self.guided_json.clone(),
                        guided_regex: self.guided_regex.clone(),
                        guided_choice: self.guided_choice.clone(),
                        guided_grammar: self.guided_grammar.clone(),
                        structured_outputs: self.structured_outputs.clone(),
                        tool_choice: None,
                    },
                    switchyard: self.switchyard.clone(),
                }
            }
        }
    };
}

request_body! {
    /// `POST /v1/chat/completions`.
    ChatCompletionRequest {
        model: String,
        messages: Vec<ChatMessageIn>,
        tools: Option<Vec<ToolIn>>,
        #[schema(value_type = Option<Object>)]
        tool_choice: Option<ToolChoiceIn>,
        parallel_tool_calls: Option<bool>,
        /// Legacy function calling (superseded by `tools`).
        functions: Option<Vec<serde_json::Value>>,
        function_call: Option<serde_json::Value>,
    }
}

request_body! {
    /// `POST /v1/completions`.
    CompletionRequest {
        model: String,
        prompt: PromptInput,
        #[serde(default)]
        echo: Option<bool>,
        best_of: Option<u32>,
        suffix: Option<String>,
    }
}

/// Parameters both endpoints share.
#[derive(Debug, Clone, Default)]
pub struct CommonParams {
    pub max_tokens: Option<u32>,
    pub max_completion_tokens: Option<u32>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub stop: Option<StopInput>,
    pub seed: Option<i64>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub n: Option<u32>,
    pub logprobs: Option<serde_json::Value>,
    pub frequency_penalty: Option<f64>,
    pub presence_penalty: Option<f64>,
    pub logit_bias: Option<HashMap<String, f64>>,
    pub top_logprobs: Option<u32>,
    pub modalities: Option<Vec<String>>,
    pub audio: Option<serde_json::Value>,
    pub ignore_eos: Option<bool>,
    pub min_p: Option<f32>,
    pub min_tokens: Option<u32>,
    pub repetition_penalty: Option<f32>,
    pub reasoning_effort: Option<String>,
    pub verbosity: Option<String>,
    /// `web_search_options` was given.
    pub web_search: bool,
    /// OpenAI's and vLLM's structured-output parameters.
    pub structured: crate::constraint::Structured,
    pub switchyard: Option<Extension>,
}

/// `prediction`: `{"type": "content", "content": ...}`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Prediction {
    #[serde(rename = "type")]
    pub kind: PredictionKind,
    pub content: MessageContent,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PredictionKind {
    Content,
}

#[derive(Debug, Clone, Default, Deserialize, utoipa::ToSchema)]
pub struct StreamOptions {
    /// `null` reads as absent (false), as OpenAI's API takes it.
    #[serde(default)]
    pub include_usage: Option<bool>,
}

/// `response_format`: `{"type": "text"}` is plain generation; `json_object` and
/// `json_schema` ask for structured output.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResponseFormat {
    #[serde(rename = "type")]
    pub kind: String,
    pub json_schema: Option<JsonSchemaFormat>,
}

/// `response_format.json_schema`: the schema the answer must follow, named.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct JsonSchemaFormat {
    pub name: String,
    pub description: Option<String>,
    #[schema(value_type = Option<Object>)]
    pub schema: Option<serde_json::Value>,
    /// Enforced whatever it says: every answer that ends with `stop` follows the schema.
    pub strict: Option<bool>,
}

/// `stop`: a string or up to four strings.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum StopInput {
    One(String),
    Many(Vec<String>),
}

/// `prompt`: text, token ids, or batches of either (batches are not supported).
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum PromptInput {
    Text(String),
    Tokens(Vec<u32>),
    Texts(Vec<String>),
    TokenBatches(Vec<Vec<u32>>),
}

#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ChatMessageIn {
    pub role: String,
    #[serde(default)]
    pub content: Option<MessageContent>,
    /// An assistant turn's calls.
    #[serde(default)]
    pub tool_calls: Option<Vec<ToolCallIn>>,
    /// A `tool` message's call.
    #[serde(default)]
    pub tool_call_id: Option<String>,
    /// A participant's name (OpenAI's), or a legacy `function` message's function.
    #[serde(default)]
    pub name: Option<String>,
    /// What the OpenAI SDKs send back in an assistant turn of the history: they describe a
    /// past answer and change nothing in the prompt (documented no-ops, type-checked).
    #[serde(default)]
    pub refusal: Option<String>,
    #[serde(default)]
    #[schema(value_type = Option<Vec<Object>>)]
    pub annotations: Option<Vec<serde_json::Value>>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub audio: Option<serde_json::Map<String, serde_json::Value>>,
    /// A legacy call in the history: only `null` is taken (a call would be dropped from
    /// the prompt; send `tool_calls`).
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub function_call: Option<serde_json::Value>,
}

#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum MessageContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
    #[serde(default)]
    pub image_url: Option<ImageUrl>,
    #[serde(default)]
    pub input_audio: Option<InputAudio>,
    #[serde(default)]
    pub video_url: Option<VideoUrl>,
}

/// An `input_audio` part's audio: base64 bytes and their format (`wav`, `mp3`, `flac`,
/// `ogg`).
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
pub struct InputAudio {
    pub data: String,
    pub format: String,
}

/// A `video_url` part's video: a `data:` URL, an `http(s)` URL, or an allowed `file:` URL
/// (MP4/H.264, animated GIF, MJPEG AVI).
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
pub struct VideoUrl {
    pub url: String,
}

/// An `image_url` part's image: a `data:` URL, an `http(s)` URL, or an allowed `file:` URL.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
pub struct ImageUrl {
    pub url: String,
    /// `low`, `high` or `auto`.
    #[serde(default)]
    pub detail: Option<String>,
}

pub use switchyard_core::Priority;

/// The `switchyard` request extension.
#[derive(Debug, Clone, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Extension {
    /// `best_effort`, `standard` or `premium`.
    #[schema(value_type = Option<String>)]
    pub priority: Option<Priority>,
    pub routing: Option<RoutingExtension>,
}

#[derive(Debug, Clone, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RoutingExtension {
    /// A routing policy name (`kv`, `latency`, `round-robin`, ...).
    #[schema(value_type = Option<String>)]
    pub policy: Option<PolicyKind>,
    pub overlap_weight: Option<f64>,
    pub temperature: Option<f64>,
}

impl ChatMessageIn {
    /// The message's text: a string, or its text parts joined.
    pub fn text(&self, index: usize) -> Result<String, ApiError> {
        match &self.content {
            None => Ok(String::new()),
            Some(MessageContent::Text(t)) => Ok(crate::media::unmark(t).into_owned()),
            Some(MessageContent::Parts(parts)) => {
                let mut text = String::new();
                for part in parts {
                    match (part.kind.as_str(), &part.text) {
                        ("text", Some(t)) => text.push_str(&crate::media::unmark(t)),
                        // Prepared beforehand (crate::media); marked for the template.
                        ("image_url" | "input_audio" | "video_url", _) => {
                            text.push(crate::media::MEDIA_MARK);
                        }
                        ("text", None) => {
                            return Err(ApiError::invalid_param(
                                &format!("messages[{index}].content"),
                                "a text part needs `text`",
                            ));
                        }
                        (other, _) => {
                            return Err(ApiError::invalid_param(
                                &format!("messages[{index}].content"),
                                format!(
                                    "content parts of type `{other}` are not supported; only `text`, `image_url`, `input_audio` and `video_url`"
                                ),
                            ));
                        }
                    }
                }
                Ok(text)
            }
        }
    }
}

impl StopInput {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            StopInput::One(s) => vec![s],
            StopInput::Many(v) => v,
        }
    }
}
