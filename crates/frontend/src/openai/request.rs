//! Request bodies. Unknown fields are ignored, as OpenAI clients send many optional ones;
//! known fields are type-checked, and unsupported values get a clear 400.

use std::collections::HashMap;

use serde::Deserialize;
use switchyard_router::PolicyKind;

use super::error::ApiError;

/// Declares a request body with the parameters both endpoints share, inline rather than
/// `#[serde(flatten)]`ed, so that type errors keep their path (`max_tokens`, not `.`).
macro_rules! request_body {
    ($(#[$meta:meta])* $name:ident { $($(#[$field_meta:meta])* $field:ident: $ty:ty,)* }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
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
            pub tools: Option<Vec<serde_json::Value>>,
            pub tool_choice: Option<serde_json::Value>,
            pub frequency_penalty: Option<f64>,
            pub presence_penalty: Option<f64>,
            pub logit_bias: Option<HashMap<String, f64>>,
            pub top_logprobs: Option<u32>,
            pub response_format: Option<ResponseFormat>,
            /// Legacy function calling (superseded by `tools`).
            pub functions: Option<Vec<serde_json::Value>>,
            pub function_call: Option<serde_json::Value>,
            pub modalities: Option<Vec<String>>,
            pub audio: Option<serde_json::Value>,
            /// vLLM's and SGLang's extension: generate up to `max_tokens` whatever the
            /// end-of-sequence tokens (for benchmarks).
            pub ignore_eos: Option<bool>,
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
                    tools: self.tools.clone(),
                    tool_choice: self.tool_choice.clone(),
                    frequency_penalty: self.frequency_penalty,
                    presence_penalty: self.presence_penalty,
                    logit_bias: self.logit_bias.clone(),
                    top_logprobs: self.top_logprobs,
                    response_format: self.response_format.clone(),
                    functions: self.functions.clone(),
                    function_call: self.function_call.clone(),
                    modalities: self.modalities.clone(),
                    audio: self.audio.clone(),
                    ignore_eos: self.ignore_eos,
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
    pub tools: Option<Vec<serde_json::Value>>,
    pub tool_choice: Option<serde_json::Value>,
    pub frequency_penalty: Option<f64>,
    pub presence_penalty: Option<f64>,
    pub logit_bias: Option<HashMap<String, f64>>,
    pub top_logprobs: Option<u32>,
    pub response_format: Option<ResponseFormat>,
    pub functions: Option<Vec<serde_json::Value>>,
    pub function_call: Option<serde_json::Value>,
    pub modalities: Option<Vec<String>>,
    pub audio: Option<serde_json::Value>,
    pub ignore_eos: Option<bool>,
    pub switchyard: Option<Extension>,
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
pub struct ResponseFormat {
    #[serde(rename = "type")]
    pub kind: String,
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
pub struct ChatMessageIn {
    pub role: String,
    #[serde(default)]
    pub content: Option<MessageContent>,
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
