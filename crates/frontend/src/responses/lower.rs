//! A Responses request lowered into the chat request the chat endpoint serves: its input
//! items become messages, its function tools and `text.format` the chat's, so everything
//! after (templates, tool parsing, constraints, routing) is the chat endpoint's.

use openai_protocol::responses::{
    ResponseContentPart, ResponseInput, ResponseInputOutputItem, ResponseTool, ResponsesRequest,
    ResponsesToolChoice, StringOrContentParts, TextFormat, ToolChoiceOptions, Truncation,
    Verbosity,
};
use serde_json::{Map, Value, json};
use validator::Validate;

use crate::openai::ApiError;
use crate::openai::request::ChatCompletionRequest;

/// A Responses request as a chat request, and the conversation it continues.
#[derive(Debug)]
pub struct Lowered {
    pub chat: ChatCompletionRequest,
    /// The conversation's messages up to this turn's answer, without `instructions` (a
    /// follow-up's own replace them): what a stored response keeps, its answer added.
    pub history: Vec<Value>,
}

/// Lowers `request`, continuing `previous` (a stored response's history) when it has one.
pub fn lower(request: &ResponsesRequest, previous: &[Value]) -> Result<Lowered, ApiError> {
    check(request)?;
    let mut history = previous.to_vec();
    match &request.input {
        ResponseInput::Text(text) => history.push(json!({"role": "user", "content": text})),
        ResponseInput::Items(items) => {
            for (i, item) in items.iter().enumerate() {
                push_item(&mut history, i, item)?;
            }
        }
    }
    let mut messages = Vec::with_capacity(history.len() + 1);
    if let Some(instructions) = &request.instructions {
        messages.push(json!({"role": "system", "content": instructions}));
    }
    messages.extend(history.iter().cloned());
    let mut chat = Map::new();
    chat.insert("model".into(), json!(request.model));
    chat.insert("messages".into(), Value::Array(messages));
    let mut put = |key: &str, value: Option<Value>| {
        if let Some(value) = value {
            chat.insert(key.into(), value);
        }
    };
    put("stream", request.stream.map(Value::Bool));
    put(
        "max_completion_tokens",
        request.max_output_tokens.map(|t| json!(t)),
    );
    put("temperature", request.temperature.map(|t| json!(t)));
    put("top_p", request.top_p.map(|t| json!(t)));
    put(
        "frequency_penalty",
        request.frequency_penalty.map(|p| json!(p)),
    );
    put(
        "presence_penalty",
        request.presence_penalty.map(|p| json!(p)),
    );
    put(
        "stop",
        request
            .stop
            .as_ref()
            .and_then(|s| serde_json::to_value(s).ok()),
    );
    // vLLM's sampling extensions, at their neutral values unless sent.
    put("top_k", (request.top_k > 0).then(|| json!(request.top_k)));
    put(
        "min_p",
        (request.min_p != 0.0).then(|| json!(request.min_p)),
    );
    put(
        "repetition_penalty",
        (request.repetition_penalty != 1.0).then(|| json!(request.repetition_penalty)),
    );
    put(
        "parallel_tool_calls",
        request.parallel_tool_calls.map(Value::Bool),
    );
    put("tools", tools(request)?);
    put("tool_choice", tool_choice(request)?);
    put("response_format", response_format(request));
    let chat = crate::http::body_from_value::<ChatCompletionRequest>(Value::Object(chat))?;
    Ok(Lowered { chat, history })
}

/// An error of the lowered chat request, naming the Responses parameter it came from.
pub fn renamed(mut error: ApiError) -> ApiError {
    let Some(param) = error.param.take() else {
        return error;
    };
    let renamed = if let Some(rest) = param.strip_prefix("tools[") {
        // `tools[i].function.strict` was `tools[i].strict`.
        format!("tools[{}", rest.replacen("].function.", "].", 1))
    } else if param == "max_completion_tokens" || param == "max_tokens" {
        "max_output_tokens".to_string()
    } else if param.starts_with("response_format") {
        "text.format".to_string()
    } else if param.starts_with("messages") {
        // The conversation, the stored turns before this input included.
        "input".to_string()
    } else {
        param
    };
    error.param = Some(renamed);
    error
}

