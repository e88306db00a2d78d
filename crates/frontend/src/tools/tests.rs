use proptest::prelude::*;

use super::output::{Answer, AnswerParser, Part, Recut};
use super::*;

fn request(body: serde_json::Value) -> ChatCompletionRequest {
    let mut base = serde_json::json!({
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
    });
    if let (Some(base), Some(extra)) = (base.as_object_mut(), body.as_object()) {
        base.extend(extra.clone());
    }
    serde_json::from_value(base).unwrap()
}

fn weather_tools() -> serde_json::Value {
    serde_json::json!([
        {"type": "function", "function": {"name": "weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
        {"type": "function", "function": {"name": "time"}},
    ])
}

fn tool_request(extra: serde_json::Value) -> ToolRequest {
    let mut body = serde_json::json!({"tools": weather_tools()});
    if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
        body.extend(extra.clone());
    }
    ToolRequest::of(&request(body)).unwrap().unwrap()
}

fn block_on<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(future)
}

const TWO_CALLS: &str = "Checking.\n<tool_call>\n{\"name\": \"weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"time\", \"arguments\": {}}\n</tool_call>";

/// The calls and content a stream's parts add up to, as a client assembles them.
fn assemble(parts: &[Part]) -> (String, String, Vec<(String, String, String)>) {
    let (mut content, mut reasoning) = (String::new(), String::new());
    let mut calls: Vec<(String, String, String)> = Vec::new();
    for part in parts {
        match part {
            Part::Content(t) => content.push_str(t),
            Part::Reasoning(t) => reasoning.push_str(t),
            Part::Calls(deltas) => {
                for d in deltas {
                    let i = d.index as usize;
                    if let Some(id) = &d.id {
                        assert_eq!(i, calls.len(), "a new call comes with the next index");
                        let name = d.function.name.clone().unwrap_or_default();
                        calls.push((id.clone(), name, String::new()));
                    }
                    calls[i]
                        .2
                        .push_str(d.function.arguments.as_deref().unwrap_or(""));
                }
            }
        }
    }
    (content, reasoning, calls)
}

/// Where a text is cut into chunks: `cuts` folded into it, on character boundaries, with
/// its start and end.
fn cut_points(text: &str, cuts: &[usize]) -> Vec<usize> {
    let mut bounds: Vec<usize> = cuts
        .iter()
        .map(|&c| c % (text.len() + 1))
        .filter(|&c| text.is_char_boundary(c))
        .collect();
    bounds.extend([0, text.len()]);
    bounds.sort_unstable();
    bounds.dedup();
    bounds
}

fn streamed(parsers: &Parsers, tools: &ToolRequest, text: &str, cuts: &[usize]) -> Vec<Part> {
    let mut parser = parsers.for_answer(Some(tools));
    let parts = stream_through(&mut parser, text, cuts);
    assert!(parser.called());
    parts
}

/// The parts `parser` makes of `text` pushed in the chunks `cuts` make, then finished.
fn stream_through(parser: &mut AnswerParser, text: &str, cuts: &[usize]) -> Vec<Part> {
    let bounds = cut_points(text, cuts);
    block_on(async {
        let mut parts = Vec::new();
        for pair in bounds.windows(2) {
            parts.extend(parser.push(&text[pair[0]..pair[1]]).await);
        }
        parts.extend(parser.finish().await);
        parts
    })
}

fn args(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap()
}

#[test]
fn a_whole_answer_splits_into_content_and_calls() {
    let parsers = Parsers::new(&ChatConfig::default(), "m", None);
    assert_eq!(parsers.tool_parser(), DEFAULT_TOOL_PARSER);
    let tools = tool_request(serde_json::json!({}));
    let mut parser = parsers.for_answer(Some(&tools));
    let Answer {
        content,
        reasoning,
        calls,
    } = block_on(parser.parse_whole(TWO_CALLS.into()));
    assert_eq!(content.trim(), "Checking.");
    assert_eq!(reasoning, None);
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[0].function.name, "weather");
    assert_eq!(
        args(&calls[0].function.arguments),
        serde_json::json!({"city": "Oslo"})
    );
    assert_eq!(calls[1].function.name, "time");
    assert!(calls.iter().all(|c| c.id.starts_with("call_")));
    assert_ne!(calls[0].id, calls[1].id);
    assert_eq!(parser.finish_reason("stop"), "tool_calls");
    assert_eq!(parser.finish_reason("length"), "length");
}

