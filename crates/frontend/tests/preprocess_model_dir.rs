#![allow(clippy::unwrap_used)]
//! Loading model directories: which file wins, what is optional, and errors that name the
//! file and say what is wrong with it. Each test copies a fixture into a temporary directory
//! and changes one thing.

use std::fs;
use std::path::{Path, PathBuf};

use switchyard_frontend::preprocess::{ChatMessage, PreprocessError, Preprocessor};
use tempfile::TempDir;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// A writable copy of a fixture directory.
fn copy_of(name: &str) -> TempDir {
    let dir = tempfile::tempdir().unwrap();
    for entry in fs::read_dir(fixture(name)).unwrap() {
        let entry = entry.unwrap();
        fs::copy(entry.path(), dir.path().join(entry.file_name())).unwrap();
    }
    dir
}

fn write(dir: &Path, file: &str, contents: &str) {
    fs::write(dir.join(file), contents).unwrap();
}

/// Replaces one top-level field of a JSON file (`None` removes it).
fn set_field(dir: &Path, file: &str, key: &str, value: Option<serde_json::Value>) {
    let path = dir.join(file);
    let mut object: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(&fs::read_to_string(&path).unwrap()).unwrap();
    match value {
        Some(value) => object.insert(key.to_owned(), value),
        None => object.remove(key),
    };
    fs::write(path, serde_json::to_string(&object).unwrap()).unwrap();
}

fn load_error(dir: &Path) -> PreprocessError {
    Preprocessor::from_dir(dir, None).unwrap_err()
}

fn user(text: &str) -> [ChatMessage; 1] {
    [ChatMessage::new("user", text)]
}

#[test]
fn a_missing_or_non_directory_path_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope");
    let error = load_error(&missing);
    assert_eq!(
        error.to_string(),
        format!("model directory {}: does not exist", missing.display())
    );

    let file = dir.path().join("file");
    write(dir.path(), "file", "");
    assert!(load_error(&file).to_string().ends_with(": not a directory"));
}

#[test]
fn tokenizer_json_is_required() {
    let dir = copy_of("chatml-bpe");
    fs::remove_file(dir.path().join("tokenizer.json")).unwrap();
    match load_error(dir.path()) {
        PreprocessError::Read { path, source } => {
            assert_eq!(path, dir.path().join("tokenizer.json"));
            assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
        }
        other => panic!("expected Read, got {other:?}"),
    }
}

#[test]
fn a_malformed_tokenizer_json_names_the_file_and_the_place() {
    let dir = copy_of("chatml-bpe");
    write(
        dir.path(),
        "tokenizer.json",
        "{\"version\": \"1.0\",\n  \"model\": {",
    );
    let error = load_error(dir.path());
    assert!(
        matches!(error, PreprocessError::Tokenizer { .. }),
        "{error:?}"
    );
    let text = error.to_string();
    assert!(
        text.starts_with(&format!(
            "{}: ",
            dir.path().join("tokenizer.json").display()
        )),
        "{text}"
    );
    assert!(text.contains("line 2"), "{text}");

    write(dir.path(), "tokenizer.json", "{\"version\": \"1.0\"}");
    let text = load_error(dir.path()).to_string();
    assert!(
        text.contains("tokenizer.json: not a usable Hugging Face tokenizer"),
        "{text}"
    );
}

#[test]
fn malformed_config_files_are_json_errors_naming_the_file() {
    for file in [
        "tokenizer_config.json",
        "config.json",
        "generation_config.json",
    ] {
        let dir = copy_of("chatml-bpe");
        write(dir.path(), file, "{\n  \"eos_token\": \"<|im_end|>\",\n}");
        match load_error(dir.path()) {
            PreprocessError::Json { path, source } => {
                assert_eq!(path, dir.path().join(file));
                assert_eq!(source.line(), 3, "{source}");
            }
            other => panic!("{file}: expected Json, got {other:?}"),
        }
    }
}

#[test]
fn a_config_file_that_is_not_an_object_is_rejected() {
    let dir = copy_of("chatml-bpe");
    write(dir.path(), "tokenizer_config.json", "[1, 2]");
    let expected = format!(
        "{}: expected a JSON object, found a list",
        dir.path().join("tokenizer_config.json").display()
    );
    assert_eq!(load_error(dir.path()).to_string(), expected);
}

