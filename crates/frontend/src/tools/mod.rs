//! Tool calling and reasoning: the steps a chat request's life adds around generation.
//!
//! Before: [`ToolRequest::of`] checks `tools`, `tool_choice` and `parallel_tool_calls`;
//! [`prompt`] turns the history's calls and results into template messages and, for a
//! template without a tool section, writes the tools into the prompt in the default format.
//! After: [`output`] splits the answer's text into reasoning, content and tool calls, whole or
//! as it streams, with the parsers of the SGLang gateway's `tool-parser` and
//! `reasoning-parser` crates ([`Parsers`] picks them). A forced call ([`forced`]) is
//! constrained to JSON and parsed as such.

pub mod forced;
pub mod harmony;
pub mod output;
pub mod prompt;
pub mod strict;

use serde::{Deserialize, Serialize};

use crate::openai::ApiError;
use crate::openai::request::{ChatCompletionRequest, ToolChoiceIn, ToolIn};

/// `frontend.chat`: the chat template and the answer's parsers.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ChatConfig {
    /// A Jinja chat template file used instead of the model's (`--chat-template`).
    pub template: Option<std::path::PathBuf>,
    /// The tool-call format the model writes (`qwen` for Hermes-style `<tool_call>` tags,
    /// `llama`, `mistral`, `deepseek`, `json`, `pythonic`, `harmony` for gpt-oss, ...); by
    /// default the one the model's name maps to (or `harmony` for a template that writes
    /// `<|channel|>`), else `qwen` (the default prompt format's).
    pub tool_call_parser: Option<String>,
    /// The reasoning format (`deepseek_r1`, `qwen3`, `kimi`, ...); by default the one the
    /// model's name maps to, else none (no `reasoning_content`).
    pub reasoning_parser: Option<String>,
}

/// The parser a template with no known format, and the default prompt format, use.
pub const DEFAULT_TOOL_PARSER: &str = "qwen";

/// gpt-oss's format ([`harmony`]), parsed here: it splits reasoning, content and calls.
pub const HARMONY: &str = "harmony";

impl ChatConfig {
    /// Parser names must be ones the parser crates know.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(name) = &self.tool_call_parser {
            let factory = tool_parser::ParserFactory::new();
            if !factory.has_parser(name) && name != HARMONY {
                return Err(format!(
                    "frontend.chat.tool_call_parser: unknown parser `{name}`; known: {HARMONY}, {}",
                    factory.list_parsers().join(", ")
                ));
            }
        }
        if let Some(name) = &self.reasoning_parser {
            let factory = reasoning_parser::ParserFactory::new();
            if !factory.registry().has_parser(name) {
                return Err(format!(
                    "frontend.chat.reasoning_parser: unknown parser `{name}`; known: {}",
                    factory.list_parsers().join(", ")
                ));
            }
        }
        Ok(())
    }
}

/// The answer parsers a frontend uses, chosen once.
pub struct Parsers {
    tools: tool_parser::ParserFactory,
    tool_parser: String,
    reasoning: reasoning_parser::ParserFactory,
    reasoning_parser: Option<ReasoningChoice>,
}

/// How the reasoning parser was chosen.
#[derive(Debug, Clone)]
enum ReasoningChoice {
    /// By its name, in the configuration.
    Named(String),
    /// By the model's name.
    ForModel(String),
}

impl std::fmt::Debug for Parsers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Parsers")
            .field("tool_parser", &self.tool_parser)
            .field("reasoning_parser", &self.reasoning_parser)
            .finish_non_exhaustive()
    }
}

impl Parsers {
    /// The configured parsers, else the ones `model` maps to; for tools, else the format
    /// the template's text shows (`<tool_call>` tags), else the default format's.
    pub fn new(config: &ChatConfig, model: &str, template: Option<&str>) -> Self {
        let tools = tool_parser::ParserFactory::new();
        let reasoning = reasoning_parser::ParserFactory::new();
        let tool_parser = config
            .tool_call_parser
            .clone()
            .filter(|name| tools.has_parser(name) || name == HARMONY)
            .or_else(|| {
                // gpt-oss by its name or its template's channels.
                let channels = template.is_some_and(|t| t.contains("<|channel|>"));
                (model.to_ascii_lowercase().contains("gpt-oss") || channels)
                    .then(|| HARMONY.to_owned())
            })
            .or_else(|| {
                tools
                    .registry()
                    .resolve_model_to_parser(model)
                    .filter(|name| tools.has_parser(name))
            })
            .or_else(|| {
                template
                    .filter(|t| t.contains("[TOOL_CALLS]"))
                    .map(|_| "mistral".to_owned())
            })
            .unwrap_or_else(|| DEFAULT_TOOL_PARSER.to_owned());
        // A parser's own type name is not always the name it is registered under
        // (`qwen_thinking` for `qwen3_thinking`): one chosen by the model is created by it.
        let reasoning_parser = config
            .reasoning_parser
            .clone()
            .filter(|name| reasoning.registry().has_parser(name))
            .map(ReasoningChoice::Named)
            .or_else(|| {
                reasoning
                    .registry()
                    .has_parser_for_model(model)
                    .then(|| ReasoningChoice::ForModel(model.to_owned()))
            });
        Parsers {
            tools,
            tool_parser,
            reasoning,
            reasoning_parser,
        }
    }

