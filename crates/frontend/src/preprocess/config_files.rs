//! Reading the JSON files of a Hugging Face model directory and the few fields used here.
//!
//! The files are read as untyped JSON because their fields vary across models and
//! `transformers` versions (a special token is a string or an `AddedToken` object, a chat
//! template a string or a list of named templates, `eos_token_id` a number or a list); each
//! accessor accepts the shapes found in the wild and names the file and field otherwise.

use std::io::ErrorKind;
use std::path::Path;

use serde_json::{Map, Value};

use super::error::PreprocessError;

pub(crate) type JsonObject = Map<String, Value>;

/// Keys that give a model's context length in `config.json`, by model family; as in vLLM,
/// the smallest one present wins.
pub(crate) const CONTEXT_LENGTH_KEYS: &[&str] = &[
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
];

/// Reads a JSON object; `Ok(None)` when the file does not exist.
pub(crate) fn read_optional_object(path: &Path) -> Result<Option<JsonObject>, PreprocessError> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(error) if error.kind() == ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(PreprocessError::Read {
                path: path.to_owned(),
                source,
            });
        }
    };
    parse_object(path, &text).map(Some)
}

/// Parses the text of `path` as a JSON object.
pub(crate) fn parse_object(path: &Path, text: &str) -> Result<JsonObject, PreprocessError> {
    let value: Value = serde_json::from_str(text).map_err(|source| PreprocessError::Json {
        path: path.to_owned(),
        source,
    })?;
    match value {
        Value::Object(object) => Ok(object),
        other => Err(invalid(
            path,
            format!("expected a JSON object, found {}", kind(&other)),
        )),
    }
}

/// A special token (`bos_token`, ...): a string, or an `AddedToken` object with `content`.
pub(crate) fn special_token(
    path: &Path,
    object: &JsonObject,
    key: &str,
) -> Result<Option<String>, PreprocessError> {
    match object.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(token)) => Ok(Some(token.clone())),
        Some(Value::Object(added)) => match added.get("content") {
            Some(Value::String(token)) => Ok(Some(token.clone())),
            _ => Err(invalid(
                path,
                format!("`{key}` is an object without a string `content`"),
            )),
        },
        Some(other) => Err(invalid(
            path,
            format!(
                "`{key}` must be a string or an object with `content`, found {}",
                kind(other)
            ),
        )),
    }
}

pub(crate) fn optional_bool(
    path: &Path,
    object: &JsonObject,
    key: &str,
) -> Result<Option<bool>, PreprocessError> {
    match object.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(value)) => Ok(Some(*value)),
        Some(other) => Err(invalid(
            path,
            format!("`{key}` must be true or false, found {}", kind(other)),
        )),
    }
}

/// `chat_template`: a string, or a list of `{"name", "template"}` of which "default" is the
/// one for plain chat (the others serve tool use, RAG, ...).
pub(crate) fn chat_template(
    path: &Path,
    object: &JsonObject,
) -> Result<Option<String>, PreprocessError> {
    let entries = match object.get("chat_template") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::String(template)) => return Ok(Some(template.clone())),
        Some(Value::Array(entries)) => entries,
        Some(other) => {
            return Err(invalid(
                path,
                format!(
                    "`chat_template` must be a string or a list of named templates, found {}",
                    kind(other)
                ),
            ));
        }
    };
    let mut names = Vec::with_capacity(entries.len());
    for (i, entry) in entries.iter().enumerate() {
        let name = entry.get("name").and_then(Value::as_str);
        let template = entry.get("template").and_then(Value::as_str);
        let (Some(name), Some(template)) = (name, template) else {
            return Err(invalid(
                path,
                format!("`chat_template[{i}]` must be an object with string `name` and `template`"),
            ));
        };
        if name == "default" {
            return Ok(Some(template.to_owned()));
        }
        names.push(name);
    }
    Err(invalid(
        path,
        format!("`chat_template` lists templates {names:?} but none named \"default\""),
    ))
}

/// The context length `config.json` declares, looking into `text_config` for multimodal
/// models whose language model is nested.
pub(crate) fn context_length(
    path: &Path,
    config: &JsonObject,
) -> Result<Option<u32>, PreprocessError> {
    if let Some(length) = context_length_in(path, config, "")? {
        return Ok(Some(length));
    }
    match config.get("text_config") {
        Some(Value::Object(text_config)) => context_length_in(path, text_config, "text_config."),
        _ => Ok(None),
    }
}

fn context_length_in(
    path: &Path,
    object: &JsonObject,
    prefix: &str,
) -> Result<Option<u32>, PreprocessError> {
    let mut smallest: Option<u32> = None;
    for &key in CONTEXT_LENGTH_KEYS {
        let Some(value) = object.get(key).filter(|value| !value.is_null()) else {
            continue;
        };
        let length = value
            .as_u64()
            .and_then(|length| u32::try_from(length).ok())
            .filter(|&length| length > 0)
            .ok_or_else(|| {
                invalid(
                    path,
                    format!("`{prefix}{key}` must be a positive 32-bit integer, found {value}"),
                )
            })?;
        smallest = Some(smallest.map_or(length, |current| current.min(length)));
    }
    Ok(smallest)
}