#[test]
fn fields_of_the_wrong_type_are_named() {
    let dir = copy_of("llama-spm");
    set_field(
        dir.path(),
        "tokenizer_config.json",
        "add_bos_token",
        Some("yes".into()),
    );
    let text = load_error(dir.path()).to_string();
    assert!(
        text.ends_with(
            "tokenizer_config.json: `add_bos_token` must be true or false, found a string"
        ),
        "{text}"
    );

    let dir = copy_of("llama-spm");
    set_field(
        dir.path(),
        "config.json",
        "max_position_embeddings",
        Some((-1).into()),
    );
    let text = load_error(dir.path()).to_string();
    assert!(
        text.contains(
            "config.json: `max_position_embeddings` must be a positive 32-bit integer, found -1"
        ),
        "{text}"
    );

    let dir = copy_of("chatml-bpe");
    set_field(
        dir.path(),
        "generation_config.json",
        "eos_token_id",
        Some("<|im_end|>".into()),
    );
    let text = load_error(dir.path()).to_string();
    assert!(
        text.contains("generation_config.json: `eos_token_id` must be a token id"),
        "{text}"
    );
}

#[test]
fn an_eos_token_missing_from_the_vocabulary_means_mismatched_files() {
    let dir = copy_of("chatml-bpe");
    set_field(
        dir.path(),
        "tokenizer_config.json",
        "eos_token",
        Some("<|eot_id|>".into()),
    );
    let text = load_error(dir.path()).to_string();
    assert!(
        text.contains(
            "tokenizer_config.json: `eos_token` \"<|eot_id|>\" is not in the vocabulary of"
        ),
        "{text}"
    );
}

#[test]
fn without_tokenizer_config_the_simple_template_is_used() {
    let dir = copy_of("chatml-bpe");
    fs::remove_file(dir.path().join("tokenizer_config.json")).unwrap();
    let preprocessor = Preprocessor::from_dir(dir.path(), None).unwrap();
    assert_eq!(
        preprocessor.render_chat(&user("Hi")).unwrap(),
        "<|user|>\nHi\n<|assistant|>\n"
    );
    // The stop ids still come from config.json and generation_config.json.
    assert_eq!(preprocessor.eos_token_ids(), &[323, 321]);
}

#[test]
fn a_tokenizer_config_without_template_falls_back_to_the_simple_template() {
    let dir = copy_of("llama-spm");
    set_field(dir.path(), "tokenizer_config.json", "chat_template", None);
    let preprocessor = Preprocessor::from_dir(dir.path(), None).unwrap();
    assert_eq!(
        preprocessor.render_chat(&user("Hi")).unwrap(),
        "<|user|>\nHi\n<|assistant|>\n"
    );
}

#[test]
fn a_list_of_named_templates_uses_the_default_one() {
    let dir = copy_of("chatml-bpe");
    let templates = serde_json::json!([
        {"name": "tool_use", "template": "TOOLS {{ messages|length }}"},
        {"name": "default", "template": "{% for m in messages %}[{{ m.role }}] {{ m.content.strip() }}\n{% endfor %}{% if add_generation_prompt %}[assistant] {% endif %}"},
    ]);
    set_field(
        dir.path(),
        "tokenizer_config.json",
        "chat_template",
        Some(templates),
    );
    let preprocessor = Preprocessor::from_dir(dir.path(), None).unwrap();
    assert_eq!(
        preprocessor.render_chat(&user(" Hi ")).unwrap(),
        "[user] Hi\n[assistant] "
    );
}

#[test]
fn a_list_without_default_is_an_error_listing_the_names() {
    let dir = copy_of("chatml-bpe");
    let templates = serde_json::json!([{"name": "tool_use", "template": "x"}, {"name": "rag", "template": "y"}]);
    set_field(
        dir.path(),
        "tokenizer_config.json",
        "chat_template",
        Some(templates),
    );
    let text = load_error(dir.path()).to_string();
    assert!(text.ends_with("tokenizer_config.json: `chat_template` lists templates [\"tool_use\", \"rag\"] but none named \"default\""), "{text}");
}

#[test]
fn chat_template_jinja_overrides_tokenizer_config_and_chat_template_json() {
    let dir = copy_of("chatml-bpe");
    write(
        dir.path(),
        "chat_template.json",
        r#"{"chat_template": "json: {{ messages[0].content }}"}"#,
    );
    let preprocessor = Preprocessor::from_dir(dir.path(), None).unwrap();
    assert_eq!(preprocessor.render_chat(&user("Hi")).unwrap(), "json: Hi");

    write(
        dir.path(),
        "chat_template.jinja",
        "jinja: {{ messages[0].content }}{{ eos_token }}\n",
    );
    let preprocessor = Preprocessor::from_dir(dir.path(), None).unwrap();
    assert_eq!(
        preprocessor.render_chat(&user("Hi")).unwrap(),
        "jinja: Hi<|im_end|>"
    );
}

#[test]
fn a_template_syntax_error_fails_the_load_and_names_the_file() {
    let dir = copy_of("chatml-bpe");
    write(
        dir.path(),
        "chat_template.jinja",
        "{% for m in messages %}\n{{ m.content }\n",
    );
    match load_error(dir.path()) {
        error @ PreprocessError::TemplateSyntax { .. } => {
            let text = error.to_string();
            let prefix = format!(
                "{}: the chat template does not compile: ",
                dir.path().join("chat_template.jinja").display()
            );
            assert!(text.starts_with(&prefix), "{text}");
            assert!(text.ends_with("(in chat_template.jinja:2)"), "{text}");
        }
        other => panic!("expected TemplateSyntax, got {other:?}"),
    }
}