/// The shape of `input` and `tool_choice`, checked in the parsed JSON before it is read
/// as their types (untagged unions, whose own errors cannot say which part is wrong).
pub fn check_shape(body: &Value) -> Result<(), ApiError> {
    const ROLES: [&str; 4] = ["user", "assistant", "system", "developer"];
    const KINDS: &str = "`message`, `function_call`, `function_call_output` or `reasoning`";
    const SERVED: [&str; 5] = [
        "message",
        "function_call",
        "function_call_output",
        "reasoning",
        "item_reference",
    ];
    match body.get("input") {
        None | Some(Value::String(_)) => {}
        Some(Value::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                let at = format!("input[{i}]");
                let Some(item) = item.as_object() else {
                    return Err(ApiError::invalid_param(
                        &at,
                        "an input item must be an object",
                    ));
                };
                if let Some(kind) = item.get("type")
                    && !kind.is_string()
                {
                    return Err(ApiError::invalid_param(
                        &format!("{at}.type"),
                        format!("`type` must be a string: {KINDS}"),
                    ));
                }
                let kind = item.get("type").and_then(Value::as_str);
                if let Some(kind) = kind
                    && !SERVED.contains(&kind)
                {
                    return Err(ApiError::invalid_param(
                        &format!("{at}.type"),
                        format!(
                            "input items of type `{}` are not supported: {KINDS}",
                            crate::openai::error::echo(kind)
                        ),
                    ));
                }
                let role = item.get("role").and_then(Value::as_str);
                let message =
                    kind == Some("message") || (kind.is_none() && item.contains_key("role"));
                if message && !role.is_some_and(|r| ROLES.contains(&r)) {
                    return Err(ApiError::invalid_param(
                        &format!("{at}.role"),
                        format!("a message's `role` must be one of {}", ROLES.join(", ")),
                    ));
                }
                if kind.is_none() && !message && !item.contains_key("id") {
                    return Err(ApiError::invalid_param(
                        &at,
                        format!("an input item needs a `type`: {KINDS}"),
                    ));
                }
            }
        }
        Some(_) => {
            return Err(ApiError::invalid_param(
                "input",
                "`input` must be a string or an array of items (messages, `function_call`, `function_call_output`)",
            ));
        }
    }
    match body.get("tool_choice") {
        None | Some(Value::Null | Value::Object(_)) => {}
        Some(Value::String(s)) if ["none", "auto", "required"].contains(&s.as_str()) => {}
        Some(_) => {
            return Err(ApiError::invalid_param(
                "tool_choice",
                "`tool_choice` must be `none`, `auto`, `required` or {\"type\": \"function\", \"name\": ...}",
            ));
        }
    }
    Ok(())
}

