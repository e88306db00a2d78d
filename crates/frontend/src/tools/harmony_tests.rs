//! gpt-oss's Harmony format: answers made of messages parse to the reasoning, content and
//! calls they were made of, whole or cut into any chunks.

use proptest::prelude::*;
use serde_json::json;

use super::format_tests::cut_at;
use super::output::{Answer, Part};
use super::*;

/// One message of an answer.
#[derive(Debug, Clone)]
enum Message {
    Analysis(String),
    /// A preamble: commentary to no one.
    Preamble(String),
    Final(String),
    /// A call of `weather` with this city; the recipient before the channel or after it.
    Call(String, bool),
    /// Input to a built-in tool.
    Browser(String),
}

fn message() -> impl Strategy<Value = Message> {
    let text = "[a-zA-Z0-9é😀 .,<>{}\"\n]{0,20}";
    prop_oneof![
        text.prop_map(Message::Analysis),
        text.prop_map(Message::Preamble),
        text.prop_map(Message::Final),
        ("[a-zA-Zé ]{1,12}", any::<bool>()).prop_map(|(c, first)| Message::Call(c, first)),
        text.prop_map(Message::Browser),
    ]
}

fn arguments(city: &str) -> String {
    json!({"city": city}).to_string()
}

/// The answer's text, after a prompt that ends with `<|start|>assistant`; the last
/// message's end left out when `cut_end` (the tokens that end generation are not text).
fn render(messages: &[Message], cut_end: bool) -> String {
    let mut text = String::new();
    for (i, m) in messages.iter().enumerate() {
        if i > 0 {
            text.push_str("<|start|>assistant");
        }
        let (header, body, end) = match m {
            Message::Analysis(t) => ("<|channel|>analysis".to_owned(), t.clone(), "<|end|>"),
            Message::Preamble(t) => ("<|channel|>commentary".to_owned(), t.clone(), "<|end|>"),
            Message::Final(t) => ("<|channel|>final".to_owned(), t.clone(), "<|return|>"),
            Message::Call(city, true) => (
                " to=functions.weather<|channel|>commentary json".to_owned(),
                arguments(city),
                "<|call|>",
            ),
            Message::Call(city, false) => (
                "<|channel|>commentary to=functions.weather <|constrain|>json".to_owned(),
                arguments(city),
                "<|call|>",
            ),
            Message::Browser(t) => (
                "<|channel|>analysis to=browser.search code".to_owned(),
                t.clone(),
                "<|call|>",
            ),
        };
        text.push_str(&header);
        text.push_str("<|message|>");
        text.push_str(&body);
        if !(cut_end && i + 1 == messages.len()) {
            text.push_str(end);
        }
    }
    text
}

/// What the messages say: content, reasoning, the calls' arguments.
fn expected(messages: &[Message], parallel: bool) -> (String, String, Vec<String>) {
    let (mut content, mut reasoning, mut calls) = (String::new(), String::new(), Vec::new());
    for m in messages {
        match m {
            Message::Analysis(t) | Message::Browser(t) => reasoning.push_str(t),
            Message::Preamble(t) | Message::Final(t) => content.push_str(t),
            Message::Call(city, _) => calls.push(arguments(city)),
        }
    }
    if !parallel {
        calls.truncate(1);
    }
    (content, reasoning, calls)
}

fn tools(parallel: bool) -> ToolRequest {
    let body = json!({
        "model": "gpt-oss-20b",
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"type": "function", "function": {"name": "weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
        "parallel_tool_calls": parallel,
    });
    ToolRequest::of(&serde_json::from_value(body).unwrap())
        .unwrap()
        .unwrap()
}

/// The answer `text` parses to, pushed in the pieces `bounds` cut.
fn parse(text: &str, bounds: &[usize], tools: Option<&ToolRequest>) -> Answer {
    let parsers = Parsers::new(&ChatConfig::default(), "openai/gpt-oss-20b", None);
    assert_eq!(parsers.tool_parser(), HARMONY);
    assert!(parsers.keeps_special_tokens(tools));
    let mut parser = parsers.for_answer(tools);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut parts: Vec<Part> = Vec::new();
        for pair in bounds.windows(2) {
            parts.extend(parser.push(&text[pair[0]..pair[1]]).await);
        }
        parts.extend(parser.finish().await);
        let called = parts.iter().any(|p| matches!(p, Part::Calls(_)));
        assert_eq!(parser.finish_reason("stop") == "tool_calls", called);
        output::aggregate(parts)
    })
}

