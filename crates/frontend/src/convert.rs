//! From OpenAI request bodies to validated, tokenized requests.

use switchyard_core::Token;
use switchyard_core::protocol::{Prompt, SamplingParams};
use switchyard_router::RoutingOverrides;
use switchyard_runtime::discovery::Needs;

use crate::media::MediaItem;
use crate::openai::ApiError;
use crate::openai::request::{
    ChatCompletionRequest, ChatMessageIn, CommonParams, CompletionRequest, PromptInput,
};
use crate::pipeline::{Frontend, Prepared};
use crate::preprocess::PreprocessError;
use crate::tools::ToolRequest;

/// How the response goes out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mode {
    pub stream: bool,
    pub include_usage: bool,
    /// Choices to generate (OpenAI's `n`), each an engine request of its own.
    pub choices: u32,
    /// Log probabilities asked: of each generated token and this many alternatives.
    pub logprobs: Option<u32>,
}

/// The most choices one request may ask for (OpenAI's limit on `n`).
pub const MAX_CHOICES: u32 = 128;

const ROLES: [&str; 5] = ["system", "developer", "user", "assistant", "tool"];

/// The checks on a chat request's messages that need no tokenizer: run before its media is
/// fetched and decoded, so a request bound to fail does not cost that work.
/// What a chat request's context has left for media: the context length less the text's
/// tokens and the request's `max_tokens` (the request is checked whole once its media are
/// counted).
pub fn media_room(frontend: &Frontend, request: &ChatCompletionRequest) -> u32 {
    // The rendered template, media marks removed; a request the template refuses gets its
    // error later, from `chat`.
    let text_tokens = render(frontend, request, true, |i, m| {
        Ok(m.text(i)?.replace(crate::media::MEDIA_MARK, ""))
    })
    .ok()
    .and_then(|(prompt, _)| frontend.preprocessor.encode(&prompt).ok())
    .map_or(0, |t| t.len());
    let max_tokens = request
        .max_completion_tokens
        .or(request.max_tokens)
        .unwrap_or(0);
    let used = u32::try_from(text_tokens)
        .unwrap_or(u32::MAX)
        .saturating_add(max_tokens);
    frontend.preprocessor.context_length().saturating_sub(used)
}

/// A chat request's prompt text: its messages (each one's text from `text`) and tools
/// through the chat template, in the default tool format when the template has no tool
/// section; with the tools the answer may call.
pub fn render(
    frontend: &Frontend,
    request: &ChatCompletionRequest,
    add_generation_prompt: bool,
    text: impl Fn(usize, &ChatMessageIn) -> Result<String, ApiError>,
) -> Result<(String, Option<ToolRequest>), ApiError> {
    let tools = ToolRequest::of(request)?;
    let mut messages = Vec::with_capacity(request.messages.len());
    for (i, message) in request.messages.iter().enumerate() {
        messages.push(crate::tools::prompt::message(
            i,
            message,
            text(i, message)?,
        )?);
    }
    let preprocessor = &frontend.preprocessor;
    let template_tools = tools
        .as_ref()
        .map(ToolRequest::template_tools)
        .unwrap_or_default();
    let rendered = if crate::tools::prompt::needs_default_format(
        preprocessor.template_handles_tools(),
        &template_tools,
        &messages,
    ) {
        let messages = crate::tools::prompt::default_format(messages, &template_tools);
        preprocessor.render_chat_with_tools(&messages, &[], add_generation_prompt)
    } else {
        preprocessor.render_chat_with_tools(&messages, &template_tools, add_generation_prompt)
    };
    let prompt = rendered.map_err(|e| match e {
        PreprocessError::TemplateRaised(message) => ApiError::invalid_param("messages", message),
        other => ApiError::invalid(format!(
            "Cannot apply the chat template to these messages: {other}"
        )),
    })?;
    Ok((prompt, tools))
}

pub fn check_messages(request: &ChatCompletionRequest) -> Result<(), ApiError> {
    if request.messages.is_empty() {
        return Err(ApiError::invalid_param(
            "messages",
            "`messages` must contain at least one message",
        ));
    }
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
    }
    Ok(())
}

/// What a chat answer is parsed with, besides the frontend's parsers.
#[derive(Debug, Clone, Default)]
pub struct ChatAnswer {
    /// The tools the model may call.
    pub tools: Option<ToolRequest>,
    /// The rendered prompt ends inside the model's reasoning (an open `<think>`).
    pub reasoning_started: bool,
}