/// What the request asks that is checked before lowering: the schema's own rules, and
/// the parameters this server does not serve (a 400 naming each).
fn check(request: &ResponsesRequest) -> Result<(), ApiError> {
    request.validate().map_err(|errors| {
        let (field, message) = errors
            .field_errors()
            .into_iter()
            .next()
            .map(|(field, errors)| {
                let message = errors
                    .first()
                    .map(|e| e.message.as_deref().unwrap_or(&e.code).to_string())
                    .unwrap_or_default();
                (field.to_string(), message)
            })
            .unwrap_or_else(|| (String::new(), errors.to_string()));
        match field.as_str() {
            // A rule across fields; its message names the one it is about.
            "" | "__all__" => match message
                .strip_prefix("Invalid value for '")
                .and_then(|rest| rest.split_once('\''))
            {
                Some((param, _)) => ApiError::invalid_param(param, message.clone()),
                None => ApiError::invalid(message),
            },
            field => ApiError::invalid_param(field, format!("invalid `{field}`: {message}")),
        }
    })?;
    // What this server does not serve, a 400 naming it when asked for.
    let refused: [(bool, &str, &str); 10] = [
        (
            request.background == Some(true),
            "background",
            "`background` responses are not supported; stream the response instead",
        ),
        (
            request.conversation.is_some(),
            "conversation",
            "`conversation` (the Conversations API) is not supported; continue with `previous_response_id`",
        ),
        (
            request.prompt.is_some(),
            "prompt",
            "stored prompt templates (`prompt`) are not supported",
        ),
        (
            request.include.as_ref().is_some_and(|i| !i.is_empty()),
            "include",
            "`include` is not supported (nothing extra can be included)",
        ),
        (
            request.top_logprobs.is_some_and(|k| k > 0),
            "top_logprobs",
            "log probabilities are not served on /v1/responses; use /v1/chat/completions",
        ),
        (
            matches!(request.truncation, Some(Truncation::Auto)),
            "truncation",
            "`truncation: auto` is not supported: a conversation longer than the context is refused",
        ),
        (
            request.context_management.is_some(),
            "context_management",
            "`context_management` is not supported",
        ),
        (
            request.max_tool_calls.is_some(),
            "max_tool_calls",
            "`max_tool_calls` is not supported",
        ),
        (
            request.priority != 0,
            "priority",
            "`priority` is not supported here; API keys set a request's tier",
        ),
        (
            request
                .reasoning
                .as_ref()
                .is_some_and(|r| r.effort.is_some() || r.summary.is_some()),
            "reasoning",
            "`reasoning` options are not supported",
        ),
    ];
    if let Some((_, param, why)) = refused.into_iter().find(|(asked, ..)| *asked) {
        return Err(ApiError::invalid_param(param, why));
    }
    if let Some(text) = &request.text
        && text.verbosity.is_some_and(|v| v != Verbosity::Medium)
    {
        return Err(ApiError::invalid_param(
            "text.verbosity",
            "only `medium` verbosity is supported",
        ));
    }
    Ok(())
}

/// One input item as chat messages: a message, a call (joined to the assistant message
/// before it), a call's output (a `tool` message). Reasoning items of earlier answers are
/// left out, as chat templates leave out earlier turns' reasoning.
fn push_item(
    messages: &mut Vec<Value>,
    i: usize,
    item: &ResponseInputOutputItem,
) -> Result<(), ApiError> {
    let at = format!("input[{i}]");
    match item {
        ResponseInputOutputItem::Message { role, content, .. } => {
            let content = parts(&format!("{at}.content"), content)?;
            messages.push(json!({"role": role, "content": content}));
        }
        ResponseInputOutputItem::SimpleInputMessage { role, content, .. } => {
            let content = match content {
                StringOrContentParts::String(text) => json!(text),
                StringOrContentParts::Array(list) => parts(&format!("{at}.content"), list)?,
            };
            messages.push(json!({"role": role, "content": content}));
        }
        ResponseInputOutputItem::FunctionToolCall {
            call_id,
            name,
            namespace,
            arguments,
            ..
        } => {
            let name = match namespace {
                Some(namespace) => format!("{namespace}.{name}"),
                None => name.clone(),
            };
            // A call the stored conversation already has (sent back with its output).
            let known = messages.iter().any(|m| {
                m["tool_calls"]
                    .as_array()
                    .is_some_and(|calls| calls.iter().any(|c| c["id"] == json!(call_id)))
            });
            if known {
                return Ok(());
            }
            let call = json!({"id": call_id, "type": "function",
                "function": {"name": name, "arguments": arguments}});
            match messages.last_mut() {
                Some(last) if last["role"] == "assistant" => {
                    let calls = last
                        .as_object_mut()
                        .map(|m| m.entry("tool_calls").or_insert_with(|| json!([])));
                    if let Some(Value::Array(calls)) = calls {
                        calls.push(call);
                    }
                }
                _ => messages
                    .push(json!({"role": "assistant", "content": null, "tool_calls": [call]})),
            }
        }
        ResponseInputOutputItem::FunctionCallOutput {
            call_id, output, ..
        } => {
            let output = output.to_text_only().map_err(|_| {
                ApiError::invalid_param(
                    &format!("{at}.output"),
                    "a function call's output must be text",
                )
            })?;
            // Named after its call, for templates that write a tool result's name.
            let name = messages.iter().rev().find_map(|m| {
                m["tool_calls"].as_array()?.iter().find_map(|c| {
                    (c["id"] == json!(call_id)).then(|| c["function"]["name"].clone())
                })
            });
            let mut message = json!({"role": "tool", "tool_call_id": call_id, "content": output});
            if let Some(name) = name.filter(Value::is_string) {
                message["name"] = name;
            }
            messages.push(message);
        }
        ResponseInputOutputItem::Reasoning { .. } => {}
        ResponseInputOutputItem::ItemReference { id, .. } => {
            return Err(ApiError::invalid_param(
                &at,
                format!(
                    "item references (`{}`) are not supported; send the item, or continue with `previous_response_id`",
                    crate::openai::error::echo(id)
                ),
            ));
        }
        other => {
            let kind = kind_of(other);
            return Err(ApiError::invalid_param(
                &format!("{at}.type"),
                format!(
                    "input items of type `{kind}` are not supported (only messages, `function_call` and `function_call_output`)"
                ),
            ));
        }
    }
    Ok(())
}