fn summary(answer: &Answer) -> (String, String, Vec<String>) {
    (
        answer.content.clone(),
        answer.reasoning.clone().unwrap_or_default(),
        answer
            .calls
            .iter()
            .inspect(|c| assert_eq!(c.function.name, "weather"))
            .map(|c| c.function.arguments.clone())
            .collect(),
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn harmony_answers_stream_exactly_as_they_parse_whole(
        messages in prop::collection::vec(message(), 0..6),
        cut_end in any::<bool>(),
        parallel in any::<bool>(),
        cuts in prop::collection::vec(0usize..800, 0..32),
    ) {
        let text = render(&messages, cut_end);
        let tools = tools(parallel);
        let whole = parse(&text, &[0, text.len()], Some(&tools));
        prop_assert_eq!(summary(&whole), expected(&messages, parallel), "{:?}", text);
        let ids: std::collections::HashSet<&str> = whole.calls.iter().map(|c| c.id.as_str()).collect();
        prop_assert_eq!(ids.len(), whole.calls.len(), "each call has its own id");
        let bounds = cut_at(&text, &cuts);
        let streamed = parse(&text, &bounds, Some(&tools));
        prop_assert_eq!(summary(&streamed), summary(&whole), "{:?} cut at {:?}", text, bounds);
        // Byte by byte, where characters allow.
        let every: Vec<usize> = (0..=text.len()).filter(|&c| text.is_char_boundary(c)).collect();
        prop_assert_eq!(summary(&parse(&text, &every, Some(&tools))), summary(&whole));
        // The parser alone, without the pieces `Recut` makes: the same.
        let mut alone = harmony::Harmony::new(true, parallel);
        let mut parts = Vec::new();
        for pair in every.windows(2) {
            parts.extend(alone.push(&text[pair[0]..pair[1]]));
        }
        parts.extend(alone.finish());
        prop_assert_eq!(summary(&output::aggregate(parts)), summary(&whole));
    }
}

#[test]
fn an_answer_in_no_format_is_content_and_calls_without_tools_are_reasoning() {
    for text in ["Hello there.", "to be or not", "<b>bold</b>", ""] {
        let answer = parse(text, &[0, text.len()], None);
        assert_eq!(
            summary(&answer),
            (text.to_owned(), String::new(), Vec::new())
        );
    }
    // `tool_choice: "none"`: a call written anyway is not the answer.
    let text = "<|channel|>commentary to=functions.weather json<|message|>{}<|call|>";
    let answer = parse(text, &[0, text.len()], None);
    assert_eq!(
        summary(&answer),
        (String::new(), "{}".to_owned(), Vec::new())
    );
    // An unknown marker inside a body is its text; a header never finished is dropped.
    let text = "<|channel|>final<|message|>a<|constrain|>b<|start|>assistant<|channel|>fin";
    let answer = parse(text, &[0, text.len()], None);
    assert_eq!(answer.content, "a<|constrain|>b");
}

#[test]
fn harmony_is_chosen_by_name_model_or_template() {
    let named = ChatConfig {
        tool_call_parser: Some(HARMONY.into()),
        ..ChatConfig::default()
    };
    assert!(named.validate().is_ok());
    assert_eq!(Parsers::new(&named, "m", None).tool_parser(), HARMONY);
    let template = "{{ '<|start|>assistant<|channel|>final<|message|>' }}";
    let default = ChatConfig::default();
    assert_eq!(
        Parsers::new(&default, "m", Some(template)).tool_parser(),
        HARMONY
    );
    assert_eq!(
        Parsers::new(&default, "GPT-OSS-120B", None).tool_parser(),
        HARMONY
    );
    assert_ne!(Parsers::new(&default, "m", None).tool_parser(), HARMONY);
    // A forced call is JSON from its first token: not read as Harmony.
    let parsers = Parsers::new(&named, "m", None);
    let mut forced = tools(true);
    forced.choice = Choice::Required;
    assert!(!parsers.keeps_special_tokens(Some(&forced)));
    assert!(!parsers.for_answer(Some(&forced)).keeps_special_tokens());
}
