//! Structured output passed upstream, in the server's own request fields.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use switchyard_core::protocol::{Constraint, ConstraintKind, ConstraintKinds, EngineError};
use switchyard_grammar::gbnf;

/// How the upstream takes a constraint (structured output).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConstraintDialect {
    /// It is told none: the worker states no kinds, so constrained requests go elsewhere.
    #[default]
    None,
    /// vLLM (0.10 and later): `structured_outputs` with `json`, `regex`, `choice` or
    /// `json_object`.
    Vllm,
    /// SGLang: `json_schema` (the schema's text) or `regex`; a choice as a regular
    /// expression of its escaped alternatives.
    Sglang,
    /// llama.cpp's servers (llama-server, llama-cpp-python's): a GBNF `grammar`, translated
    /// here ([`switchyard_grammar::gbnf`]); a schema with keywords it does not read is
    /// refused by name.
    #[serde(rename = "llamacpp")]
    LlamaCpp,
}

impl ConstraintDialect {
    /// The kinds it passes on. Grammars are not: this project's are in `llguidance`'s Lark
    /// syntax, which no server's default backend reads.
    pub fn kinds(self) -> ConstraintKinds {
        match self {
            ConstraintDialect::None => ConstraintKinds::NONE,
            ConstraintDialect::Vllm | ConstraintDialect::Sglang | ConstraintDialect::LlamaCpp => [
                ConstraintKind::JsonObject,
                ConstraintKind::JsonSchema,
                ConstraintKind::Regex,
                ConstraintKind::Choice,
            ]
            .into_iter()
            .collect(),
        }
    }

    /// The request field that carries `constraint` upstream, and its value.
    pub fn field(self, constraint: &Constraint) -> Result<(&'static str, Value), EngineError> {
        let schema = |text: &str| {
            serde_json::from_str::<Value>(text)
                .map_err(|e| EngineError::Invalid(format!("the request's schema: {e}")))
        };
        Ok(match (self, constraint) {
            (ConstraintDialect::Vllm, Constraint::JsonObject) => {
                ("structured_outputs", json!({"json_object": true}))
            }
            (ConstraintDialect::Vllm, Constraint::JsonSchema(text)) => {
                ("structured_outputs", json!({"json": schema(text)?}))
            }
            (ConstraintDialect::Vllm, Constraint::Regex(regex)) => {
                ("structured_outputs", json!({"regex": regex}))
            }
            (ConstraintDialect::Vllm, Constraint::Choice(choices)) => {
                ("structured_outputs", json!({"choice": choices}))
            }
            (ConstraintDialect::Sglang, Constraint::JsonObject) => {
                ("json_schema", json!(r#"{"type":"object"}"#))
            }
            (ConstraintDialect::Sglang, Constraint::JsonSchema(text)) => {
                ("json_schema", json!(text))
            }
            (ConstraintDialect::Sglang, Constraint::Regex(regex)) => ("regex", json!(regex)),
            (ConstraintDialect::Sglang, Constraint::Choice(choices)) => {
                let alternatives: Vec<String> =
                    choices.iter().map(|c| regex_syntax::escape(c)).collect();
                ("regex", json!(format!("({})", alternatives.join("|"))))
            }
            (_, Constraint::Grammar(_)) | (ConstraintDialect::None, _) => {
                return Err(EngineError::Unsupported(format!(
                    "this worker's upstream is not told `{}` constraints",
                    constraint.kind().name()
                )));
            }
            (ConstraintDialect::LlamaCpp, constraint) => {
                // What the translation cannot say is the request's to change: a 400 naming it.
                let grammar = gbnf::gbnf(constraint).map_err(|e| EngineError::Invalid(e.0))?;
                ("grammar", json!(grammar))
            }
        })
    }
}
