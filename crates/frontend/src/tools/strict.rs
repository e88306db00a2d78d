//! `strict` functions when the model chooses (`tool_choice` `auto`): a grammar over the
//! model's own call format lets it write text or calls, and enforces each call's arguments.
//!
//! Built for the Hermes format (`<tool_call>` tags around `{"name", "arguments"}`: the
//! default prompt format, and Qwen's), in `llguidance`'s Lark syntax:
//! - either text in which `<tool_call>` never appears,
//! - or such text, then calls, each `<tool_call>\n`, the call's JSON, `\n</tool_call>`, the
//!   calls after the first each on a new line (no second call without parallel calls).
//!
//! A call's JSON names one of the tools and holds arguments its `parameters` accept when it
//! is `strict`, any object otherwise. Other formats have no grammar here: a `strict` tool
//! with `auto` is refused for them (see [`super::ToolRequest::constraint`]).

use serde_json::{Value, json};

use crate::openai::tools::ToolIn;

/// The parsers whose format [`grammar`] writes.
pub const FORMATS: [&str; 1] = ["qwen"];

/// The grammar of an answer that may call `tools` in the Hermes format; an error when two
/// tools define one `$defs` name differently.
pub fn grammar(tools: &[ToolIn], parallel: bool) -> Result<String, String> {
    let (mut call, defs) = super::forced::call_schema(tools, "arguments", |tool| {
        match (&tool.function.parameters, tool.function.strict) {
            (Some(parameters), Some(true)) => parameters.clone(),
            (None, Some(true)) => {
                json!({"type": "object", "properties": {}, "additionalProperties": false})
            }
            _ => json!({"type": "object"}),
        }
    })?;
    if !defs.is_empty() {
        call["$defs"] = Value::Object(defs);
    }
    let more = if parallel { " more*" } else { "" };
    // Each lexeme is told apart by its start: the close of a call, then the open of the
    // next, are two.
    Ok(format!(
        r#"start: TEXT? | OPEN call END{more}
call: %json {call}
more: NEXT call END
TEXT: /(?s:.+)/ & ~/(?s:.*)<tool_call>(?s:.*)/
OPEN: /(?s:.*)<tool_call>\n/ & ~/(?s:.*)<tool_call>(?s:.*)<tool_call>(?s:.*)/
END: "\n</tool_call>"
NEXT: "\n<tool_call>\n"
"#
    ))
}