#[test]
fn without_parallel_calls_only_the_first_is_kept() {
    let parsers = Parsers::new(&ChatConfig::default(), "m", None);
    let tools = tool_request(serde_json::json!({"parallel_tool_calls": false}));
    let mut parser = parsers.for_answer(Some(&tools));
    let answer = block_on(parser.parse_whole(TWO_CALLS.into()));
    assert_eq!(answer.calls.len(), 1);
    let parts = streamed(&parsers, &tools, TWO_CALLS, &[7, 40, 90]);
    let (_, _, calls) = assemble(&parts);
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].1, "weather");
}

#[test]
fn plain_text_is_content_and_tool_choice_none_parses_nothing() {
    let parsers = Parsers::new(&ChatConfig::default(), "m", None);
    let tools = tool_request(serde_json::json!({}));
    let mut parser = parsers.for_answer(Some(&tools));
    let answer = block_on(parser.parse_whole("It is sunny.".into()));
    assert_eq!(answer.content, "It is sunny.");
    assert!(answer.calls.is_empty());
    assert_eq!(parser.finish_reason("stop"), "stop");
    let none = tool_request(serde_json::json!({"tool_choice": "none"}));
    assert!(none.template_tools().is_empty());
    let mut parser = parsers.for_answer(Some(&none));
    assert!(parser.is_plain());
    let answer = block_on(parser.parse_whole(TWO_CALLS.into()));
    assert_eq!(answer.content, TWO_CALLS);
}

#[test]
fn reasoning_is_split_off_whole_and_streamed() {
    let config = ChatConfig {
        reasoning_parser: Some("deepseek_r1".into()),
        ..ChatConfig::default()
    };
    let parsers = Parsers::new(&config, "m", None);
    let text = "<think>Oslo is cold.</think>It is 4 degrees.";
    let mut parser = parsers.for_answer(None);
    let answer = block_on(parser.parse_whole(text.into()));
    assert_eq!(
        answer.reasoning.as_deref().map(str::trim),
        Some("Oslo is cold.")
    );
    assert_eq!(answer.content.trim(), "It is 4 degrees.");
    let mut parser = parsers.for_answer(None);
    let parts = block_on(async {
        let mut parts = Vec::new();
        for piece in [
            "<thi",
            "nk>Oslo is",
            " cold.</th",
            "ink>It is 4",
            " degrees.",
        ] {
            parts.extend(parser.push(piece).await);
        }
        parts.extend(parser.finish().await);
        parts
    });
    let (content, reasoning, _) = assemble(&parts);
    assert_eq!(reasoning.trim(), "Oslo is cold.");
    assert_eq!(content.trim(), "It is 4 degrees.");
}

#[test]
fn parsers_follow_config_then_model_then_template() {
    let named = |name: &str| ChatConfig {
        tool_call_parser: Some(name.into()),
        ..ChatConfig::default()
    };
    assert_eq!(
        Parsers::new(&named("llama"), "m", None).tool_parser(),
        "llama"
    );
    assert_eq!(
        Parsers::new(&ChatConfig::default(), "mistral-7b-instruct", None).tool_parser(),
        "mistral"
    );
    assert_eq!(
        Parsers::new(&ChatConfig::default(), "m", Some("{{ '[TOOL_CALLS]' }}")).tool_parser(),
        "mistral"
    );
    assert!(named("no-such-parser").validate().is_err());
    assert!(named("qwen").validate().is_ok());
    let reasoning = ChatConfig {
        reasoning_parser: Some("nope".into()),
        ..ChatConfig::default()
    };
    assert!(
        reasoning
            .validate()
            .unwrap_err()
            .contains("reasoning_parser")
    );
    assert_eq!(
        Parsers::new(&ChatConfig::default(), "deepseek-r1-distill", None)
            .reasoning_parser()
            .as_deref(),
        Some("deepseek_r1")
    );
    // Chosen by the model although its type's name is not the registered one.
    let thinking = Parsers::new(&ChatConfig::default(), "qwen3-thinking-2507", None);
    assert!(thinking.reasoning_parser().is_some());
    let answer = block_on(
        thinking
            .for_answer(None)
            .parse_whole("Cold there.</think>It is 4 degrees.".into()),
    );
    assert_eq!(
        answer.reasoning.as_deref().map(str::trim),
        Some("Cold there.")
    );
    assert_eq!(answer.content.trim(), "It is 4 degrees.");
    assert_eq!(
        Parsers::new(&ChatConfig::default(), "m", None).reasoning_parser(),
        None
    );
}

