//! A request's structured-output parameters, in OpenAI's and vLLM's spellings, read as the
//! one [`Constraint`] the engines enforce.
//!
//! - OpenAI: `response_format` `{"type": "json_object"}`, or `{"type": "json_schema",
//!   "json_schema": {"name", "schema", "strict"}}` (enforced whatever `strict` says).
//! - vLLM: `structured_outputs` `{"json" | "regex" | "choice" | "grammar" | "json_object"}`,
//!   and the older `guided_json`, `guided_regex`, `guided_choice`, `guided_grammar`.
//!
//! - A forced tool call (`tool_choice` `required` or a named function, see
//!   [`crate::tools::forced`]) is one more.
//!
//! Grammars are in the Lark syntax of `llguidance`. At most one constraint per request;
//! a malformed one is a 400 naming its parameter, before any worker sees it.

use serde_json::{Map, Value};
use switchyard_core::protocol::Constraint;

use crate::openai::ApiError;
use crate::openai::request::ResponseFormat;

/// The structured-output parameters as the request gave them.
#[derive(Debug, Clone, Default)]
pub struct Structured {
    pub response_format: Option<ResponseFormat>,
    pub guided_json: Option<Value>,
    pub guided_regex: Option<String>,
    pub guided_choice: Option<Vec<String>>,
    pub guided_grammar: Option<String>,
    pub structured_outputs: Option<Map<String, Value>>,
    /// A forced tool call's constraint (`tool_choice` `required` or a named function).
    pub tool_choice: Option<Constraint>,
}

/// A constraint, and the parameter that asked for it (named in errors).
pub type Asked = (Constraint, &'static str);

/// The request's constraint, if it asks for one, checked: it compiles.
pub fn constraint(structured: &Structured) -> Result<Option<Asked>, ApiError> {
    let mut asked: Vec<Asked> = Vec::new();
    if let Some(format) = &structured.response_format {
        asked.extend(response_format(format)?);
    }
    if let Some(schema) = &structured.guided_json {
        asked.push((json_schema("guided_json", schema)?, "guided_json"));
    }
    if let Some(regex) = &structured.guided_regex {
        asked.push((Constraint::Regex(regex.clone()), "guided_regex"));
    }
    if let Some(choice) = &structured.guided_choice {
        asked.push((Constraint::Choice(choice.clone()), "guided_choice"));
    }
    if let Some(grammar) = &structured.guided_grammar {
        asked.push((Constraint::Grammar(grammar.clone()), "guided_grammar"));
    }
    if let Some(outputs) = &structured.structured_outputs {
        for (key, value) in outputs {
            asked.extend(structured_output(key, value)?);
        }
    }
    if let Some(forced) = &structured.tool_choice {
        asked.push((forced.clone(), "tool_choice"));
    }
    if let [(_, first), (_, second), ..] = asked[..] {
        return Err(ApiError::invalid_param(
            second,
            format!(
                "only one structured-output constraint may be given; got `{first}` and `{second}`"
            ),
        ));
    }
    let Some((constraint, param)) = asked.pop() else {
        return Ok(None);
    };
    switchyard_grammar::check(&constraint).map_err(|e| {
        ApiError::invalid_param(param, format!("`{param}` cannot be enforced: {e}"))
    })?;
    Ok(Some((constraint, param)))
}

/// OpenAI's `response_format`.
fn response_format(format: &ResponseFormat) -> Result<Option<Asked>, ApiError> {
    const PARAM: &str = "response_format";
    if format.kind != "json_schema" && format.json_schema.is_some() {
        return Err(ApiError::invalid_param(
            "response_format.json_schema",
            "`json_schema` goes only with `response_format` type `json_schema`",
        ));
    }
    match format.kind.as_str() {
        "text" => Ok(None),
        "json_object" => Ok(Some((Constraint::JsonObject, PARAM))),
        "json_schema" => {
            let Some(schema) = format.json_schema.as_ref().and_then(|j| j.schema.as_ref()) else {
                return Err(ApiError::invalid_param(
                    "response_format.json_schema.schema",
                    "`response_format` type `json_schema` needs `json_schema.schema`",
                ));
            };
            let param = "response_format.json_schema.schema";
            Ok(Some((json_schema(param, schema)?, PARAM)))
        }
        other => Err(ApiError::invalid_param(
            PARAM,
            format!(
                "unknown `response_format` type `{}`; expected text, json_object or json_schema",
                crate::openai::error::echo(other)
            ),
        )),
    }
}

/// One key of vLLM's `structured_outputs`.
fn structured_output(key: &str, value: &Value) -> Result<Option<Asked>, ApiError> {
    let string = |param: &'static str| match value {
        Value::String(text) => Ok(text.clone()),
        _ => Err(ApiError::invalid_param(
            param,
            format!("`{param}` must be a string"),
        )),
    };
    Ok(Some(match key {
        "json" => {
            let param = "structured_outputs.json";
            (json_schema(param, value)?, param)
        }
        "regex" => {
            let param = "structured_outputs.regex";
            (Constraint::Regex(string(param)?), param)
        }
        "grammar" => {
            let param = "structured_outputs.grammar";
            (Constraint::Grammar(string(param)?), param)
        }
        "choice" => {
            let param = "structured_outputs.choice";
            let choices: Option<Vec<String>> = value.as_array().and_then(|items| {
                items
                    .iter()
                    .map(|item| item.as_str().map(str::to_owned))
                    .collect()
            });
            let Some(choices) = choices else {
                return Err(ApiError::invalid_param(
                    param,
                    format!("`{param}` must be a list of strings"),
                ));
            };
            (Constraint::Choice(choices), param)
        }
        "json_object" => match value {
            Value::Bool(true) => (Constraint::JsonObject, "structured_outputs.json_object"),
            Value::Bool(false) | Value::Null => return Ok(None),
            _ => {
                return Err(ApiError::invalid_param(
                    "structured_outputs.json_object",
                    "`structured_outputs.json_object` must be a boolean",
                ));
            }
        },
        other => {
            return Err(ApiError::invalid_param(
                "structured_outputs",
                format!(
                    "`structured_outputs.{}` is not supported; expected json, regex, choice, grammar or json_object",
                    crate::openai::error::echo(other)
                ),
            ));
        }
    }))
}

/// A JSON Schema given as an object (or `true`), or as its JSON text (vLLM takes both).
fn json_schema(param: &'static str, schema: &Value) -> Result<Constraint, ApiError> {
    let parsed;
    let schema = match schema {
        Value::String(text) => {
            parsed = serde_json::from_str::<Value>(text).map_err(|e| {
                ApiError::invalid_param(param, format!("`{param}` is not JSON: {e}"))
            })?;
            &parsed
        }
        schema => schema,
    };
    match schema {
        Value::Object(_) | Value::Bool(true) => Ok(Constraint::JsonSchema(schema.to_string())),
        _ => Err(ApiError::invalid_param(
            param,
            format!("`{param}` must be a JSON Schema (an object)"),
        )),
    }
}
