//! Assembling a preprocessor from a Hugging Face model directory.
//!
//! Files, in the order transformers and vLLM give them precedence:
//! - `tokenizer.json` (required): the fast tokenizer.
//! - `chat_template.jinja`, else `chat_template.json`, else `tokenizer_config.json`'s
//!   `chat_template`: the chat template; none at all means the built-in simple template.
//! - `tokenizer_config.json`: special tokens and `add_bos_token` / `add_eos_token`.
//! - `config.json`, `generation_config.json`: the context length and extra EOS ids (chat
//!   models often stop on an end-of-turn token as well as on end-of-text).

use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use super::config_files::{self as files, CONTEXT_LENGTH_KEYS, JsonObject};
use super::error::PreprocessError;
use super::hf::{HfTokenizer, SpecialTokenPolicy};
use super::template::{ChatTemplate, JinjaTemplate, TemplateTokens};

/// Everything read from a model directory.
#[derive(Debug)]
pub(crate) struct ModelFiles {
    pub(crate) tokenizer: HfTokenizer,
    pub(crate) template: ChatTemplate,
    pub(crate) eos_token_ids: Vec<u32>,
    pub(crate) context_length: u32,
}

pub(crate) fn load(dir: &Path, context_length: Option<u32>) -> Result<ModelFiles, PreprocessError> {
    match std::fs::metadata(dir) {
        Ok(metadata) if metadata.is_dir() => {}
        Ok(_) => return Err(model_dir(dir, "not a directory")),
        Err(error) if error.kind() == ErrorKind::NotFound => {
            return Err(model_dir(dir, "does not exist"));
        }
        Err(source) => {
            return Err(PreprocessError::Read {
                path: dir.to_owned(),
                source,
            });
        }
    }
    if context_length == Some(0) {
        return Err(PreprocessError::ZeroContextLength);
    }

    let tokenizer = HfTokenizer::load(&dir.join("tokenizer.json"))?;
    let tokenizer_config_path = dir.join("tokenizer_config.json");
    let tokenizer_config = files::read_optional_object(&tokenizer_config_path)?.unwrap_or_default();
    let config_path = dir.join("config.json");
    let config = files::read_optional_object(&config_path)?.unwrap_or_default();
    let generation_config_path = dir.join("generation_config.json");
    let generation_config =
        files::read_optional_object(&generation_config_path)?.unwrap_or_default();
    let template = template_source(dir, &tokenizer_config_path, &tokenizer_config)?;
    assemble(
        Sources {
            dir,
            tokenizer,
            tokenizer_config: (tokenizer_config_path, tokenizer_config),
            config: (config_path, config),
            generation_config: (generation_config_path, generation_config),
            template,
        },
        context_length,
    )
}

/// A model's files built into the binary: `tokenizer.json`, `tokenizer_config.json` (its
/// chat template included) and `config.json`, under a label that stands for their directory
/// in errors.
#[derive(Debug, Clone, Copy)]
pub(crate) struct EmbeddedModel<'a> {
    pub(crate) label: &'a str,
    pub(crate) tokenizer: &'a str,
    pub(crate) tokenizer_config: &'a str,
    pub(crate) config: &'a str,
}

pub(crate) fn load_embedded(
    model: &EmbeddedModel<'_>,
    context_length: Option<u32>,
) -> Result<ModelFiles, PreprocessError> {
    if context_length == Some(0) {
        return Err(PreprocessError::ZeroContextLength);
    }
    let dir = Path::new(model.label);
    let tokenizer = HfTokenizer::parse(model.tokenizer, &dir.join("tokenizer.json"))?;
    let tokenizer_config_path = dir.join("tokenizer_config.json");
    let tokenizer_config = files::parse_object(&tokenizer_config_path, model.tokenizer_config)?;
    let config_path = dir.join("config.json");
    let config = files::parse_object(&config_path, model.config)?;
    let template = files::chat_template(&tokenizer_config_path, &tokenizer_config)?
        .map(|source| (source, tokenizer_config_path.clone()));
    assemble(
        Sources {
            dir,
            tokenizer,
            tokenizer_config: (tokenizer_config_path, tokenizer_config),
            config: (config_path, config),
            generation_config: (dir.join("generation_config.json"), JsonObject::new()),
            template,
        },
        context_length,
    )
}

/// What a model's files say, read and parsed, each object with the path it came from.
struct Sources<'a> {
    dir: &'a Path,
    tokenizer: HfTokenizer,
    tokenizer_config: (PathBuf, JsonObject),
    config: (PathBuf, JsonObject),
    generation_config: (PathBuf, JsonObject),
    template: Option<(String, PathBuf)>,
}