/// A prompt's start already tokenized: a stored response's prompt and answer, which the
/// next turn's prompt extends (see [`crate::responses`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Known {
    /// The prompt as rendered, and its token ids.
    pub prompt: String,
    pub prompt_ids: Vec<Token>,
    /// The answer's tokens as generated, and their text as the client read it, with the
    /// special tokens that end it (a follow-up continues from the engine's tokens, hidden
    /// special tokens within the answer included).
    pub answer: String,
    pub answer_ids: Vec<Token>,
}

impl ChatAnswer {
    /// The parser of its answer's text.
    pub fn parser(&self, frontend: &Frontend) -> crate::tools::output::AnswerParser {
        let mut parser = frontend.parsers.for_answer(self.tools.as_ref());
        if self.reasoning_started {
            parser.reasoning_started();
        }
        parser
    }
}

impl Known {
    /// The token ids of the longest known start of `rendered` (the prompt and answer, or
    /// the prompt alone), and the text after it; none when `rendered` extends neither.
    /// The ids are the ones the engine computed, so the follow-up's prefix matches its
    /// cache exactly; tokenizing the rest alone can differ from tokenizing the whole text
    /// only in how the tokens at the seam are cut.
    pub fn split<'a>(&self, rendered: &'a str) -> Option<(Vec<Token>, &'a str)> {
        let rest = rendered.strip_prefix(self.prompt.as_str())?;
        let mut ids = Vec::with_capacity(self.prompt_ids.len() + self.answer_ids.len());
        ids.extend_from_slice(&self.prompt_ids);
        match rest.strip_prefix(self.answer.as_str()) {
            Some(after) if !self.answer.is_empty() => {
                ids.extend_from_slice(&self.answer_ids);
                Some((ids, after))
            }
            _ => Some((ids, rest)),
        }
    }
}

/// A chat request, with its media already prepared (see [`crate::media::MediaStage`]).
pub fn chat(
    frontend: &Frontend,
    (request, media): (ChatCompletionRequest, Vec<MediaItem>),
) -> Result<(Prepared, Mode, ChatAnswer), ApiError> {
    chat_turn(frontend, (request, media, None))
        .map(|(prepared, mode, answer, _)| (prepared, mode, answer))
}

/// [`chat`], continuing a conversation whose start is [`Known`]: only what is new is
/// tokenized. Also gives the rendered prompt.
pub fn chat_turn(
    frontend: &Frontend,
    (request, media, known): (
        ChatCompletionRequest,
        Vec<MediaItem>,
        Option<std::sync::Arc<Known>>,
    ),
) -> Result<(Prepared, Mode, ChatAnswer, String), ApiError> {
    check_model(frontend, &request.model)?;
    check_messages(&request)?;
    let (rendered, tools) = render(frontend, &request, true, |i, m| m.text(i))?;
    let answer = ChatAnswer {
        tools,
        reasoning_started: rendered.trim_end().ends_with("<think>"),
    };
    let encode = |text: &str| {
        let ids = frontend
            .preprocessor
            .encode(text)
            .map_err(|e| ApiError::internal(format!("Cannot tokenize the prompt: {e}")))?;
        frontend.metrics.tokenized_tokens.inc_by(ids.len() as u64);
        Ok::<_, ApiError>(ids)
    };
    let prompt = &rendered;
    let continued = known
        .as_deref()
        .filter(|_| media.is_empty())
        .and_then(|known| known.split(prompt));
    let prompt = if let Some((mut ids, rest)) = continued {
        refuse_by_length(frontend, rest.len())?;
        ids.extend(encode(rest)?);
        Prompt::tokens(ids)
    } else if media.is_empty() {
        refuse_by_length(frontend, prompt.len())?;
        Prompt::tokens(encode(prompt)?)
    } else {
        refuse_by_length(frontend, prompt.len())?;
        let media_tokens: u64 = media.iter().map(|m| u64::from(m.tokens)).sum();
        let context = frontend.preprocessor.context_length();
        if media_tokens >= u64::from(context) {
            return Err(ApiError::context_length(format!(
                "This model's maximum context length is {context} tokens, but the request's media alone take {media_tokens} tokens."
            )));
        }
        let placeholder = frontend.media.config().placeholder_token;
        let (token_ids, spans) = crate::media::splice(prompt, &media, placeholder, encode)?;
        let mut prompt = Prompt::tokens(token_ids);
        prompt.media = spans;
        prompt
    };
    let mut params = request.common();
    if let Some(tools) = &answer.tools {
        params.structured.tool_choice = tools.constraint(frontend.parsers.tool_parser())?;
    }
    let logprobs = chat_logprobs(&params)?;
    let asked = Asked {
        generated: logprobs,
        prompt: false,
    };
    let (prepared, mode) = common(frontend, params, prompt, asked)?;
    Ok((prepared, mode, answer, rendered))
}

