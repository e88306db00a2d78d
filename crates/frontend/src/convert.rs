//! From OpenAI request bodies to validated, tokenized requests.

use switchyard_core::protocol::{Prompt, SamplingParams};
use switchyard_router::RoutingOverrides;

use crate::openai::ApiError;
use crate::openai::request::{ChatCompletionRequest, CommonParams, CompletionRequest, PromptInput};
use crate::pipeline::{Frontend, Prepared};
use crate::preprocess::{ChatMessage, PreprocessError};

/// How the response goes out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mode {
    pub stream: bool,
    pub include_usage: bool,
}

const ROLES: [&str; 5] = ["system", "developer", "user", "assistant", "tool"];

pub fn chat(
    frontend: &Frontend,
    request: ChatCompletionRequest,
) -> Result<(Prepared, Mode), ApiError> {
    check_model(frontend, &request.model)?;
    if request.messages.is_empty() {
        return Err(ApiError::invalid_param(
            "messages",
            "`messages` must contain at least one message",
        ));
    }
    let mut messages = Vec::with_capacity(request.messages.len());
    for (i, message) in request.messages.iter().enumerate() {
        if !ROLES.contains(&message.role.as_str()) {
            return Err(ApiError::invalid_param(
                &format!("messages[{i}].role"),
                format!(
                    "unknown role `{}`; expected one of {}",
                    message.role,
                    ROLES.join(", ")
                ),
            ));
        }
        messages.push(ChatMessage {
            role: message.role.clone(),
            content: message.text(i)?,
        });
    }
    let prompt = frontend
        .preprocessor
        .render_chat(&messages)
        .map_err(|e| match e {
            PreprocessError::TemplateRaised(message) => {
                ApiError::invalid_param("messages", message)
            }
            other => ApiError::invalid(format!(
                "Cannot apply the chat template to these messages: {other}"
            )),
        })?;
    let tokens = frontend
        .preprocessor
        .encode(&prompt)
        .map_err(|e| ApiError::internal(format!("Cannot tokenize the prompt: {e}")))?;
    common(frontend, request.common(), tokens)
}

pub fn completion(
    frontend: &Frontend,
    request: CompletionRequest,
) -> Result<(Prepared, Mode), ApiError> {
    check_model(frontend, &request.model)?;
    if request.echo == Some(true) {
        return Err(ApiError::invalid_param("echo", "`echo` is not supported"));
    }
    let encode = |text: &str| {
        frontend
            .preprocessor
            .encode_completion_prompt(text)
            .map_err(|e| ApiError::internal(format!("Cannot tokenize the prompt: {e}")))
    };
    let batched = || {
        ApiError::invalid_param(
            "prompt",
            "batched prompts are not supported; send one prompt per request",
        )
    };
    let params = request.common();
    let tokens = match request.prompt {
        PromptInput::Text(text) => encode(&text)?,
        PromptInput::Texts(texts) => match texts.as_slice() {
            [one] => encode(one)?,
            _ => return Err(batched()),
        },
        PromptInput::Tokens(tokens) => tokens,
        PromptInput::TokenBatches(mut batches) => match batches.len() {
            1 => batches.pop().unwrap_or_default(),
            _ => return Err(batched()),
        },
    };
    let vocab = frontend.preprocessor.vocab_size();
    if let Some(bad) = tokens.iter().find(|&&t| t >= vocab) {
        return Err(ApiError::invalid_param(
            "prompt",
            format!("token id {bad} is outside the vocabulary (size {vocab})"),
        ));
    }
    common(frontend, params, tokens)
}

fn check_model(frontend: &Frontend, model: &str) -> Result<(), ApiError> {
    if model == frontend.config.model {
        Ok(())
    } else {
        Err(ApiError::model_not_found(model))
    }
}