/// A message's content parts as chat content: one text as a string, else chat parts.
fn parts(at: &str, content: &[ResponseContentPart]) -> Result<Value, ApiError> {
    let mut out = Vec::with_capacity(content.len());
    for (j, part) in content.iter().enumerate() {
        out.push(match part {
            ResponseContentPart::InputText { text }
            | ResponseContentPart::OutputText { text, .. }
            | ResponseContentPart::Refusal { refusal: text } => {
                json!({"type": "text", "text": text})
            }
            ResponseContentPart::InputImage {
                image_url: Some(url),
                detail,
                ..
            } => {
                let mut image = json!({"url": url});
                if let Some(detail) = detail.as_ref().and_then(|d| serde_json::to_value(d).ok()) {
                    image["detail"] = detail;
                }
                json!({"type": "image_url", "image_url": image})
            }
            ResponseContentPart::InputImage { .. } => {
                return Err(ApiError::invalid_param(
                    &format!("{at}[{j}]"),
                    "an image is sent by `image_url` (files are not stored here)",
                ));
            }
            ResponseContentPart::InputFile { .. } => {
                return Err(ApiError::invalid_param(
                    &format!("{at}[{j}]"),
                    "file inputs are not supported",
                ));
            }
        });
    }
    if let [one] = out.as_slice()
        && one["type"] == "text"
    {
        return Ok(one["text"].clone());
    }
    Ok(Value::Array(out))
}

/// The `type` an item or tool is tagged with.
fn kind_of(tagged: &impl serde::Serialize) -> String {
    serde_json::to_value(tagged)
        .ok()
        .and_then(|v| v.get("type").and_then(Value::as_str).map(str::to_string))
        .unwrap_or_default()
}

/// Function tools in the chat's shape; any other kind is refused by name.
fn tools(request: &ResponsesRequest) -> Result<Option<Value>, ApiError> {
    let Some(tools) = &request.tools else {
        return Ok(None);
    };
    let mut out = Vec::with_capacity(tools.len());
    for (i, tool) in tools.iter().enumerate() {
        match tool {
            ResponseTool::Function(function) => {
                let function = serde_json::to_value(function)
                    .map_err(|e| ApiError::invalid_param(&format!("tools[{i}]"), e.to_string()))?;
                out.push(json!({"type": "function", "function": function}));
            }
            other => {
                let kind = kind_of(other);
                return Err(ApiError::invalid_param(
                    &format!("tools[{i}].type"),
                    format!("`{kind}` tools are not supported: only `function` tools"),
                ));
            }
        }
    }
    Ok((!out.is_empty()).then_some(Value::Array(out)))
}