/// A completion request; with `echo`, the prompt's text, to go before the answer (and,
/// with `logprobs`, its tokens' log probabilities before the answer's).
pub fn completion(
    frontend: &Frontend,
    request: CompletionRequest,
) -> Result<(Prepared, Mode, Option<String>), ApiError> {
    check_model(frontend, &request.model)?;
    if let Some(best_of) = request.best_of {
        let n = request.n.unwrap_or(1);
        if best_of < n || best_of > 20 {
            return Err(ApiError::invalid_param(
                "best_of",
                format!("`best_of` must be between `n` ({n}) and 20, got {best_of}"),
            ));
        }
        // Choosing the best of more than `n` ranks them by log probability, which no
        // engine here reports.
        if best_of > n {
            return Err(ApiError::invalid_param(
                "best_of",
                format!("only best_of equal to `n` ({n}) is supported, got {best_of}"),
            ));
        }
    }
    if request.suffix.as_ref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::invalid_param(
            "suffix",
            "`suffix` (insertion) is not supported",
        ));
    }
    let encode = |text: &str| {
        refuse_by_length(frontend, text.len())?;
        let ids = frontend
            .preprocessor
            .encode_completion_prompt(text)
            .map_err(|e| ApiError::internal(format!("Cannot tokenize the prompt: {e}")))?;
        frontend.metrics.tokenized_tokens.inc_by(ids.len() as u64);
        Ok::<_, ApiError>(ids)
    };
    let batched = || {
        ApiError::invalid_param(
            "prompt",
            "batched prompts are not supported; send one prompt per request",
        )
    };
    let params = request.common();
    let echo = request.echo == Some(true);
    let mut text = None;
    let tokens = match request.prompt {
        PromptInput::Text(prompt) => {
            let tokens = encode(&prompt)?;
            text = Some(prompt);
            tokens
        }
        PromptInput::Texts(mut texts) => match texts.len() {
            1 => {
                let prompt = texts.pop().unwrap_or_default();
                let tokens = encode(&prompt)?;
                text = Some(prompt);
                tokens
            }
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
    let logprobs = completion_logprobs(&params)?;
    // Echoed: the prompt as sent, or as its tokens read.
    let echo = match (echo, text) {
        (false, _) => None,
        (true, Some(text)) => Some(text),
        (true, None) => Some(frontend.preprocessor.decode(&tokens).map_err(|e| {
            ApiError::invalid_param("prompt", format!("cannot read the prompt's tokens: {e}"))
        })?),
    };
    let asked = Asked {
        generated: logprobs,
        prompt: echo.is_some(),
    };
    let (prepared, mode) = common(frontend, params, Prompt::tokens(tokens), asked)?;
    Ok((prepared, mode, echo))
}

/// The most alternatives a request may ask log probabilities of (what the engines report).
pub const MAX_TOP_LOGPROBS: u32 = 20;

/// Chat's `logprobs` (a boolean) and `top_logprobs` (0 to 20, with `logprobs` only): how
/// many alternatives to report besides each generated token, if anything is to be.
fn chat_logprobs(params: &CommonParams) -> Result<Option<u32>, ApiError> {
    use serde_json::Value;
    let asked = match &params.logprobs {
        None | Some(Value::Null | Value::Bool(false)) => false,
        Some(Value::Bool(true)) => true,
        Some(other) => {
            return Err(ApiError::invalid_param(
                "logprobs",
                format!(
                    "`logprobs` must be a boolean in a chat completion, got {}",
                    crate::openai::error::echo(&other.to_string())
                ),
            ));
        }
    };
    match params.top_logprobs {
        Some(k) if k > MAX_TOP_LOGPROBS => Err(ApiError::invalid_param(
            "top_logprobs",
            format!("`top_logprobs` must be between 0 and {MAX_TOP_LOGPROBS}, got {k}"),
        )),
        Some(k) if k > 0 && !asked => Err(ApiError::invalid_param(
            "top_logprobs",
            "`top_logprobs` needs `logprobs` set to true",
        )),
        top => Ok(asked.then_some(top.unwrap_or(0))),
    }
}

/// Completions' `logprobs`: how many alternatives to report besides each generated token
/// (0 to 20; 0 reports the generated token's alone), if anything is to be.
fn completion_logprobs(params: &CommonParams) -> Result<Option<u32>, ApiError> {
    use serde_json::Value;
    if params.top_logprobs.is_some_and(|k| k > 0) {
        return Err(ApiError::invalid_param(
            "top_logprobs",
            "`top_logprobs` is a chat completion parameter; a completion takes the count in `logprobs`",
        ));
    }
    match &params.logprobs {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(k)) if k.as_u64().is_some_and(|k| k <= u64::from(MAX_TOP_LOGPROBS)) => {
            Ok(k.as_u64().map(|k| k as u32))
        }
        Some(other) => Err(ApiError::invalid_param(
            "logprobs",
            format!(
                "`logprobs` must be an integer between 0 and {MAX_TOP_LOGPROBS} in a completion, got {}",
                crate::openai::error::echo(&other.to_string())
            ),
        )),
    }
}