    /// The tool-call parser's name.
    pub fn tool_parser(&self) -> &str {
        &self.tool_parser
    }

    /// The reasoning parser's name (its type's, when chosen by the model), if answers are
    /// split.
    pub fn reasoning_parser(&self) -> Option<String> {
        match self.reasoning_parser.as_ref()? {
            ReasoningChoice::Named(name) => Some(name.clone()),
            ReasoningChoice::ForModel(_) => self
                .reasoning_for_answer()
                .map(|p| p.model_type().to_owned()),
        }
    }

    fn reasoning_for_answer(&self) -> Option<Box<dyn reasoning_parser::ReasoningParser>> {
        let registry = self.reasoning.registry();
        match self.reasoning_parser.as_ref()? {
            ReasoningChoice::Named(name) => registry.create_parser(name),
            ReasoningChoice::ForModel(model) => registry.create_for_model(model),
        }
    }

    /// Whether answers are read in Harmony's format (gpt-oss, unless the call is forced):
    /// their special tokens must be decoded as text.
    pub fn keeps_special_tokens(&self, tools: Option<&ToolRequest>) -> bool {
        self.tool_parser == HARMONY && !forced(tools)
    }

    /// Fresh parsers for one answer: reasoning when configured (unless the call is forced),
    /// tools when the request lets the model call them.
    pub fn for_answer(&self, tools: Option<&ToolRequest>) -> output::AnswerParser {
        let forced = forced(tools);
        if self.tool_parser == HARMONY && !forced {
            return output::AnswerParser::harmony(tools.filter(|t| t.choice != Choice::None));
        }
        let reasoning = if forced {
            None
        } else {
            self.reasoning_for_answer()
        };
        let tools = tools
            .filter(|t| t.choice != Choice::None)
            .and_then(|request| {
                let parser: Box<dyn tool_parser::ToolParser> = match &request.choice {
                    Choice::Named(name) => Box::new(forced::NamedCall::new(name)),
                    Choice::Required => self.tools.registry().create_parser("json")?,
                    _ => self.tools.registry().create_parser(&self.tool_parser)?,
                };
                Some(output::ToolState::new(parser, request))
            });
        output::AnswerParser::new(reasoning, tools)
    }
}

/// Whether the request forces a call: it is JSON from the first token, with no reasoning
/// before it.
fn forced(tools: Option<&ToolRequest>) -> bool {
    tools.is_some_and(|t| matches!(t.choice, Choice::Required | Choice::Named(_)))
}

/// What a request allows the model to do with its tools.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Choice {
    /// Answer in text (`tool_choice: "none"`): the tools are not shown to the model.
    None,
    /// Call tools or answer in text, as the model decides.
    Auto,
    /// Call one or more tools, and nothing else (`"required"`): enforced.
    Required,
    /// Call this function, and nothing else: enforced.
    Named(String),
}

/// A chat request's tools, checked.
#[derive(Debug, Clone)]
pub struct ToolRequest {
    pub tools: Vec<ToolIn>,
    pub choice: Choice,
    /// More than one call per answer (`parallel_tool_calls`, default true); when false, an
    /// answer's calls after its first are dropped.
    pub parallel: bool,
}

/// The longest function name OpenAI takes.
const MAX_NAME: usize = 64;