#[test]
fn a_template_failing_at_render_time_is_an_error_not_a_panic() {
    let dir = copy_of("chatml-bpe");
    write(
        dir.path(),
        "chat_template.jinja",
        "{{ messages[0].content.nosuchmethod() }}",
    );
    let preprocessor = Preprocessor::from_dir(dir.path(), None).unwrap();
    match preprocessor.render_chat(&user("Hi")) {
        Err(PreprocessError::TemplateRender(message)) => {
            assert!(message.contains("chat_template.jinja"), "{message}");
        }
        other => panic!("expected TemplateRender, got {other:?}"),
    }
    // The ChatML fixture indexes messages[0]: no messages at all is a render error too.
    assert!(matches!(
        chatml_render(&[]),
        Err(PreprocessError::TemplateRender(_))
    ));
}

fn chatml_render(messages: &[ChatMessage]) -> Result<String, PreprocessError> {
    Preprocessor::from_dir(&fixture("chatml-bpe"), None)
        .unwrap()
        .render_chat(messages)
}

#[test]
fn context_length_override_beats_the_files() {
    let preprocessor = Preprocessor::from_dir(&fixture("chatml-bpe"), Some(1000)).unwrap();
    assert_eq!(preprocessor.context_length(), 1000);
    let error = Preprocessor::from_dir(&fixture("chatml-bpe"), Some(0)).unwrap_err();
    assert!(matches!(error, PreprocessError::ZeroContextLength));
}

#[test]
fn context_length_falls_back_to_model_max_length_then_fails_clearly() {
    let dir = copy_of("chatml-bpe");
    fs::remove_file(dir.path().join("config.json")).unwrap();
    assert_eq!(
        Preprocessor::from_dir(dir.path(), None)
            .unwrap()
            .context_length(),
        131_072
    );

    // llama-spm's model_max_length is transformers' "no limit" sentinel.
    let dir = copy_of("llama-spm");
    fs::remove_file(dir.path().join("config.json")).unwrap();
    let error = load_error(dir.path());
    assert!(matches!(
        error,
        PreprocessError::UnknownContextLength { .. }
    ));
    let text = error.to_string();
    assert!(
        text.starts_with(&format!(
            "{}: cannot tell the model's context length",
            dir.path().display()
        )),
        "{text}"
    );
    assert!(
        text.contains("max_position_embeddings")
            && text.ends_with("set the context length explicitly"),
        "{text}"
    );
    assert_eq!(
        Preprocessor::from_dir(dir.path(), Some(2048))
            .unwrap()
            .context_length(),
        2048
    );
}

#[test]
fn context_length_of_a_multimodal_config_comes_from_text_config() {
    let dir = copy_of("llama-spm");
    write(
        dir.path(),
        "config.json",
        r#"{"model_type": "llava", "text_config": {"max_position_embeddings": 8192}}"#,
    );
    assert_eq!(
        Preprocessor::from_dir(dir.path(), None)
            .unwrap()
            .context_length(),
        8192
    );
}

#[test]
fn add_bos_token_false_leaves_plain_prompts_alone() {
    let dir = copy_of("llama-spm");
    set_field(
        dir.path(),
        "tokenizer_config.json",
        "add_bos_token",
        Some(false.into()),
    );
    let preprocessor = Preprocessor::from_dir(dir.path(), None).unwrap();
    assert_eq!(
        preprocessor.encode_completion_prompt("Hello").unwrap(),
        preprocessor.encode("Hello").unwrap()
    );

    // Without add_bos_token the tokenizer's post-processor (which adds <s>) decides.
    let dir = copy_of("llama-spm");
    set_field(dir.path(), "tokenizer_config.json", "add_bos_token", None);
    set_field(dir.path(), "tokenizer_config.json", "add_eos_token", None);
    let preprocessor = Preprocessor::from_dir(dir.path(), None).unwrap();
    assert_eq!(
        preprocessor
            .encode_completion_prompt("Hello")
            .unwrap()
            .first(),
        Some(&1)
    );

    // add_eos_token appends </s>.
    let dir = copy_of("llama-spm");
    set_field(
        dir.path(),
        "tokenizer_config.json",
        "add_eos_token",
        Some(true.into()),
    );
    let preprocessor = Preprocessor::from_dir(dir.path(), None).unwrap();
    let tokens = preprocessor.encode_completion_prompt("Hello").unwrap();
    assert_eq!((tokens.first(), tokens.last()), (Some(&1), Some(&2)));
}
