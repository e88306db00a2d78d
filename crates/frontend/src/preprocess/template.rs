//! Chat templates: the built-in simple one, and Hugging Face Jinja templates run by minijinja.

use std::fmt;
use std::path::Path;

use minijinja::{AutoEscape, Environment, ErrorKind, Value, context};
use serde::{Deserialize, Serialize};

use super::error::PreprocessError;

/// One chat message, text only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// The special tokens a template may refer to by name (`{{ bos_token }}`); absent ones are
/// undefined in the template, so `bos_token is defined` works.
#[derive(Debug, Clone, Default)]
pub(crate) struct TemplateTokens {
    pub(crate) bos_token: Option<String>,
    pub(crate) eos_token: Option<String>,
    pub(crate) unk_token: Option<String>,
    pub(crate) pad_token: Option<String>,
}

#[derive(Debug)]
pub(crate) enum ChatTemplate {
    /// `<|{role}|>\n{content}\n` per message, then `<|assistant|>\n`.
    Simple,
    Jinja(Box<JinjaTemplate>),
}

impl ChatTemplate {
    pub(crate) fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, PreprocessError> {
        match self {
            Self::Simple => Ok(render_simple(messages, add_generation_prompt)),
            Self::Jinja(template) => template.render(messages, add_generation_prompt),
        }
    }
}

fn render_simple(messages: &[ChatMessage], add_generation_prompt: bool) -> String {
    let size: usize = messages
        .iter()
        .map(|m| m.role.len() + m.content.len() + 6)
        .sum();
    let mut out = String::with_capacity(size + 16);
    for message in messages {
        out.push_str("<|");
        out.push_str(&message.role);
        out.push_str("|>\n");
        out.push_str(&message.content);
        out.push('\n');
    }
    if add_generation_prompt {
        out.push_str("<|assistant|>\n");
    }
    out
}

/// A compiled Jinja chat template. Compiled once when the model loads, so a syntax error
/// stops startup instead of failing every request.
pub(crate) struct JinjaTemplate {
    env: Environment<'static>,
    /// The template's name in `env`: the file it came from, so errors point at it.
    name: String,
    /// Special tokens as template globals.
    tokens: Value,
}

impl fmt::Debug for JinjaTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JinjaTemplate")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl JinjaTemplate {
    /// Compiles `source`, read from `origin`.
    pub(crate) fn compile(
        source: String,
        origin: &Path,
        tokens: &TemplateTokens,
    ) -> Result<Self, PreprocessError> {
        let mut env = Environment::new();
        // transformers renders chat templates with these Jinja2 options; templates are written
        // for them, and whitespace in the prompt changes the tokens the model sees.
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        // minijinja picks escaping from the template's name (JSON-escapes `*.json`); chat
        // prompts are plain text.
        env.set_auto_escape_callback(|_| AutoEscape::None);
        // Python string, list and dict methods (`.strip()`, `.startswith()`, `.items()`, ...),
        // which templates written for Jinja2 call freely.
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        let name = origin.file_name().map_or_else(
            || "chat_template".to_owned(),
            |name| name.to_string_lossy().into_owned(),
        );
        env.add_template_owned(name.clone(), source)
            .map_err(|error| PreprocessError::TemplateSyntax {
                path: origin.to_owned(),
                message: error.to_string(),
            })?;
        let tokens = Value::from_iter(
            [
                ("bos_token", &tokens.bos_token),
                ("eos_token", &tokens.eos_token),
                ("unk_token", &tokens.unk_token),
                ("pad_token", &tokens.pad_token),
            ]
            .into_iter()
            .filter_map(|(name, token)| Some((name, Value::from(token.clone()?)))),
        );
        Ok(Self { env, name, tokens })
    }

    fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, PreprocessError> {
        let template = self.env.get_template(&self.name).map_err(classify)?;
        let context = context! {
            messages => Value::from_serialize(messages),
            add_generation_prompt => add_generation_prompt,
            ..self.tokens.clone()
        };
        template.render(context).map_err(classify)
    }
}

/// What a template's `raise_exception(message)` raised, kept as the error's source so it can
/// be told apart from template bugs.
#[derive(Debug)]
struct Raised(String);

