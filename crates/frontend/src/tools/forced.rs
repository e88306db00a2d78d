//! Forced calls: `tool_choice` `required` or a named function, enforced by constrained
//! decoding as vLLM and SGLang's gateway enforce them.
//!
//! The answer is JSON from its first token, whatever the model's own call format:
//! - a named function: its arguments, an object its `parameters` accept;
//! - `required`: an array of one or more `{"name", "parameters"}` objects (one at most when
//!   `parallel_tool_calls` is false), each naming a tool and holding arguments its
//!   `parameters` accept.
//!
//! A named function's answer is parsed by [`NamedCall`]; `required`'s by the generic JSON
//! parser of `tool-parser`.

use serde_json::{Map, Value, json};
use tool_parser::ToolParser;
use tool_parser::errors::ParserResult;
use tool_parser::types::{FunctionCall, StreamingParseResult, ToolCall, ToolCallItem};

use crate::openai::tools::ToolIn;

/// What a function without `parameters` takes: an object.
fn parameters(tool: &ToolIn) -> Value {
    tool.function
        .parameters
        .clone()
        .unwrap_or_else(|| json!({"type": "object"}))
}

/// The schema of a named function's answer: its arguments.
pub fn named_schema(tool: &ToolIn) -> Value {
    parameters(tool)
}

/// The schema of a `required` answer: one or more calls (at most one without parallel
/// calls), each as [`call_schema`] writes it with the arguments under `parameters`.
pub fn required_schema(tools: &[ToolIn], parallel: bool) -> Result<Value, String> {
    let (call, defs) = call_schema(tools, "parameters", parameters)?;
    let mut schema = json!({"type": "array", "minItems": 1, "items": call});
    if !parallel {
        schema["maxItems"] = json!(1);
    }
    if !defs.is_empty() {
        schema["$defs"] = Value::Object(defs);
    }
    Ok(schema)
}

/// The schema of one call of any of `tools`: an object naming the tool and holding, under
/// `key`, the arguments `arguments` gives for it. Each tool's `$defs` are taken out, to be
/// put at the top of the whole schema so its references still resolve (returned beside
/// it); two tools defining one name differently is an error naming the definition.
pub fn call_schema(
    tools: &[ToolIn],
    key: &str,
    arguments: impl Fn(&ToolIn) -> Value,
) -> Result<(Value, Map<String, Value>), String> {
    let mut defs = Map::new();
    let mut calls = Vec::with_capacity(tools.len());
    for tool in tools {
        let mut arguments = arguments(tool);
        if let Some(Value::Object(own)) = arguments.as_object_mut().and_then(|p| p.remove("$defs"))
        {
            for (name, schema) in own {
                match defs.get(&name) {
                    Some(existing) if existing != &schema => {
                        return Err(format!(
                            "two tools define `$defs/{name}` differently; a constrained call needs one schema for both"
                        ));
                    }
                    _ => {
                        defs.insert(name, schema);
                    }
                }
            }
        }
        calls.push(json!({
            "type": "object",
            "properties": {"name": {"const": tool.function.name}, key: arguments},
            "required": ["name", key],
            "additionalProperties": false,
        }));
    }
    Ok((json!({"anyOf": calls}), defs))
}

/// The parser of a named function's answer: all of it is the one call's arguments, streamed
/// as they come (the name with the first piece).
#[derive(Debug)]
pub struct NamedCall {
    name: String,
    named: bool,
}

impl NamedCall {
    pub fn new(name: &str) -> Self {
        NamedCall {
            name: name.to_owned(),
            named: false,
        }
    }
}

#[async_trait::async_trait]
impl ToolParser for NamedCall {
    async fn parse_complete(&self, output: &str) -> ParserResult<(String, Vec<ToolCall>)> {
        let call = ToolCall {
            function: FunctionCall {
                name: self.name.clone(),
                arguments: output.to_owned(),
            },
        };
        Ok((String::new(), vec![call]))
    }

    async fn parse_incremental(
        &mut self,
        chunk: &str,
        _tools: &[openai_protocol::common::Tool],
    ) -> ParserResult<StreamingParseResult> {
        let name = (!self.named).then(|| self.name.clone());
        self.named = true;
        Ok(StreamingParseResult {
            normal_text: String::new(),
            calls: vec![ToolCallItem {
                tool_index: 0,
                name,
                parameters: chunk.to_owned(),
            }],
        })
    }

    fn has_tool_markers(&self, _text: &str) -> bool {
        true
    }
}