/// `model_max_length` from tokenizer_config.json, when it is a real limit: transformers writes
/// a huge sentinel (1e30) for "no limit", which is no context length.
pub(crate) fn model_max_length(tokenizer_config: &JsonObject) -> Option<u32> {
    tokenizer_config
        .get("model_max_length")
        .and_then(Value::as_u64)
        .and_then(|length| u32::try_from(length).ok())
        .filter(|&length| length > 0)
}

/// Token ids under `key` (`eos_token_id`): a number or a list of numbers.
pub(crate) fn token_ids(
    path: &Path,
    object: &JsonObject,
    key: &str,
) -> Result<Vec<u32>, PreprocessError> {
    let as_id = |value: &Value| value.as_u64().and_then(|id| u32::try_from(id).ok());
    let bad = |value: &Value| {
        invalid(
            path,
            format!("`{key}` must be a token id or a list of token ids, found {value}"),
        )
    };
    match object.get(key) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(values)) => values
            .iter()
            .map(|value| as_id(value).ok_or_else(|| bad(value)))
            .collect(),
        Some(value) => as_id(value).map(|id| vec![id]).ok_or_else(|| bad(value)),
    }
}

pub(crate) fn invalid(path: &Path, message: String) -> PreprocessError {
    PreprocessError::InvalidFile {
        path: path.to_owned(),
        message,
    }
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn object(value: Value) -> JsonObject {
        match value {
            Value::Object(object) => object,
            _ => JsonObject::new(),
        }
    }

    const PATH: &str = "/m/tokenizer_config.json";

    #[test]
    fn special_tokens_as_strings_or_added_token_objects() {
        let config = object(json!({
            "bos_token": {"__type": "AddedToken", "content": "<s>", "lstrip": false},
            "eos_token": "</s>",
            "pad_token": null,
            "unk_token": 7,
        }));
        let path = Path::new(PATH);
        assert_eq!(
            special_token(path, &config, "bos_token")
                .ok()
                .flatten()
                .as_deref(),
            Some("<s>")
        );
        assert_eq!(
            special_token(path, &config, "eos_token")
                .ok()
                .flatten()
                .as_deref(),
            Some("</s>")
        );
        assert!(matches!(
            special_token(path, &config, "pad_token"),
            Ok(None)
        ));
        assert!(matches!(
            special_token(path, &config, "sep_token"),
            Ok(None)
        ));
        let error = special_token(path, &config, "unk_token")
            .err()
            .map(|e| e.to_string());
        assert_eq!(
            error.as_deref(),
            Some(
                "/m/tokenizer_config.json: `unk_token` must be a string or an object with `content`, found a number"
            )
        );
    }

    #[test]
    fn context_length_takes_the_smallest_key_and_looks_into_text_config() {
        let path = Path::new("/m/config.json");
        let config = object(json!({"max_position_embeddings": 8192, "seq_length": 4096}));
        assert_eq!(context_length(path, &config).ok().flatten(), Some(4096));
        let nested = object(json!({"text_config": {"max_position_embeddings": 131072}}));
        assert_eq!(context_length(path, &nested).ok().flatten(), Some(131_072));
        assert!(matches!(context_length(path, &object(json!({}))), Ok(None)));
        let zero = context_length(path, &object(json!({"n_positions": 0})));
        assert!(matches!(zero, Err(PreprocessError::InvalidFile { .. })));
        let float = context_length(path, &object(json!({"max_position_embeddings": 2048.5})));
        assert!(float.is_err());
    }

    #[test]
    fn model_max_length_ignores_the_no_limit_sentinel() {
        let sentinel = object(json!({"model_max_length": 1e30}));
        assert_eq!(model_max_length(&sentinel), None);
        let huge = object(json!({"model_max_length": 1_000_000_000_000_000_000u64}));
        assert_eq!(model_max_length(&huge), None);
        assert_eq!(
            model_max_length(&object(json!({"model_max_length": 2048}))),
            Some(2048)
        );
    }

    #[test]
    fn token_ids_accept_a_number_or_a_list() {
        let path = Path::new("/m/generation_config.json");
        let one = object(json!({"eos_token_id": 2}));
        assert_eq!(token_ids(path, &one, "eos_token_id").ok(), Some(vec![2]));
        let many = object(json!({"eos_token_id": [128001, 128009]}));
        assert_eq!(
            token_ids(path, &many, "eos_token_id").ok(),
            Some(vec![128_001, 128_009])
        );
        assert_eq!(
            token_ids(path, &object(json!({})), "eos_token_id").ok(),
            Some(vec![])
        );
        let bad = object(json!({"eos_token_id": [-1]}));
        assert!(token_ids(path, &bad, "eos_token_id").is_err());
    }

    #[test]
    fn chat_template_shapes() {
        let path = Path::new(PATH);
        let named = object(json!({"chat_template": [
            {"name": "tool_use", "template": "T"},
            {"name": "default", "template": "D"},
        ]}));
        assert_eq!(
            chat_template(path, &named).ok().flatten().as_deref(),
            Some("D")
        );
        let no_default = object(json!({"chat_template": [{"name": "rag", "template": "R"}]}));
        let message = chat_template(path, &no_default)
            .err()
            .map(|e| e.to_string());
        assert_eq!(
            message.as_deref(),
            Some(
                "/m/tokenizer_config.json: `chat_template` lists templates [\"rag\"] but none named \"default\""
            )
        );
        let wrong = object(json!({"chat_template": 3}));
        assert!(chat_template(path, &wrong).is_err());
        assert!(matches!(chat_template(path, &object(json!({}))), Ok(None)));
    }
}