/// Refuses a prompt text of `bytes` bytes that no tokenization fits in the context (or in
/// `max_prompt_tokens`), before any tokenizing: see [`Preprocessor::fewest_tokens`].
///
/// [`Preprocessor::fewest_tokens`]: crate::preprocess::Preprocessor::fewest_tokens
fn refuse_by_length(frontend: &Frontend, bytes: usize) -> Result<(), ApiError> {
    let Some(fewest) = frontend.preprocessor.fewest_tokens(bytes) else {
        return Ok(());
    };
    let context = frontend.preprocessor.context_length();
    let known =
        format!("the prompt has {bytes} bytes: at least {fewest} tokens at any tokenization");
    if fewest >= u64::from(context) {
        return Err(ApiError::context_length(format!(
            "This model's maximum context length is {context} tokens, but {known}."
        )));
    }
    if let Some(limit) = frontend.config.max_prompt_tokens
        && fewest > u64::from(limit)
    {
        return Err(ApiError::context_length(format!(
            "This server accepts prompts of at most {limit} tokens, but {known}."
        )));
    }
    Ok(())
}

/// Refuses a chat request whose messages' text alone no tokenization fits in the context,
/// before its media are fetched and its template rendered (every template writes the
/// messages' text into the prompt).
pub fn refuse_messages_by_length(
    frontend: &Frontend,
    request: &ChatCompletionRequest,
) -> Result<(), ApiError> {
    use crate::openai::request::MessageContent;
    let bytes = request
        .messages
        .iter()
        .map(|m| match &m.content {
            None => 0,
            Some(MessageContent::Text(text)) => text.len(),
            Some(MessageContent::Parts(parts)) => parts
                .iter()
                .filter_map(|p| p.text.as_ref())
                .map(String::len)
                .sum(),
        })
        .sum();
    refuse_by_length(frontend, bytes)
}

pub fn check_model(frontend: &Frontend, model: &str) -> Result<(), ApiError> {
    if model == frontend.config.model {
        Ok(())
    } else {
        Err(ApiError::model_not_found(model))
    }
}

/// The log probabilities a request asks for: of each generated token and this many
/// alternatives; with `prompt` (a completion's `echo`), of its prompt's tokens too.
#[derive(Debug, Clone, Copy)]
struct Asked {
    generated: Option<u32>,
    prompt: bool,
}

