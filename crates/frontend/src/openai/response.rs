//! Response bodies and stream chunks.

use serde::Serialize;

use super::logprobs::{ChatLogprobs, CompletionLogprobs};
use super::tools::{ToolCallDelta, ToolCallOut};
use crate::tools::output::{Answer, Part};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct PromptTokensDetails {
    pub cached_tokens: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Usage {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    pub total_tokens: u32,
    /// Left out when the engine did not say what it served from its prefix cache (an
    /// OpenAI-compatible upstream that does not report it), rather than claiming 0.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_details: Option<PromptTokensDetails>,
}

impl Usage {
    pub fn new(prompt_tokens: u32, completion_tokens: u32, cached_tokens: Option<u32>) -> Self {
        Usage {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
            prompt_tokens_details: cached_tokens
                .map(|cached_tokens| PromptTokensDetails { cached_tokens }),
        }
    }
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ChatMessageOut {
    pub role: &'static str,
    /// The text; null when the answer is only tool calls.
    pub content: Option<String>,
    /// The model's reasoning, when a reasoning parser split it off.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCallOut>,
}

impl ChatMessageOut {
    /// An assistant message from a parsed answer.
    pub fn of(answer: Answer) -> Self {
        let content = if answer.content.is_empty() && !answer.calls.is_empty() {
            None
        } else {
            Some(answer.content)
        };
        ChatMessageOut {
            role: "assistant",
            content,
            reasoning_content: answer.reasoning,
            tool_calls: answer.calls,
        }
    }
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ChatChoice {
    pub index: u32,
    pub message: ChatMessageOut,
    pub finish_reason: Option<&'static str>,
    /// When the request asked (`logprobs: true`).
    pub logprobs: Option<ChatLogprobs>,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ChatCompletion {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChoice>,
    pub usage: Usage,
}

#[derive(Debug, Clone, Default, Serialize, utoipa::ToSchema)]
pub struct ChatDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
}

impl ChatDelta {
    /// The delta carrying one streamed part of an answer.
    pub fn of(part: Part) -> Self {
        match part {
            Part::Content(text) => ChatDelta {
                content: Some(text),
                ..ChatDelta::default()
            },
            Part::Reasoning(text) => ChatDelta {
                reasoning_content: Some(text),
                ..ChatDelta::default()
            },
            Part::Calls(calls) => ChatDelta {
                tool_calls: Some(calls),
                ..ChatDelta::default()
            },
        }
    }
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ChatChunkChoice {
    pub index: u32,
    pub delta: ChatDelta,
    pub finish_reason: Option<&'static str>,
    /// The log probabilities of the tokens this chunk's text came from, when asked.
    pub logprobs: Option<ChatLogprobs>,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ChatCompletionChunk<'a> {
    pub id: &'a str,
    pub object: &'static str,
    pub created: u64,
    pub model: &'a str,
    pub choices: Vec<ChatChunkChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct CompletionChoice {
    pub index: u32,
    pub text: String,
    pub finish_reason: Option<&'static str>,
    /// When the request asked (`logprobs` a count).
    pub logprobs: Option<CompletionLogprobs>,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Completion<'a> {
    pub id: &'a str,
    pub object: &'static str,
    pub created: u64,
    pub model: &'a str,
    pub choices: Vec<CompletionChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ModelCard {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub owned_by: &'static str,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ModelList {
    pub object: &'static str,
    pub data: Vec<ModelCard>,
}