#[test]
fn bad_tools_are_refused_naming_the_field() {
    let refused = |body: serde_json::Value| -> String {
        let error = ToolRequest::of(&request(body)).unwrap_err();
        error.body()
    };
    let tool = |name: &str| serde_json::json!([{"type": "function", "function": {"name": name}}]);
    assert!(
        refused(serde_json::json!({"tools": tool("has space")})).contains("tools[0].function.name")
    );
    assert!(
        refused(serde_json::json!({"tools": [
        {"type": "function", "function": {"name": "f"}},
        {"type": "function", "function": {"name": "f"}}]}))
        .contains("tools[1].function.name")
    );
    assert!(
        refused(serde_json::json!({"tools": [{"type": "retrieval", "function": {"name": "f"}}]}))
            .contains("tools[0].type")
    );
    assert!(refused(serde_json::json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": 3}}]}))
        .contains("parameters"));
    // With `auto`, a strict function needs a format with a grammar.
    let strict = ToolRequest::of(&request(
        serde_json::json!({"tools": [{"type": "function", "function": {"name": "f", "strict": true}}]}),
    ))
    .unwrap()
    .unwrap();
    assert!(
        strict
            .constraint("llama")
            .unwrap_err()
            .body()
            .contains("tools[0].function.strict")
    );
    assert!(matches!(
        strict.constraint("qwen").unwrap(),
        Some(switchyard_core::protocol::Constraint::Grammar(_))
    ));
    // Forced, a strict function's arguments are enforced.
    assert!(
        ToolRequest::of(&request(
            serde_json::json!({"tool_choice": "required", "tools": [
            {"type": "function", "function": {"name": "f", "strict": true}}]})
        ))
        .unwrap()
        .is_some()
    );
    assert!(
        ToolRequest::of(&request(serde_json::json!({"tools": [
            {"type": "function", "function": {"name": "f", "strict": false}}]})))
        .unwrap()
        .is_some()
    );
    assert!(
        refused(serde_json::json!({"tools": tool("f"), "tool_choice": "sometimes"}))
            .contains("tool_choice")
    );
    assert!(refused(serde_json::json!({"tool_choice": "required"})).contains("only allowed"));
    assert!(
        refused(serde_json::json!({"tools": tool("f"),
        "tool_choice": {"type": "function", "function": {"name": "g"}}}))
        .contains("not among")
    );
    assert!(refused(serde_json::json!({"tool_choice": "auto"})).contains("only allowed"));
    assert!(refused(serde_json::json!({"functions": [{"name": "f"}]})).contains("functions"));
    assert!(
        ToolRequest::of(&request(serde_json::json!({"tool_choice": "none"})))
            .unwrap()
            .is_none()
    );
    assert!(
        ToolRequest::of(&request(serde_json::json!({})))
            .unwrap()
            .is_none()
    );
}

#[test]
fn recut_keeps_tags_whole_and_apart() {
    let mut recut = Recut::default();
    let mut pieces = Vec::new();
    for chunk in [
        "Checking.\n<tool",
        "_call>\n{\"a\": [1]}</tool_call>x",
        "y <",
    ] {
        pieces.extend(recut.push(chunk));
    }
    pieces.extend(recut.flush());
    assert_eq!(
        pieces,
        [
            "Checking.\n",
            "<tool_call>",
            "\n",
            "{\"a\": ",
            "[1]}",
            "</tool_call>",
            "xy ",
            "<"
        ]
    );
    // A `<` that no `>` closes soon passes on.
    let long = format!("a <{}", "b".repeat(80));
    let mut recut = Recut::default();
    let pieces: Vec<String> = recut.push(&long);
    assert_eq!(pieces.concat(), long);
}

proptest! {
    /// Re-cutting loses and reorders nothing.
    #[test]
    fn recut_keeps_the_text(text in "[a<>\\[{\n é€😀]{0,60}", cuts in prop::collection::vec(0usize..240, 0..8)) {
        let mut recut = Recut::default();
        let bounds = cut_points(&text, &cuts);
        let mut out = String::new();
        for pair in bounds.windows(2) {
            out.extend(recut.push(&text[pair[0]..pair[1]]));
        }
        out.extend(recut.flush());
        prop_assert_eq!(out, text);
    }

    /// The pieces depend on the text alone: any chunks give the pieces of the whole.
    #[test]
    fn recut_pieces_do_not_depend_on_the_chunks(text in "[ab<>\\[{\n é€😀]{0,80}", cuts in prop::collection::vec(0usize..240, 0..12)) {
        let pieces = |bounds: &[usize]| {
            let mut recut = Recut::default();
            let mut pieces = Vec::new();
            for pair in bounds.windows(2) {
                pieces.extend(recut.push(&text[pair[0]..pair[1]]));
            }
            pieces.extend(recut.flush());
            pieces
        };
        prop_assert_eq!(pieces(&cut_points(&text, &cuts)), pieces(&[0, text.len()]));
    }
}

/// An answer in the default format: `content`, then each call in its tags.
fn default_format(
    content: &str,
    calls: &[(bool, String)],
) -> (String, Vec<(String, serde_json::Value)>) {
    let mut text = content.to_owned();
    let mut expected = Vec::new();
    for (weather, city) in calls {
        let (name, arguments) = if *weather {
            ("weather", serde_json::json!({"city": city}))
        } else {
            ("time", serde_json::json!({}))
        };
        let call = serde_json::json!({"name": name, "arguments": arguments});
        text.push_str(&format!("\n<tool_call>\n{call}\n</tool_call>"));
        expected.push((name.to_owned(), arguments));
    }
    (text, expected)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// However an answer is cut into chunks (inside characters' neighbours, tags and JSON),
    /// the streamed parts and the whole answer give the content and the calls it was made
    /// of.
    #[test]
    fn answers_parse_to_what_they_were_made_of(
        content in "[a-zA-Z0-9é€😀 .,!?]{0,40}",
        calls in prop::collection::vec((any::<bool>(), "[a-zA-Zé ]{0,12}"), 0..4),
        cuts in prop::collection::vec(0usize..600, 0..24),
    ) {
        let parsers = Parsers::new(&ChatConfig::default(), "m", None);
        let tools = tool_request(serde_json::json!({}));
        let (text, expected) = default_format(&content, &calls);
        let whole = block_on(parsers.for_answer(Some(&tools)).parse_whole(text.clone()));
        let mut parser = parsers.for_answer(Some(&tools));
        let parts = stream_through(&mut parser, &text, &cuts);
        prop_assert_eq!(parser.called(), !expected.is_empty());
        let (streamed_content, _, streamed_calls) = assemble(&parts);
        prop_assert_eq!(streamed_content.trim(), content.trim());
        prop_assert_eq!(whole.content.trim(), content.trim());
        prop_assert_eq!(streamed_calls.len(), expected.len());
        prop_assert_eq!(whole.calls.len(), expected.len());
        for (i, (name, arguments)) in expected.iter().enumerate() {
            prop_assert_eq!(&streamed_calls[i].1, name);
            prop_assert_eq!(&args(&streamed_calls[i].2), arguments);
            prop_assert_eq!(&whole.calls[i].function.name, name);
            prop_assert_eq!(&args(&whole.calls[i].function.arguments), arguments);
        }
    }
}

/// Whether `text` is an answer the tools' constraint allows (over the built-in vocabulary,
/// whose first 256 ids are the bytes).
fn allowed(tools: &ToolRequest, text: &str) -> bool {
    let constraint = tools
        .constraint("qwen")
        .unwrap()
        .expect("the answer is constrained");
    let grammars = switchyard_grammar::Grammars::builtin().unwrap();
    let mut guide = grammars.guide(&constraint).unwrap();
    let bytes: Vec<u32> = text.bytes().map(u32::from).collect();
    guide.take(&bytes).is_ok() && guide.is_accepting()
}

#[test]
fn a_forced_call_is_constrained_to_the_tools_arguments() {
    let auto = tool_request(serde_json::json!({}));
    assert_eq!(auto.constraint("qwen").unwrap(), None);
    let required = tool_request(serde_json::json!({"tool_choice": "required"}));
    assert_eq!(required.choice, Choice::Required);
    assert!(allowed(
        &required,
        r#"[{"name":"weather","parameters":{"city":"Oslo"}},{"name":"time","parameters":{}}]"#
    ));
    assert!(!allowed(
        &required,
        r#"[{"name":"weather","parameters":{"city":3}}]"#
    ));
    assert!(!allowed(&required, r#"[{"name":"rain","parameters":{}}]"#));
    assert!(!allowed(&required, "[]"));
    assert!(!allowed(&required, "It is sunny."));
    let one =
        tool_request(serde_json::json!({"tool_choice": "required", "parallel_tool_calls": false}));
    assert!(allowed(&one, r#"[{"name":"time","parameters":{}}]"#));
    assert!(!allowed(
        &one,
        r#"[{"name":"time","parameters":{}},{"name":"time","parameters":{}}]"#
    ));
    let named = tool_request(
        serde_json::json!({"tool_choice": {"type": "function", "function": {"name": "weather"}}}),
    );
    assert_eq!(named.choice, Choice::Named("weather".into()));
    assert!(allowed(&named, r#"{"city":"Oslo"}"#));
    assert!(!allowed(&named, r#"{"city":false}"#));
    // A function without parameters takes an object.
    let time = tool_request(
        serde_json::json!({"tool_choice": {"type": "function", "function": {"name": "time"}}}),
    );
    assert!(allowed(&time, "{}") && !allowed(&time, "[]"));
}

#[test]
fn definitions_of_several_tools_meet_at_the_top_unless_they_differ() {
    let with_defs = |name: &str, unit: &str| {
        serde_json::json!({"type": "function", "function": {"name": name, "parameters": {
            "type": "object",
            "properties": {"t": {"$ref": "#/$defs/Temp"}},
            "required": ["t"],
            "$defs": {"Temp": {"type": "object", "properties": {unit: {"type": "number"}}, "required": [unit]}},
        }}})
    };
    let body = |b: &str| serde_json::json!({"tool_choice": "required", "tools": [with_defs("a", "c"), with_defs("b", b)]});
    let same = ToolRequest::of(&request(body("c"))).unwrap().unwrap();
    assert!(allowed(
        &same,
        r#"[{"name":"b","parameters":{"t":{"c":1.5}}}]"#
    ));
    assert!(!allowed(&same, r#"[{"name":"b","parameters":{"t":{}}}]"#));
    let differ = ToolRequest::of(&request(body("f"))).unwrap().unwrap();
    let error = differ.constraint("qwen").unwrap_err();
    assert!(error.body().contains("$defs/Temp"), "{}", error.body());
    // With `auto` and strict tools, the Hermes grammar resolves them the same way.
    let strict = |b: &str| {
        let mut body = body(b);
        body["tool_choice"] = serde_json::json!("auto");
        for tool in body["tools"].as_array_mut().unwrap() {
            tool["function"]["strict"] = serde_json::json!(true);
        }
        ToolRequest::of(&request(body)).unwrap().unwrap()
    };
    let call = |arguments: &str| {
        format!("<tool_call>\n{{\"name\": \"b\", \"arguments\": {arguments}}}\n</tool_call>")
    };
    assert!(allowed(&strict("c"), &call(r#"{"t": {"c": 1.5}}"#)));
    assert!(!allowed(&strict("c"), &call(r#"{"t": {}}"#)));
    let error = strict("f").constraint("qwen").unwrap_err();
    assert!(error.body().contains("$defs/Temp"), "{}", error.body());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// A forced answer, however cut, parses to the calls it holds: a named function's
    /// whole answer is its arguments; `required`'s is an array of calls.
    #[test]
    fn forced_answers_parse_to_their_calls_however_cut(
        cities in prop::collection::vec("[a-zA-Zé\\\" ]{0,10}", 1..4),
        cuts in prop::collection::vec(0usize..400, 0..24),
    ) {
        let parsers = Parsers::new(&ChatConfig::default(), "m", None);
        let named = tool_request(serde_json::json!({"tool_choice": {"type": "function", "function": {"name": "weather"}}}));
        let arguments = serde_json::json!({"city": cities[0]}).to_string();
        let whole = block_on(parsers.for_answer(Some(&named)).parse_whole(arguments.clone()));
        prop_assert_eq!(whole.calls.len(), 1);
        prop_assert_eq!(&whole.calls[0].function.name, "weather");
        prop_assert_eq!(&whole.calls[0].function.arguments, &arguments);
        prop_assert_eq!(&whole.content, "");
        let (content, _, calls) = assemble(&streamed(&parsers, &named, &arguments, &cuts));
        prop_assert_eq!(content, "");
        prop_assert_eq!(calls.len(), 1);
        prop_assert_eq!(&calls[0].1, "weather");
        prop_assert_eq!(&calls[0].2, &arguments);

        let required = tool_request(serde_json::json!({"tool_choice": "required"}));
        let expected: Vec<serde_json::Value> = cities.iter().map(|c| serde_json::json!({"city": c})).collect();
        let text = serde_json::Value::Array(
            expected.iter().map(|a| serde_json::json!({"name": "weather", "parameters": a})).collect(),
        ).to_string();
        let whole = block_on(parsers.for_answer(Some(&required)).parse_whole(text.clone()));
        let got: Vec<serde_json::Value> = whole.calls.iter().map(|c| args(&c.function.arguments)).collect();
        prop_assert_eq!(&got, &expected, "{}", text);
        prop_assert!(whole.calls.iter().all(|c| c.function.name == "weather"));
        prop_assert_eq!(whole.content.trim(), "");
        let (content, _, calls) = assemble(&streamed(&parsers, &required, &text, &cuts));
        let got: Vec<serde_json::Value> = calls.iter().map(|c| args(&c.2)).collect();
        prop_assert_eq!(&got, &expected, "{}", text);
        prop_assert_eq!(content.trim(), "");
    }
}

#[test]
fn strict_functions_with_auto_allow_text_or_valid_calls_in_the_hermes_format() {
    let strict = |parallel: bool| {
        ToolRequest::of(&request(serde_json::json!({
            "parallel_tool_calls": parallel,
            "tools": [
                {"type": "function", "function": {"name": "weather", "strict": true, "parameters": {
                    "type": "object", "properties": {"city": {"type": "string"}},
                    "required": ["city"], "additionalProperties": false}}},
                {"type": "function", "function": {"name": "time"}},
            ],
        })))
        .unwrap()
        .unwrap()
    };
    let tools = strict(true);
    let call = |name: &str, arguments: &str| {
        format!("<tool_call>\n{{\"name\": \"{name}\", \"arguments\": {arguments}}}\n</tool_call>")
    };
    let weather = call("weather", r#"{"city": "Oslo"}"#);
    let time = call("time", r#"{"zone": 2}"#);
    for text in [
        String::new(),
        "It is sunny.".to_owned(),
        "if a < b then <b>bold</b>".to_owned(),
        format!("Checking.{weather}"),
        format!("{weather}\n{time}"),
    ] {
        assert!(allowed(&tools, &text), "{text:?}");
    }
    for text in [
        call("weather", r#"{"city": 3}"#),
        call("weather", r#"{"city": "Oslo", "days": 2}"#),
        call("rain", "{}"),
        format!("{weather} and then some text"),
        format!("{weather}<tool_call>\n"),
    ] {
        assert!(!allowed(&tools, &text), "{text:?}");
    }
    assert!(!allowed(&strict(false), &format!("{weather}\n{time}")));
    // What the grammar allows, the model's parser reads back as the calls.
    let parsers = Parsers::new(&ChatConfig::default(), "m", None);
    let answer = block_on(
        parsers
            .for_answer(Some(&tools))
            .parse_whole(format!("Checking.{weather}\n{time}")),
    );
    assert_eq!(answer.content.trim(), "Checking.");
    let names: Vec<&str> = answer
        .calls
        .iter()
        .map(|c| c.function.name.as_str())
        .collect();
    assert_eq!(names, ["weather", "time"]);
    assert_eq!(
        args(&answer.calls[0].function.arguments),
        serde_json::json!({"city": "Oslo"})
    );
}

#[test]
fn zz_debug_grammar() {
    let grammars = switchyard_grammar::Grammars::builtin().unwrap();
    let check = |g: &str, text: &str| {
        let mut guide = grammars
            .guide(&switchyard_core::protocol::Constraint::Grammar(g.into()))
            .unwrap();
        let bytes: Vec<u32> = text.bytes().map(u32::from).collect();
        let ok = guide.take(&bytes).is_ok();
        eprintln!(
            "DEBUG {g:?} on {text:?}: took {ok}, accepting {}",
            guide.is_accepting()
        );
    };
    let open = r#"OPEN: ~/(?s:.*)<tool_call>(?s:.*)/ "<tool_call>\n""#;
    check(&format!("start: OPEN \"x\"\n{open}"), "ab<tool_call>\nx");
    check(&format!("start: OPEN \"x\"\n{open}"), "<tool_call>\nx");
    check(
        "start: OPEN \"x\"\nOPEN: /[a-z]*/ \"<tool_call>\\n\"",
        "ab<tool_call>\nx",
    );
    check(
        "start: OPEN \"x\"\nOPEN: /[a-z]*<tool_call>\\n/",
        "ab<tool_call>\nx",
    );
    check(
        "start: OPEN c\nc: %json {\"type\":\"object\"}\nOPEN: /[a-z]*<tool_call>\\n/",
        "ab<tool_call>\n{}",
    );
    check(
        "start: TEXT?\nTEXT: /(?s:.+)/ & ~/(?s:.*)<tool_call>(?s:.*)/",
        "ab<tool_call>\n{}",
    );
    check(
        "start: TEXT?\nTEXT: /(?s:.+)/ & ~/(?s:.*)<tool_call>(?s:.*)/",
        "ab<tool",
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// A reasoning model's answer, however it is cut into chunks: the streamed parts and
    /// the whole answer give the reasoning and the content it was made of (DeepSeek-R1's
    /// and Qwen 3's `<think>` format; gpt-oss's Harmony has its own property tests), with
    /// the opening tag in the answer or already in the prompt.
    #[test]
    fn reasoning_parses_to_what_it_was_made_of(
        parser in prop::sample::select(vec!["deepseek_r1", "qwen3"]),
        reasoning in "[a-zA-Z0-9é€😀 .,!?]{1,40}",
        content in "[a-zA-Z0-9é€😀 .,!?]{0,40}",
        opened_in_prompt in any::<bool>(),
        cuts in prop::collection::vec(0usize..200, 0..16),
    ) {
        let config = ChatConfig {
            reasoning_parser: Some(parser.to_owned()),
            ..ChatConfig::default()
        };
        let parsers = Parsers::new(&config, "m", None);
        let open = if opened_in_prompt { "" } else { "<think>" };
        let text = format!("{open}{reasoning}</think>{content}");
        let fresh = || {
            let mut p = parsers.for_answer(None);
            if opened_in_prompt {
                p.reasoning_started();
            }
            p
        };
        let whole = block_on(fresh().parse_whole(text.clone()));
        let parts = stream_through(&mut fresh(), &text, &cuts);
        let (streamed_content, streamed_reasoning, _) = assemble(&parts);
        prop_assert_eq!(streamed_reasoning.trim(), reasoning.trim());
        prop_assert_eq!(streamed_content.trim(), content.trim());
        prop_assert_eq!(whole.reasoning.as_deref().unwrap_or("").trim(), reasoning.trim());
        prop_assert_eq!(whole.content.trim(), content.trim());
    }
}