fn tool_choice(request: &ResponsesRequest) -> Result<Option<Value>, ApiError> {
    Ok(match &request.tool_choice {
        None => None,
        Some(ResponsesToolChoice::Options(options)) => Some(json!(match options {
            ToolChoiceOptions::None => "none",
            ToolChoiceOptions::Auto => "auto",
            ToolChoiceOptions::Required => "required",
        })),
        Some(choice @ ResponsesToolChoice::Function(_)) => {
            let name = choice.function_name().unwrap_or_default();
            Some(json!({"type": "function", "function": {"name": name}}))
        }
        Some(_) => {
            return Err(ApiError::invalid_param(
                "tool_choice",
                "only `none`, `auto`, `required` or a named function are supported",
            ));
        }
    })
}

/// `text.format` as the chat's `response_format`.
fn response_format(request: &ResponsesRequest) -> Option<Value> {
    match request.text.as_ref()?.format.as_ref()? {
        TextFormat::Text => None,
        TextFormat::JsonObject => Some(json!({"type": "json_object"})),
        TextFormat::JsonSchema {
            name,
            schema,
            description,
            strict,
        } => {
            let mut json_schema = json!({"name": name, "schema": schema});
            if let Some(description) = description {
                json_schema["description"] = json!(description);
            }
            if let Some(strict) = strict {
                json_schema["strict"] = json!(strict);
            }
            Some(json!({"type": "json_schema", "json_schema": json_schema}))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(body: Value) -> ResponsesRequest {
        let mut base = json!({"model": "m"});
        for (k, v) in body.as_object().unwrap() {
            base[k] = v.clone();
        }
        serde_json::from_value(base).unwrap()
    }

    fn messages(lowered: &Lowered) -> Vec<Value> {
        lowered
            .chat
            .messages
            .iter()
            .map(|m| {
                let mut out = json!({"role": m.role});
                if let Some(id) = &m.tool_call_id {
                    out["tool_call_id"] = json!(id);
                }
                if let Some(calls) = &m.tool_calls {
                    out["calls"] = json!(
                        calls
                            .iter()
                            .map(|c| c.function.name.clone())
                            .collect::<Vec<_>>()
                    );
                }
                out
            })
            .collect()
    }

    #[test]
    fn instructions_lead_but_are_not_history() {
        let lowered = lower(
            &request(json!({"input": "Hi", "instructions": "Be brief."})),
            &[
                json!({"role": "user", "content": "Before"}),
                json!({"role": "assistant", "content": "Yes"}),
            ],
        )
        .unwrap();
        assert_eq!(
            messages(&lowered),
            [
                json!({"role": "system"}),
                json!({"role": "user"}),
                json!({"role": "assistant"}),
                json!({"role": "user"})
            ]
        );
        assert_eq!(lowered.history.len(), 3);
        assert_eq!(lowered.history[2], json!({"role": "user", "content": "Hi"}));
    }

    #[test]
    fn calls_join_their_assistant_message_and_outputs_become_tool_messages() {
        let input = json!([
            {"role": "user", "content": "Weather in Paris and Rome?"},
            {"type": "message", "id": "msg_1", "role": "assistant", "content": [{"type": "output_text", "text": "Looking."}]},
            {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": "{\"city\":\"Paris\"}"},
            {"type": "function_call", "call_id": "c2", "name": "weather", "arguments": "{\"city\":\"Rome\"}"},
            {"type": "function_call_output", "call_id": "c1", "output": "18C"},
            {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "21C"}]},
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"type": "function_call", "call_id": "c3", "name": "clock", "arguments": "{}"}
        ]);
        let lowered = lower(&request(json!({"input": input})), &[]).unwrap();
        assert_eq!(
            messages(&lowered),
            [
                json!({"role": "user"}),
                json!({"role": "assistant", "calls": ["weather", "weather"]}),
                json!({"role": "tool", "tool_call_id": "c1"}),
                json!({"role": "tool", "tool_call_id": "c2"}),
                json!({"role": "assistant", "calls": ["clock"]}),
            ]
        );
        assert_eq!(lowered.history[1]["content"], "Looking.");
        assert_eq!(lowered.history[3]["content"], "21C");
    }

    #[test]
    fn a_call_sent_back_with_its_output_is_not_doubled_and_the_output_is_named() {
        let previous = [
            json!({"role": "user", "content": "Weather?"}),
            json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}]}),
        ];
        let input = json!([
            {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "18C"}
        ]);
        let lowered = lower(&request(json!({"input": input})), &previous).unwrap();
        assert_eq!(lowered.history.len(), 3);
        assert_eq!(
            lowered.history[1]["tool_calls"].as_array().unwrap().len(),
            1
        );
        assert_eq!(lowered.history[2]["name"], "weather");
    }

    #[test]
    fn chat_errors_name_the_responses_parameter() {
        for (chat, responses) in [
            ("tools[2].function.strict", "tools[2].strict"),
            ("max_completion_tokens", "max_output_tokens"),
            ("response_format.json_schema.schema", "text.format"),
            ("messages[3].content", "input"),
            ("temperature", "temperature"),
        ] {
            let error = renamed(ApiError::invalid_param(chat, "x"));
            assert_eq!(error.param.as_deref(), Some(responses));
        }
    }

    #[test]
    fn tools_tool_choice_and_text_format_take_the_chat_shapes() {
        let lowered = lower(
            &request(json!({
                "input": "Hi",
                "tools": [{"type": "function", "name": "weather", "parameters": {"type": "object"}}],
                "tool_choice": {"type": "function", "name": "weather"},
                "text": {"format": {"type": "json_schema", "name": "out", "schema": {"type": "object"}, "strict": true}},
                "max_output_tokens": 9,
                "stream": true
            })),
            &[],
        )
        .unwrap();
        let chat = &lowered.chat;
        let tools = serde_json::to_value(chat.tools.as_ref().unwrap()).unwrap();
        assert_eq!(tools[0]["function"]["name"], "weather");
        assert_eq!(tools[0]["type"], "function");
        assert!(matches!(
            &chat.tool_choice,
            Some(crate::openai::request::ToolChoiceIn::Named(named)) if named.function.name == "weather"
        ));
        assert_eq!(chat.max_completion_tokens, Some(9));
        assert_eq!(chat.stream, Some(true));
        let format = chat.response_format.as_ref().unwrap();
        assert_eq!(format.kind, "json_schema");
        let schema = format.json_schema.as_ref().unwrap();
        assert_eq!((schema.name.as_str(), schema.strict), ("out", Some(true)));
    }

    #[test]
    fn what_is_not_served_is_refused_by_name() {
        for (body, param) in [
            (json!({"input": "Hi", "background": true}), "background"),
            (
                json!({"input": "Hi", "tools": [{"type": "web_search"}]}),
                "tools[0].type",
            ),
            (
                json!({"input": "Hi", "tool_choice": {"type": "file_search"}}),
                "tool_choice",
            ),
            (
                json!({"input": [{"type": "item_reference", "id": "x"}]}),
                "input[0]",
            ),
            (json!({"input": "", "max_output_tokens": 4}), "input"),
        ] {
            let error = lower(&request(body.clone()), &[]).unwrap_err();
            assert!(
                error.param.as_deref() == Some(param) || error.message.contains(param),
                "{body}: {error:?}"
            );
        }
    }
}