fn common(
    frontend: &Frontend,
    params: CommonParams,
    prompt_in: Prompt,
    asked: Asked,
) -> Result<(Prepared, Mode), ApiError> {
    let logprobs = asked.generated;
    let prompt_logprobs = logprobs.filter(|_| asked.prompt);
    if prompt_in.token_ids.is_empty() {
        return Err(ApiError::invalid_param("prompt", "the prompt is empty"));
    }
    check_unsupported(&params)?;
    let constraint = crate::constraint::constraint(&params.structured)?;
    let vocabulary = frontend.preprocessor.vocabulary();
    let mut needs = Needs {
        constraint: constraint.as_ref().map(|(c, _)| (c.kind(), vocabulary)),
        ..Needs::default()
    };
    if let Some((constraint, param)) = &constraint
        && frontend.routing.unable(&needs).is_none()
    {
        return Err(ApiError::invalid_param(
            param,
            format!(
                "no worker serving this model enforces `{}` constraints{}",
                constraint.kind().name(),
                if vocabulary.is_none() {
                    " over this model's tokenizer"
                } else {
                    ""
                }
            ),
        ));
    }
    needs.logprobs = logprobs.is_some();
    if needs.logprobs && frontend.routing.unable(&needs).is_none() {
        return Err(ApiError::invalid_param(
            "logprobs",
            format!(
                "no worker serving this model reports log probabilities{}",
                if needs.constraint.is_some() {
                    " and enforces the request's constraint"
                } else {
                    ""
                }
            ),
        ));
    }
    needs.prompt_logprobs = prompt_logprobs.is_some();
    if needs.prompt_logprobs && frontend.routing.unable(&needs).is_none() {
        return Err(ApiError::invalid_param(
            "echo",
            "no worker serving this model reports a prompt's log probabilities (`echo` with `logprobs`)",
        ));
    }
    let logit_bias = logit_bias(&params, frontend.preprocessor.vocab_size())?;
    for (name, value) in [
        ("frequency_penalty", params.frequency_penalty),
        ("presence_penalty", params.presence_penalty),
    ] {
        if let Some(v) = value
            && !(v.is_finite() && (-2.0..=2.0).contains(&v))
        {
            return Err(ApiError::invalid_param(
                name,
                format!("`{name}` must be between -2 and 2, got {v}"),
            ));
        }
    }
    let context = frontend.preprocessor.context_length();
    let prompt = prompt_in.token_ids.len() as u64;
    let requested = params.max_completion_tokens.or(params.max_tokens);
    for (name, value) in [
        ("max_completion_tokens", params.max_completion_tokens),
        ("max_tokens", params.max_tokens),
    ] {
        if value == Some(0) {
            return Err(ApiError::invalid_param(
                name,
                format!("`{name}` must be at least 1"),
            ));
        }
    }
    if let Some(limit) = frontend.config.max_prompt_tokens
        && prompt > u64::from(limit)
    {
        return Err(ApiError::context_length(format!(
            "This server accepts prompts of at most {limit} tokens, but the prompt has {prompt} tokens."
        )));
    }
    if let (Some(limit), Some(asked)) = (frontend.config.max_output_tokens, requested)
        && asked > limit
    {
        let name = if params.max_completion_tokens.is_some() {
            "max_completion_tokens"
        } else {
            "max_tokens"
        };
        return Err(ApiError::invalid_param(
            name,
            format!("`{name}` is at most {limit} on this server, got {asked}"),
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
        None => room
            .min(u64::from(frontend.config.default_max_tokens))
            .min(u64::from(
                frontend.config.max_output_tokens.unwrap_or(u32::MAX),
            )) as u32,
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
    let top_k = match params.top_k {
        None | Some(-1 | 0) => None,
        Some(k) if k > 0 => Some(u32::try_from(k).unwrap_or(u32::MAX)),
        Some(k) => {
            return Err(ApiError::invalid_param(
                "top_k",
                format!("`top_k` must be -1, 0 (all tokens) or positive, got {k}"),
            ));
        }
    };
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
    if params.stream_options.is_some() && !stream {
        return Err(ApiError::invalid_param(
            "stream_options",
            "`stream_options` is only allowed when `stream` is true",
        ));
    }
    let mode = Mode {
        stream,
        include_usage: params
            .stream_options
            .is_some_and(|o| o.include_usage == Some(true)),
        choices: params.n.unwrap_or(1),
        logprobs,
    };
    let prepared = Prepared {
        prompt: prompt_in,
        max_tokens,
        sampling: SamplingParams {
            temperature: params.temperature,
            top_p: params.top_p,
            top_k,
            seed: params.seed.map(|s| s as u64),
            frequency_penalty: params.frequency_penalty.map(|v| v as f32),
            presence_penalty: params.presence_penalty.map(|v| v as f32),
            logprobs,
            prompt_logprobs,
            logit_bias,
            vocabulary: constraint
                .as_ref()
                .and_then(|_| frontend.preprocessor.vocabulary())
                .map(str::to_owned),
            constraint: constraint.map(|(constraint, _)| constraint),
            stop_token_ids: if params.ignore_eos == Some(true) {
                Vec::new()
            } else {
                frontend.preprocessor.eos_token_ids().to_vec()
            },
        },
        stop,
        priority: extension.priority,
        tenant: None,
        span: tracing::Span::current(),
        overrides: RoutingOverrides {
            policy: routing.policy,
            overlap_weight: routing.overlap_weight,
            temperature: routing.temperature,
            ..RoutingOverrides::default()
        },
        media: None,
        features: Default::default(),
        hold: None,
        choice: 0,
        keep_special_tokens: false,
        keep_generated: false,
    };
    Ok((prepared, mode))
}

/// Parameters OpenAI defines that no Switchyard engine honours yet: a 400 naming each one
/// when it asks for something (its neutral values pass), never silently ignored.
fn check_unsupported(params: &CommonParams) -> Result<(), ApiError> {
    let unsupported = |param: &str, message: String| Err(ApiError::invalid_param(param, message));
    if let Some(n) = params.n
        && !(1..=MAX_CHOICES).contains(&n)
    {
        return unsupported(
            "n",
            format!("`n` must be between 1 and {MAX_CHOICES}, got {n}"),
        );
    }
    for (name, value, neutral) in [
        ("min_p", params.min_p, 0.0),
        ("repetition_penalty", params.repetition_penalty, 1.0),
    ] {
        if let Some(v) = value
            && v != neutral
        {
            return unsupported(
                name,
                format!("`{name}` is not supported (only its neutral value {neutral})"),
            );
        }
    }
    if params.min_tokens.is_some_and(|m| m > 0) {
        return unsupported(
            "min_tokens",
            "`min_tokens` is not supported (only 0)".into(),
        );
    }
    for (name, value) in [
        ("reasoning_effort", &params.reasoning_effort),
        ("verbosity", &params.verbosity),
    ] {
        if value.is_some() {
            return unsupported(name, format!("`{name}` is not supported"));
        }
    }
    if params.web_search {
        return unsupported("web_search_options", "web search is not supported".into());
    }
    if let Some(modalities) = &params.modalities
        && let Some(other) = modalities.iter().find(|m| m.as_str() != "text")
    {
        return unsupported(
            "modalities",
            format!(
                "only the `text` output modality is supported, got `{}`",
                crate::openai::error::echo(other)
            ),
        );
    }
    if params.audio.as_ref().is_some_and(|a| !a.is_null()) {
        return unsupported("audio", "audio output is not supported".into());
    }
    Ok(())
}

/// Most tokens one request may bias (so a request cannot ban a whole vocabulary, and its
/// rules stay cheap for engines that apply them per token).
const MAX_LOGIT_BIAS: usize = 1_024;

/// `logit_bias`: token ids (as JSON object keys) in the vocabulary, biases in [-100, 100].
fn logit_bias(params: &CommonParams, vocab: u32) -> Result<Vec<(u32, f32)>, ApiError> {
    let Some(map) = &params.logit_bias else {
        return Ok(Vec::new());
    };
    if map.len() > MAX_LOGIT_BIAS {
        return Err(ApiError::invalid_param(
            "logit_bias",
            format!(
                "at most {MAX_LOGIT_BIAS} tokens may be biased, got {}",
                map.len()
            ),
        ));
    }
    let mut bias = Vec::with_capacity(map.len());
    for (key, &value) in map {
        let token = key
            .parse::<u32>()
            .ok()
            .filter(|&t| t < vocab)
            .ok_or_else(|| {
                ApiError::invalid_param(
                    "logit_bias",
                    format!(
                        "keys must be token ids below the vocabulary size {vocab}, got `{}`",
                        crate::openai::error::echo(key)
                    ),
                )
            })?;
        if !(value.is_finite() && (-100.0..=100.0).contains(&value)) {
            return Err(ApiError::invalid_param(
                "logit_bias",
                format!("biases must be between -100 and 100, got {value} for token {token}"),
            ));
        }
        bias.push((token, value as f32));
    }
    bias.sort_unstable_by_key(|&(token, _)| token);
    Ok(bias)
}

#[cfg(test)]
mod tests {
    use super::Known;

    #[test]
    fn a_known_start_gives_its_tokens_and_the_rest() {
        let known = Known {
            prompt: "<s>user: hi\nbot: ".into(),
            prompt_ids: vec![1, 2, 3],
            answer: "hello</s>".into(),
            answer_ids: vec![7, 8],
        };
        // Prompt and answer as they were, then the new turn.
        let (ids, rest) = known
            .split("<s>user: hi\nbot: hello</s>user: more")
            .unwrap();
        assert_eq!((ids, rest), (vec![1, 2, 3, 7, 8], "user: more"));
        // The answer rendered otherwise (a tool call re-written by the template): the
        // prompt's tokens only.
        let (ids, rest) = known
            .split("<s>user: hi\nbot: [call]</s>user: more")
            .unwrap();
        assert_eq!((ids, rest), (vec![1, 2, 3], "[call]</s>user: more"));
        // Other instructions: nothing known.
        assert!(known.split("<s>system: terse\nuser: hi").is_none());
    }
}
