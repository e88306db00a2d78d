//! The tools and the history's calls in the prompt.
//!
//! A template with a tool section (it reads `tools`) gets the tools and the messages as
//! Hugging Face templates expect them: assistant turns carry `tool_calls` whose `arguments`
//! are JSON objects, tool results carry `tool_call_id`.
//!
//! A template without one (the built-in templates, SmolLM2-135M's) gets the default format,
//! written into the messages themselves:
//! - a system message (before the first one's text, or a new first message) lists each
//!   tool's OpenAI object as one JSON line between `<tools>` and `</tools>`, and asks for
//!   each call as `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`;
//! - an assistant turn's calls follow its text in that same form;
//! - a tool result becomes a `user` message holding `<tool_response>...</tool_response>`.
//!
//! The answers are then read by the `qwen` parser, whose format this is.

use crate::openai::ApiError;
use crate::openai::request::ChatMessageIn;
use crate::preprocess::{ChatMessage, TemplateFunction, TemplateToolCall};

/// The opening of the default format's system text.
const PREAMBLE: &str = "You may call functions to answer. The functions available, one JSON \
object per line:\n<tools>\n";

/// The default format's instructions after the list.
const INSTRUCTIONS: &str = "</tools>\nTo call a function, write a JSON object with its name \
and its arguments between <tool_call> and </tool_call>, one call per pair of tags:\n\
<tool_call>\n{\"name\": \"function_name\", \"arguments\": {\"argument\": \"value\"}}\n</tool_call>";

/// A message of the request as the template sees it: its text (from `text`) with the calls
/// and call id it carries, checked.
pub fn message(
    index: usize,
    message: &ChatMessageIn,
    text: String,
) -> Result<ChatMessage, ApiError> {
    let mut out = ChatMessage::new(message.role.clone(), text);
    if message.function_call.as_ref().is_some_and(|c| !c.is_null()) {
        return Err(ApiError::invalid_param(
            &format!("messages[{index}].function_call"),
            "a legacy `function_call` in the history is not supported; send `tool_calls`",
        ));
    }
    if let Some(calls) = &message.tool_calls {
        if message.role != "assistant" {
            return Err(ApiError::invalid_param(
                &format!("messages[{index}].tool_calls"),
                "only assistant messages carry `tool_calls`",
            ));
        }
        for (j, call) in calls.iter().enumerate() {
            let at = format!("messages[{index}].tool_calls[{j}]");
            if call.kind != "function" {
                return Err(ApiError::invalid_param(
                    &format!("{at}.type"),
                    "tool calls are of type `function`",
                ));
            }
            let arguments: serde_json::Value = serde_json::from_str(&call.function.arguments)
                .map_err(|e| {
                    ApiError::invalid_param(
                        &format!("{at}.function.arguments"),
                        format!("`arguments` must be a JSON text: {e}"),
                    )
                })?;
            out.tool_calls.push(TemplateToolCall {
                id: call.id.clone(),
                kind: "function".into(),
                function: TemplateFunction {
                    name: call.function.name.clone(),
                    arguments,
                },
            });
        }
    }
    if message.role == "tool" {
        let Some(id) = &message.tool_call_id else {
            return Err(ApiError::invalid_param(
                &format!("messages[{index}].tool_call_id"),
                "a `tool` message needs the `tool_call_id` it answers",
            ));
        };
        out.tool_call_id = Some(id.clone());
    }
    out.name = message.name.clone();
    Ok(out)
}

/// Whether the messages need the default format: a template without a tool section, and
/// tools to show or calls and results in the history.
pub fn needs_default_format(
    template_handles_tools: bool,
    tools: &[serde_json::Value],
    messages: &[ChatMessage],
) -> bool {
    !template_handles_tools
        && (!tools.is_empty()
            || messages
                .iter()
                .any(|m| !m.tool_calls.is_empty() || m.role == "tool"))
}

/// The messages in the default format (see the module's documentation).
pub fn default_format(messages: Vec<ChatMessage>, tools: &[serde_json::Value]) -> Vec<ChatMessage> {
    let mut out = Vec::with_capacity(messages.len() + 1);
    let mut messages = messages.into_iter().peekable();
    if !tools.is_empty() {
        let mut system = String::from(PREAMBLE);
        for tool in tools {
            system.push_str(&tool.to_string());
            system.push('\n');
        }
        system.push_str(INSTRUCTIONS);
        match messages.peek() {
            Some(first) if first.role == "system" || first.role == "developer" => {
                let first = messages.next().unwrap_or_default();
                let text = if first.content.is_empty() {
                    system
                } else {
                    format!("{}\n\n{system}", first.content)
                };
                out.push(ChatMessage::new(first.role, text));
            }
            _ => out.push(ChatMessage::new("system", system)),
        }
    }
    for message in messages {
        if message.role == "tool" {
            out.push(ChatMessage::new(
                "user",
                format!("<tool_response>\n{}\n</tool_response>", message.content),
            ));
            continue;
        }
        let mut text = message.content;
        for call in &message.tool_calls {
            if !text.is_empty() {
                text.push('\n');
            }
            let name = serde_json::Value::from(call.function.name.as_str());
            let arguments = &call.function.arguments;
            text.push_str(&format!(
                "<tool_call>\n{{\"name\": {name}, \"arguments\": {arguments}}}\n</tool_call>"
            ));
        }
        out.push(ChatMessage::new(message.role, text));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(name: &str, arguments: serde_json::Value) -> TemplateToolCall {
        TemplateToolCall {
            id: "c1".into(),
            kind: "function".into(),
            function: TemplateFunction {
                name: name.into(),
                arguments,
            },
        }
    }

    #[test]
    fn the_default_format_lists_tools_and_writes_the_history_as_text() {
        let tool = serde_json::json!({"type": "function", "function": {"name": "weather"}});
        let mut assistant = ChatMessage::new("assistant", "");
        assistant.tool_calls = vec![call("weather", serde_json::json!({"city": "Oslo"}))];
        let mut result = ChatMessage::new("tool", "4 degrees");
        result.tool_call_id = Some("c1".into());
        let out = default_format(
            vec![
                ChatMessage::new("system", "Be brief."),
                ChatMessage::new("user", "Weather in Oslo?"),
                assistant,
                result,
            ],
            std::slice::from_ref(&tool),
        );
        assert_eq!(out.len(), 4);
        assert_eq!(out[0].role, "system");
        assert!(out[0].content.starts_with("Be brief.\n\nYou may call"));
        assert!(
            out[0]
                .content
                .contains(&format!("<tools>\n{tool}\n</tools>"))
        );
        assert_eq!(
            out[2].content,
            "<tool_call>\n{\"name\": \"weather\", \"arguments\": {\"city\":\"Oslo\"}}\n</tool_call>"
        );
        assert_eq!(out[3].role, "user");
        assert_eq!(
            out[3].content,
            "<tool_response>\n4 degrees\n</tool_response>"
        );
        assert!(out.iter().all(|m| m.tool_calls.is_empty()));
    }

    #[test]
    fn without_a_system_message_one_is_added() {
        let tool = serde_json::json!({"type": "function", "function": {"name": "f"}});
        let out = default_format(vec![ChatMessage::new("user", "hi")], &[tool]);
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].role, "system");
        assert_eq!(out[1].content, "hi");
        // No tools: only the history is rewritten.
        let out = default_format(vec![ChatMessage::new("user", "hi")], &[]);
        assert_eq!(out, vec![ChatMessage::new("user", "hi")]);
    }
}
