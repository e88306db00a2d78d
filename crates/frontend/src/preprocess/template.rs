//! Chat templates: the built-in simple one, and Hugging Face Jinja templates run by minijinja.

use std::fmt;
use std::path::Path;

use minijinja::{AutoEscape, Environment, ErrorKind, Value, context};
use serde::{Deserialize, Serialize};

use super::error::PreprocessError;

/// One chat message as a template sees it: its text and, for an assistant turn that called
/// tools, the calls; for a tool result, the call it answers.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<TemplateToolCall>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// A tool result's function name (some templates print it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// A tool call in the history, shaped as Hugging Face templates read it: `arguments` is the
/// parsed JSON object (templates write it with `tojson`), not OpenAI's string.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TemplateToolCall {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub function: TemplateFunction,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TemplateFunction {
    pub name: String,
    pub arguments: serde_json::Value,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
            ..Self::default()
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
    /// Renders the messages; `tools` (OpenAI tool objects) are the template's `tools`
    /// variable, absent when there are none.
    pub(crate) fn render(
        &self,
        messages: &[ChatMessage],
        tools: &[serde_json::Value],
        add_generation_prompt: bool,
    ) -> Result<String, PreprocessError> {
        match self {
            Self::Simple => Ok(render_simple(messages, add_generation_prompt)),
            Self::Jinja(template) => template.render(messages, tools, add_generation_prompt),
        }
    }

    /// Whether the template lays out tools itself (it reads a `tools` variable); one that
    /// does not gets them in the default format (`crate::tools::prompt`).
    pub(crate) fn handles_tools(&self) -> bool {
        match self {
            Self::Simple => false,
            Self::Jinja(template) => template.handles_tools,
        }
    }

    /// The source of the template, if it is a Jinja one (to choose a tool-call parser).
    pub(crate) fn source(&self) -> Option<&str> {
        match self {
            Self::Simple => None,
            Self::Jinja(template) => Some(&template.source),
        }
    }

    /// `source` compiled in place of this template, with the same special tokens.
    pub(crate) fn replaced(&self, source: String, origin: &Path) -> Result<Self, PreprocessError> {
        let tokens = match self {
            Self::Simple => Value::from_iter(std::iter::empty::<(&str, Value)>()),
            Self::Jinja(template) => template.tokens.clone(),
        };
        Ok(Self::Jinja(Box::new(JinjaTemplate::compile_with(
            source, origin, tokens,
        )?)))
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
    /// The template's text, kept to tell which tool-call format it asks for.
    source: String,
    /// The template reads a `tools` variable.
    handles_tools: bool,
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
        Self::compile_with(source, origin, tokens)
    }

    /// Compiles `source` with special tokens already made globals.
    fn compile_with(source: String, origin: &Path, tokens: Value) -> Result<Self, PreprocessError> {
        let handles_tools = mentions_tools(&source);
        let kept = source.clone();
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
        Ok(Self {
            env,
            name,
            tokens,
            source: kept,
            handles_tools,
        })
    }

    fn render(
        &self,
        messages: &[ChatMessage],
        tools: &[serde_json::Value],
        add_generation_prompt: bool,
    ) -> Result<String, PreprocessError> {
        let template = self.env.get_template(&self.name).map_err(classify)?;
        // Absent rather than empty without tools, as transformers passes them: templates
        // test `tools is defined` or `tools` alike.
        let tools = (!tools.is_empty()).then(|| Value::from_serialize(tools));
        let context = context! {
            messages => Value::from_serialize(messages),
            tools => tools,
            add_generation_prompt => add_generation_prompt,
            ..self.tokens.clone()
        };
        template.render(context).map_err(classify)
    }
}

/// Whether a template's source names `tools` as a word (not as part of a longer name).
fn mentions_tools(source: &str) -> bool {
    source.match_indices("tools").any(|(at, _)| {
        let before = source[..at].chars().next_back();
        let after = source[at + 5..].chars().next();
        let word = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
        !word(before) && !word(after)
    })
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
        compile(source)?.render(messages, &[], true)
    }

    #[test]
    fn tools_and_tool_calls_reach_the_template() {
        let source = "{% if tools %}{% for t in tools %}[{{ t.function.name }}]{% endfor %}{% endif %}\
                      {% for m in messages %}{{ m.role }}:{{ m.content }}\
                      {% for c in m.tool_calls or [] %}<{{ c.function.name }} {{ c.function.arguments | tojson }}>{% endfor %}\
                      {% if m.tool_call_id %}#{{ m.tool_call_id }}{% endif %};{% endfor %}";
        let template = compile(source).unwrap();
        assert!(template.handles_tools);
        let mut call = ChatMessage::new("assistant", "");
        call.tool_calls = vec![TemplateToolCall {
            id: "c1".into(),
            kind: "function".into(),
            function: TemplateFunction {
                name: "f".into(),
                arguments: serde_json::json!({"x": 1}),
            },
        }];
        let mut result = ChatMessage::new("tool", "2");
        result.tool_call_id = Some("c1".into());
        let tools = [serde_json::json!({"type": "function", "function": {"name": "f"}})];
        let out = template.render(&[call.clone(), result.clone()], &tools, false);
        assert_eq!(
            out.ok().as_deref(),
            Some("[f]assistant:<f {\"x\":1}>;tool:2#c1;")
        );
        // Without tools the variable is absent, not an empty list.
        let out = template.render(&[], &[], false);
        assert_eq!(out.ok().as_deref(), Some(""));
    }

    #[test]
    fn tools_must_be_a_word_of_the_template() {
        assert!(mentions_tools("{% if tools %}"));
        assert!(mentions_tools("{{ tools|length }}"));
        assert!(!mentions_tools("{% if custom_tools_list %}"));
        assert!(!mentions_tools("{{ mytools }}"));
    }

    #[test]
    fn a_replaced_template_keeps_the_special_tokens() {
        let template = ChatTemplate::Jinja(Box::new(compile("x").unwrap()));
        let replaced = template
            .replaced("{{ bos_token }}!".into(), Path::new("/t.jinja"))
            .unwrap();
        assert_eq!(
            replaced.render(&[], &[], false).ok().as_deref(),
            Some("<s>!")
        );
        let simple = ChatTemplate::Simple
            .replaced("{{ bos_token is defined }}".into(), Path::new("/t.jinja"))
            .unwrap();
        assert_eq!(
            simple.render(&[], &[], false).ok().as_deref(),
            Some("False")
        );
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