fn common(
    frontend: &Frontend,
    params: CommonParams,
    token_ids: Vec<u32>,
) -> Result<(Prepared, Mode), ApiError> {
    if token_ids.is_empty() {
        return Err(ApiError::invalid_param("prompt", "the prompt is empty"));
    }
    if let Some(n) = params.n
        && n != 1
    {
        return Err(ApiError::invalid_param(
            "n",
            format!("only n=1 is supported, got {n}"),
        ));
    }
    if params
        .logprobs
        .as_ref()
        .is_some_and(|v| !matches!(v, serde_json::Value::Bool(false) | serde_json::Value::Null))
    {
        return Err(ApiError::invalid_param(
            "logprobs",
            "`logprobs` is not supported",
        ));
    }
    if params.tools.as_ref().is_some_and(|t| !t.is_empty()) {
        return Err(ApiError::invalid_param(
            "tools",
            "tool calling is not supported",
        ));
    }
    let context = frontend.preprocessor.context_length();
    let prompt = token_ids.len() as u64;
    let requested = params.max_completion_tokens.or(params.max_tokens);
    if requested == Some(0) {
        return Err(ApiError::invalid_param(
            "max_tokens",
            "`max_tokens` must be at least 1",
        ));
    }
    if prompt >= u64::from(context) {
        return Err(ApiError::context_length(format!(
            "This model's maximum context length is {context} tokens, but the prompt has {prompt} tokens."
        )));
    }
    let room = u64::from(context) - prompt;
    let max_tokens = match requested {
        Some(m) if u64::from(m) > room => {
            return Err(ApiError::context_length(format!(
                "This model's maximum context length is {context} tokens. However, you requested {} tokens ({prompt} in the prompt, {m} for the completion).",
                prompt + u64::from(m)
            )));
        }
        Some(m) => m,
        None => room.min(u64::from(frontend.config.default_max_tokens)) as u32,
    };
    if let Some(t) = params.temperature
        && !(t.is_finite() && (0.0..=2.0).contains(&t))
    {
        return Err(ApiError::invalid_param(
            "temperature",
            format!("`temperature` must be between 0 and 2, got {t}"),
        ));
    }
    if let Some(p) = params.top_p
        && !(p.is_finite() && p > 0.0 && p <= 1.0)
    {
        return Err(ApiError::invalid_param(
            "top_p",
            format!("`top_p` must be in (0, 1], got {p}"),
        ));
    }
    let stop = params.stop.map(|s| s.into_vec()).unwrap_or_default();
    if stop.len() > 4 {
        return Err(ApiError::invalid_param(
            "stop",
            format!("at most 4 stop sequences, got {}", stop.len()),
        ));
    }
    let extension = params.switchyard.unwrap_or_default();
    let routing = extension.routing.unwrap_or_default();
    if let Some(w) = routing.overlap_weight
        && !(w.is_finite() && w >= 0.0)
    {
        return Err(ApiError::invalid_param(
            "switchyard.routing.overlap_weight",
            "must be a non-negative number",
        ));
    }
    if let Some(t) = routing.temperature
        && !(t.is_finite() && t >= 0.0)
    {
        return Err(ApiError::invalid_param(
            "switchyard.routing.temperature",
            "must be a non-negative number",
        ));
    }
    let stream = params.stream.unwrap_or(false);
    let mode = Mode {
        stream,
        include_usage: stream && params.stream_options.is_some_and(|o| o.include_usage),
    };
    let prepared = Prepared {
        prompt: Prompt::tokens(token_ids),
        max_tokens,
        sampling: SamplingParams {
            temperature: params.temperature,
            top_p: params.top_p,
            top_k: None,
            seed: params.seed.map(|s| s as u64),
            stop_token_ids: if params.ignore_eos == Some(true) {
                Vec::new()
            } else {
                frontend.preprocessor.eos_token_ids().to_vec()
            },
        },
        stop,
        priority: extension.priority.unwrap_or_default(),
        overrides: RoutingOverrides {
            policy: routing.policy,
            overlap_weight: routing.overlap_weight,
            temperature: routing.temperature,
        },
    };
    Ok((prepared, mode))
}