fn assemble(
    sources: Sources<'_>,
    context_length: Option<u32>,
) -> Result<ModelFiles, PreprocessError> {
    let Sources {
        dir,
        mut tokenizer,
        tokenizer_config: (tokenizer_config_path, tokenizer_config),
        config: (config_path, config),
        generation_config: (generation_config_path, generation_config),
        template,
    } = sources;
    let path = tokenizer_config_path.as_path();
    let tokens = TemplateTokens {
        bos_token: files::special_token(path, &tokenizer_config, "bos_token")?,
        eos_token: files::special_token(path, &tokenizer_config, "eos_token")?,
        unk_token: files::special_token(path, &tokenizer_config, "unk_token")?,
        pad_token: files::special_token(path, &tokenizer_config, "pad_token")?,
    };
    let bos_id = token_id(&tokenizer, path, "bos_token", tokens.bos_token.as_deref())?;
    let eos_id = token_id(&tokenizer, path, "eos_token", tokens.eos_token.as_deref())?;

    let add_bos = files::optional_bool(path, &tokenizer_config, "add_bos_token")?;
    let add_eos = files::optional_bool(path, &tokenizer_config, "add_eos_token")?;
    if add_bos.is_some() || add_eos.is_some() {
        // Asking for a token the model does not have adds nothing, as in transformers.
        let bos = bos_id.filter(|_| add_bos == Some(true));
        let eos = eos_id.filter(|_| add_eos == Some(true));
        tokenizer.set_plain_prompt_policy(SpecialTokenPolicy::Explicit { bos, eos });
    }

    let eos_token_ids = stop_token_ids(
        eos_id,
        &[
            (&config_path, &config),
            (&generation_config_path, &generation_config),
        ],
    )?;

    let template = match template {
        Some((source, origin)) => {
            ChatTemplate::Jinja(Box::new(JinjaTemplate::compile(source, &origin, &tokens)?))
        }
        None => ChatTemplate::Simple,
    };

    let context_length = match context_length {
        Some(length) => length,
        None => declared_context_length(dir, &config_path, &config, &tokenizer_config)?,
    };

    Ok(ModelFiles {
        tokenizer,
        template,
        eos_token_ids,
        context_length,
    })
}

fn model_dir(dir: &Path, problem: &'static str) -> PreprocessError {
    PreprocessError::ModelDir {
        path: dir.to_owned(),
        problem,
    }
}

/// The EOS token first, then every other `eos_token_id` of the files, without repeats.
fn stop_token_ids(
    eos_id: Option<u32>,
    sources: &[(&Path, &JsonObject)],
) -> Result<Vec<u32>, PreprocessError> {
    let mut ids: Vec<u32> = eos_id.into_iter().collect();
    for &(path, object) in sources {
        for id in files::token_ids(path, object, "eos_token_id")? {
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
    }
    Ok(ids)
}

/// config.json's context length, else tokenizer_config.json's `model_max_length`.
fn declared_context_length(
    dir: &Path,
    config_path: &Path,
    config: &JsonObject,
    tokenizer_config: &JsonObject,
) -> Result<u32, PreprocessError> {
    files::context_length(config_path, config)?
        .or_else(|| files::model_max_length(tokenizer_config))
        .ok_or_else(|| PreprocessError::UnknownContextLength {
            dir: dir.to_owned(),
            keys: CONTEXT_LENGTH_KEYS.join(", "),
        })
}

/// The id of a special token named in tokenizer_config.json, which must exist in
/// tokenizer.json: a mismatch means the two files belong to different models.
fn token_id(
    tokenizer: &HfTokenizer,
    path: &Path,
    key: &str,
    token: Option<&str>,
) -> Result<Option<u32>, PreprocessError> {
    let Some(token) = token else {
        return Ok(None);
    };
    match tokenizer.token_to_id(token) {
        Some(id) => Ok(Some(id)),
        None => Err(files::invalid(
            path,
            format!(
                "`{key}` {token:?} is not in the vocabulary of {}",
                tokenizer.path().display()
            ),
        )),
    }
}

/// The chat template's source and the file it came from, if the directory has one.
fn template_source(
    dir: &Path,
    tokenizer_config_path: &Path,
    tokenizer_config: &JsonObject,
) -> Result<Option<(String, PathBuf)>, PreprocessError> {
    let jinja_path = dir.join("chat_template.jinja");
    match std::fs::read_to_string(&jinja_path) {
        Ok(source) => return Ok(Some((source, jinja_path))),
        Err(error) if error.kind() == ErrorKind::NotFound => {}
        Err(source) => {
            return Err(PreprocessError::Read {
                path: jinja_path,
                source,
            });
        }
    }
    let json_path = dir.join("chat_template.json");
    if let Some(object) = files::read_optional_object(&json_path)? {
        return match files::chat_template(&json_path, &object)? {
            Some(source) => Ok(Some((source, json_path))),
            None => Err(files::invalid(
                &json_path,
                "no `chat_template` in it".into(),
            )),
        };
    }
    let source = files::chat_template(tokenizer_config_path, tokenizer_config)?;
    Ok(source.map(|source| (source, tokenizer_config_path.to_owned())))
}