impl ToolRequest {
    /// The request's tools, or none when it gives none; a 400 naming what is wrong.
    pub fn of(request: &ChatCompletionRequest) -> Result<Option<Self>, ApiError> {
        if request.functions.as_ref().is_some_and(|f| !f.is_empty()) {
            return Err(ApiError::invalid_param(
                "functions",
                "`functions` (legacy function calling) is not supported; send `tools`",
            ));
        }
        if request
            .function_call
            .as_ref()
            .is_some_and(|c| !c.is_null() && c != "none")
        {
            return Err(ApiError::invalid_param(
                "function_call",
                "`function_call` (legacy function calling) is not supported; send `tool_choice`",
            ));
        }
        let tools = request.tools.clone().unwrap_or_default();
        let mut names = std::collections::HashSet::new();
        for (i, tool) in tools.iter().enumerate() {
            let at = |field: &str| format!("tools[{i}].{field}");
            if tool.kind != "function" {
                return Err(ApiError::invalid_param(
                    &at("type"),
                    format!(
                        "tools of type `{}` are not supported; only `function`",
                        crate::openai::error::echo(&tool.kind)
                    ),
                ));
            }
            let name = &tool.function.name;
            let valid = !name.is_empty()
                && name.len() <= MAX_NAME
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.');
            if !valid {
                return Err(ApiError::invalid_param(
                    &at("function.name"),
                    format!(
                        "function names are 1 to {MAX_NAME} letters, digits, `_`, `-` or `.`, got `{}`",
                        crate::openai::error::echo(name)
                    ),
                ));
            }
            if !names.insert(name.as_str()) {
                return Err(ApiError::invalid_param(
                    &at("function.name"),
                    format!("two tools are named `{name}`"),
                ));
            }
            if let Some(parameters) = &tool.function.parameters
                && !parameters.is_object()
            {
                return Err(ApiError::invalid_param(
                    &at("function.parameters"),
                    "`parameters` must be a JSON Schema object",
                ));
            }
        }
        let choice = match &request.tool_choice {
            None => Choice::Auto,
            Some(ToolChoiceIn::Mode(mode)) => match mode.as_str() {
                "none" => Choice::None,
                "auto" => Choice::Auto,
                "required" => Choice::Required,
                other => {
                    return Err(ApiError::invalid_param(
                        "tool_choice",
                        format!(
                            "`tool_choice` must be `none`, `auto`, `required` or a named function, got `{}`",
                            crate::openai::error::echo(other)
                        ),
                    ));
                }
            },
            Some(ToolChoiceIn::Named(named)) => {
                if named.kind != "function" {
                    return Err(ApiError::invalid_param(
                        "tool_choice.type",
                        "a named `tool_choice` must be of type `function`",
                    ));
                }
                if !names.contains(named.function.name.as_str()) {
                    return Err(ApiError::invalid_param(
                        "tool_choice.function.name",
                        format!(
                            "`tool_choice` names `{}`, which is not among `tools`",
                            crate::openai::error::echo(&named.function.name)
                        ),
                    ));
                }
                Choice::Named(named.function.name.clone())
            }
        };
        if tools.is_empty() {
            if choice != Choice::None && request.tool_choice.is_some() {
                return Err(ApiError::invalid_param(
                    "tool_choice",
                    "`tool_choice` is only allowed when `tools` are given",
                ));
            }
            return Ok(None);
        }
        Ok(Some(ToolRequest {
            tools,
            choice,
            parallel: request.parallel_tool_calls.unwrap_or(true),
        }))
    }

    /// The constraint the tools put on the answer: a forced call's (see [`forced`]); with
    /// `auto` and a `strict` function, the grammar of text or calls in the model's format
    /// `parser` (see [`strict`]), a 400 naming the function when that format has none.
    pub fn constraint(
        &self,
        parser: &str,
    ) -> Result<Option<switchyard_core::protocol::Constraint>, ApiError> {
        use switchyard_core::protocol::Constraint;
        let schema = match &self.choice {
            Choice::None => return Ok(None),
            Choice::Auto => {
                let Some(i) = self
                    .tools
                    .iter()
                    .position(|t| t.function.strict == Some(true))
                else {
                    return Ok(None);
                };
                if !strict::FORMATS.contains(&parser) {
                    return Err(ApiError::invalid_param(
                        &format!("tools[{i}].function.strict"),
                        format!(
                            "`strict` arguments with `tool_choice` `auto` are enforced for the {} call format only, and this model writes `{parser}`'s; send `required` or a named function, or leave `strict` out",
                            strict::FORMATS.join(", ")
                        ),
                    ));
                }
                let grammar = strict::grammar(&self.tools, self.parallel)
                    .map_err(|message| ApiError::invalid_param("tools", message))?;
                return Ok(Some(Constraint::Grammar(grammar)));
            }
            Choice::Named(name) => self
                .tools
                .iter()
                .find(|t| &t.function.name == name)
                .map(forced::named_schema)
                .unwrap_or_else(|| serde_json::json!({"type": "object"})),
            Choice::Required => forced::required_schema(&self.tools, self.parallel)
                .map_err(|message| ApiError::invalid_param("tools", message))?,
        };
        Ok(Some(Constraint::JsonSchema(schema.to_string())))
    }

    /// The tools as the template reads them (OpenAI's objects).
    pub fn template_tools(&self) -> Vec<serde_json::Value> {
        if self.choice == Choice::None {
            return Vec::new();
        }
        self.tools
            .iter()
            .filter_map(|t| serde_json::to_value(t).ok())
            .collect()
    }
}

#[cfg(test)]
mod format_tests;
#[cfg(test)]
mod harmony_tests;
#[cfg(test)]
mod tests;
