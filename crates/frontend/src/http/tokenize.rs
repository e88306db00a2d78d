//! `/v1/tokenize` and `/v1/detokenize`, in vLLM's shape: what the frontend's tokenizer and
//! chat template make of a prompt or of chat messages (tools included), and back.

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::HeaderMap;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::body;
use crate::convert;
use crate::openai::ApiError;
use crate::openai::request::{ChatCompletionRequest, ChatMessageIn};
use crate::openai::tools::{ToolChoiceIn, ToolIn};
use crate::pipeline::Frontend;

/// `POST /v1/tokenize`: either `prompt` (text as `/v1/completions` takes it) or `messages`
/// (as `/v1/chat/completions` takes them, through the chat template).
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TokenizeRequest {
    /// The served model; may be left out.
    model: Option<String>,
    prompt: Option<String>,
    messages: Option<Vec<ChatMessageIn>>,
    /// With `messages`: the tools, laid out as for a chat completion.
    tools: Option<Vec<ToolIn>>,
    tool_choice: Option<ToolChoiceIn>,
    /// The special tokens the model puts around plain text (a BOS): default true for
    /// `prompt`, false for `messages` (the template writes its own).
    add_special_tokens: Option<bool>,
    /// With `messages`: end with the assistant turn's opening (default true).
    add_generation_prompt: Option<bool>,
    /// Also return each token's piece of the vocabulary.
    return_token_strs: Option<bool>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct TokenizeResponse {
    count: usize,
    max_model_len: u32,
    tokens: Vec<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    token_strs: Option<Vec<String>>,
}

/// `POST /v1/detokenize`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DetokenizeRequest {
    model: Option<String>,
    tokens: Vec<u32>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct DetokenizeResponse {
    /// The tokens' text, special tokens included: tokenizing it again gives the tokens.
    prompt: String,
}

/// The tokens of a prompt or of chat messages.
#[utoipa::path(post, path = "/v1/tokenize", tag = "openai",
    request_body(content = TokenizeRequest, content_type = "application/json", examples(
        ("prompt" = (value = json!({"model": "switchyard-mock", "prompt": "Hello"}))),
        ("messages" = (value = json!({"model": "switchyard-mock", "messages": [{"role": "user", "content": "Hi"}]}))))),
    responses((status = 200, description = "The tokens", body = TokenizeResponse)))]
pub async fn tokenize(
    State(frontend): State<Arc<Frontend>>,
    headers: HeaderMap,
    request: Result<Bytes, BytesRejection>,
) -> Result<Json<TokenizeResponse>, ApiError> {
    let raw: Value = body::parse(&headers, request, frontend.config.max_body_bytes)?;
    let request: TokenizeRequest = body::from_value(raw.clone())?;
    if let Some(model) = &request.model {
        convert::check_model(&frontend, model)?;
    }
    let preprocessor = &frontend.preprocessor;
    let tokenizing = |e| ApiError::internal(format!("Cannot tokenize the prompt: {e}"));
    let tokens = match (request.prompt, request.messages) {
        (Some(prompt), None) => {
            if request.tools.is_some() || request.tool_choice.is_some() {
                return Err(ApiError::invalid_param(
                    "tools",
                    "`tools` go with `messages`, not `prompt`",
                ));
            }
            if request.add_generation_prompt.is_some() {
                return Err(ApiError::invalid_param(
                    "add_generation_prompt",
                    "`add_generation_prompt` goes with `messages`, not `prompt`",
                ));
            }
            if request.add_special_tokens.unwrap_or(true) {
                preprocessor.encode_completion_prompt(&prompt)
            } else {
                preprocessor.encode(&prompt)
            }
            .map_err(tokenizing)?
        }
        (None, Some(_)) => {
            // The chat request these messages and tools would make, checked as one is.
            let mut chat = serde_json::Map::new();
            chat.insert("model".into(), frontend.config.model.clone().into());
            for key in ["messages", "tools", "tool_choice"] {
                if let Some(value) = raw.get(key) {
                    chat.insert(key.into(), value.clone());
                }
            }
            let chat: ChatCompletionRequest = body::from_value(Value::Object(chat))?;
            convert::check_messages(&chat)?;
            let (prompt, _) = convert::render(
                &frontend,
                &chat,
                request.add_generation_prompt.unwrap_or(true),
                text_only,
            )?;
            if request.add_special_tokens.unwrap_or(false) {
                preprocessor.encode_completion_prompt(&prompt)
            } else {
                preprocessor.encode(&prompt)
            }
            .map_err(tokenizing)?
        }
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid_param(
                "messages",
                "send either `prompt` or `messages`, not both",
            ));
        }
        (None, None) => {
            return Err(ApiError::invalid_param(
                "prompt",
                "send `prompt` (text) or `messages` (chat)",
            ));
        }
    };
    let token_strs = request.return_token_strs.unwrap_or(false).then(|| {
        tokens
            .iter()
            .map(|&t| preprocessor.token_piece(t).unwrap_or_default())
            .collect()
    });
    Ok(Json(TokenizeResponse {
        count: tokens.len(),
        max_model_len: preprocessor.context_length(),
        tokens,
        token_strs,
    }))
}

/// A message's text; media parts are refused, since their tokens are known only once the
/// media are fetched and encoded.
fn text_only(index: usize, message: &ChatMessageIn) -> Result<String, ApiError> {
    let text = message.text(index)?;
    if text.contains(crate::media::MEDIA_MARK) {
        return Err(ApiError::invalid_param(
            &format!("messages[{index}].content"),
            "`/v1/tokenize` counts text only; media parts are counted when a chat completion \
             fetches them",
        ));
    }
    Ok(text)
}

/// The text of tokens, special tokens included.
#[utoipa::path(post, path = "/v1/detokenize", tag = "openai",
    request_body(content = DetokenizeRequest, content_type = "application/json", examples(
        ("tokens" = (value = json!({"model": "switchyard-mock", "tokens": [19556, 28]}))))),
    responses((status = 200, description = "The text", body = DetokenizeResponse)))]
pub async fn detokenize(
    State(frontend): State<Arc<Frontend>>,
    headers: HeaderMap,
    request: Result<Bytes, BytesRejection>,
) -> Result<Json<DetokenizeResponse>, ApiError> {
    let request: DetokenizeRequest =
        body::parse(&headers, request, frontend.config.max_body_bytes)?;
    if let Some(model) = &request.model {
        convert::check_model(&frontend, model)?;
    }
    let vocab = frontend.preprocessor.vocab_size();
    if let Some(i) = request.tokens.iter().position(|&t| t >= vocab) {
        return Err(ApiError::invalid_param(
            &format!("tokens[{i}]"),
            format!(
                "token id {} is outside the vocabulary (size {vocab})",
                request.tokens[i]
            ),
        ));
    }
    let prompt = frontend
        .preprocessor
        .render_tokens(&request.tokens)
        .map_err(|e| ApiError::invalid_param("tokens", format!("Cannot decode the tokens: {e}")))?;
    Ok(Json(DetokenizeResponse { prompt }))
}