impl fmt::Display for Raised {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Raised {}

fn raise_exception(message: String) -> Result<Value, minijinja::Error> {
    Err(
        minijinja::Error::new(ErrorKind::InvalidOperation, message.clone())
            .with_source(Raised(message)),
    )
}

fn classify(error: minijinja::Error) -> PreprocessError {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&error);
    while let Some(current) = cause {
        if let Some(Raised(message)) = current.downcast_ref::<Raised>() {
            return PreprocessError::TemplateRaised(message.clone());
        }
        cause = current.source();
    }
    PreprocessError::TemplateRender(error.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn compile(source: &str) -> Result<JinjaTemplate, PreprocessError> {
        let tokens = TemplateTokens {
            bos_token: Some("<s>".into()),
            ..TemplateTokens::default()
        };
        JinjaTemplate::compile(
            source.into(),
            Path::new("/m/tokenizer_config.json"),
            &tokens,
        )
    }

    fn render(source: &str, messages: &[ChatMessage]) -> Result<String, PreprocessError> {
        compile(source)?.render(messages, true)
    }

    #[test]
    fn simple_template_layout() {
        let messages = [
            ChatMessage::new("system", "Be brief."),
            ChatMessage::new("user", "Hi"),
        ];
        assert_eq!(
            render_simple(&messages, true),
            "<|system|>\nBe brief.\n<|user|>\nHi\n<|assistant|>\n"
        );
        assert_eq!(render_simple(&[], false), "");
    }

    #[test]
    fn python_methods_work() {
        let source = "{% for m in messages %}{{ m.content.strip().upper() }}\
                      {% if m.role.startswith('us') %}!{% endif %}{% endfor %}\
                      {% for k, v in {'a': 1}.items() %}{{ k }}={{ v }}{% endfor %}";
        let out = render(source, &[ChatMessage::new("user", "  hi  ")]);
        assert_eq!(out.ok().as_deref(), Some("HI!a=1"));
    }

    #[test]
    fn blocks_trim_like_transformers() {
        // lstrip_blocks drops the indentation before a block tag, trim_blocks the newline
        // after it; `{{ }}` lines keep theirs.
        let source = "{% for m in messages %}\n  {% if true %}\n{{ m.content }}\n  {% endif %}\n{% endfor %}";
        let out = render(
            source,
            &[ChatMessage::new("user", "a"), ChatMessage::new("user", "b")],
        );
        assert_eq!(out.ok().as_deref(), Some("a\nb\n"));
    }

    #[test]
    fn special_tokens_are_globals_and_absent_ones_undefined() {
        let source = "{{ bos_token }}|{{ eos_token is defined }}|{{ add_generation_prompt }}";
        assert_eq!(render(source, &[]).ok().as_deref(), Some("<s>|False|True"));
    }

    #[test]
    fn raise_exception_carries_the_message() {
        let source =
            "{% if messages|length == 0 %}{{ raise_exception('Need a message') }}{% endif %}";
        match render(source, &[]) {
            Err(PreprocessError::TemplateRaised(message)) => assert_eq!(message, "Need a message"),
            other => panic!("expected TemplateRaised, got {other:?}"),
        }
    }

    #[test]
    fn runtime_errors_are_render_errors_naming_the_file() {
        for source in [
            "{{ messages[0].content | nosuchfilter }}",
            "{{ 1 // 0 }}",
            "{{ nosuch() }}",
        ] {
            match render(source, &[ChatMessage::new("user", "hi")]) {
                Err(PreprocessError::TemplateRender(message)) => {
                    assert!(message.contains("tokenizer_config.json"), "{message}");
                }
                other => panic!("{source}: expected TemplateRender, got {other:?}"),
            }
        }
    }

    #[test]
    fn syntax_errors_name_the_file() {
        match compile("{% for m in messages %}") {
            Err(error @ PreprocessError::TemplateSyntax { .. }) => {
                let text = error.to_string();
                assert!(text.starts_with("/m/tokenizer_config.json: "), "{text}");
            }
            other => panic!("expected TemplateSyntax, got {other:?}"),
        }
    }
}
