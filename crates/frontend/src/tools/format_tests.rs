//! Streamed equals whole, for each call format the parsers read: an answer written in the
//! format, cut into chunks anywhere (inside tags, JSON and characters' neighbours), parses
//! to the content and calls it was made of, as the whole answer does.

use proptest::prelude::*;
use serde_json::{Value, json};

use super::output::Part;
use super::*;

/// A call: `Some(city)` for `weather`, `None` for `time`.
type Call = Option<String>;

fn name_and_arguments(call: &Call) -> (&'static str, Value) {
    match call {
        Some(city) => ("weather", json!({"city": city})),
        None => ("time", json!({})),
    }
}

/// The answer in `format`: the content, then the calls; and the content the parser gives
/// back (formats that start with a call take none).
fn render(format: &str, content: &str, calls: &[Call]) -> (String, String) {
    let objects = |key: &str| -> Vec<Value> {
        calls
            .iter()
            .map(|c| {
                let (name, arguments) = name_and_arguments(c);
                json!({"name": name, key: arguments})
            })
            .collect()
    };
    if calls.is_empty() {
        return (content.to_owned(), content.to_owned());
    }
    let text = match format {
        "llama" => {
            let calls: Vec<String> = objects("parameters").iter().map(Value::to_string).collect();
            format!("{content}<|python_tag|>{}", calls.join(";"))
        }
        "mistral" => format!("{content}[TOOL_CALLS] [{}]", spaced(&objects("arguments"))),
        "deepseek" => {
            let mut text = format!("{content}<｜tool▁calls▁begin｜>");
            for call in calls {
                let (name, arguments) = name_and_arguments(call);
                text.push_str(&format!(
                    "<｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n{arguments}\n```<｜tool▁call▁end｜>"
                ));
            }
            text + "<｜tool▁calls▁end｜>"
        }
        "pythonic" => {
            let calls: Vec<String> = calls
                .iter()
                .map(|c| match c {
                    Some(city) => format!("weather(city=\"{city}\")"),
                    None => "time()".to_owned(),
                })
                .collect();
            return (format!("[{}]", calls.join(", ")), String::new());
        }
        "json" => {
            return (
                format!("[{}]", spaced(&objects("arguments"))),
                String::new(),
            );
        }
        _ => unreachable!("a format of this test"),
    };
    (text, content.to_owned())
}

/// JSON objects as models write them (Python's `json.dumps`): a space after each `,` and
/// `:` between items. (tool-parser 1.10's Mistral parser loses the calls after the first
/// when they are joined by a bare `,`: `[{...},{...}]`.)
fn spaced(objects: &[Value]) -> String {
    let one = |v: &Value| {
        let mut out = Vec::new();
        let formatter = serde_json::ser::PrettyFormatter::with_indent(b"");
        let mut serializer = serde_json::Serializer::with_formatter(&mut out, formatter);
        serde::Serialize::serialize(v, &mut serializer).unwrap();
        String::from_utf8(out)
            .unwrap()
            .replace('\n', " ")
            .replace("{ ", "{")
            .replace(" }", "}")
    };
    objects.iter().map(one).collect::<Vec<_>>().join(", ")
}

/// Where `cuts` (any numbers) cut `text`: at character boundaries, its ends included, in
/// order.
pub(super) fn cut_at(text: &str, cuts: &[usize]) -> Vec<usize> {
    let mut bounds: Vec<usize> = cuts
        .iter()
        .map(|&c| c % (text.len() + 1))
        .filter(|&c| text.is_char_boundary(c))
        .chain([0, text.len()])
        .collect();
    bounds.sort_unstable();
    bounds.dedup();
    bounds
}

fn parsers(format: &str) -> Parsers {
    let config = ChatConfig {
        tool_call_parser: Some(format.to_owned()),
        ..ChatConfig::default()
    };
    Parsers::new(&config, "m", None)
}

fn tools() -> ToolRequest {
    let body = json!({
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [
            {"type": "function", "function": {"name": "weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
            {"type": "function", "function": {"name": "time"}},
        ],
    });
    ToolRequest::of(&serde_json::from_value(body).unwrap())
        .unwrap()
        .unwrap()
}

/// The content and the calls (name, arguments) `parts` add up to.
fn assembled(parts: Vec<Part>) -> (String, Vec<(String, Value)>) {
    let answer = output::aggregate(parts);
    let calls = answer
        .calls
        .iter()
        .map(|c| {
            let arguments = serde_json::from_str(&c.function.arguments).unwrap_or(Value::Null);
            (c.function.name.clone(), arguments)
        })
        .collect();
    (answer.content.trim().to_owned(), calls)
}

fn parse(format: &str, text: &str, bounds: &[usize]) -> (String, Vec<(String, Value)>) {
    let tools = tools();
    let mut parser = parsers(format).for_answer(Some(&tools));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut parts = Vec::new();
        for pair in bounds.windows(2) {
            parts.extend(parser.push(&text[pair[0]..pair[1]]).await);
        }
        parts.extend(parser.finish().await);
        assembled(parts)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn each_format_streams_exactly_as_it_parses_whole(
        format in prop::sample::select(vec!["llama", "mistral", "deepseek", "pythonic", "json"]),
        content in "[a-zA-Z0-9é€😀 .,!?]{0,30}",
        calls in prop::collection::vec(prop::option::of("[a-zA-Zé ]{1,12}"), 0..4),
        cuts in prop::collection::vec(0usize..600, 0..24),
    ) {
        // tool-parser 1.10's pythonic parser finds no call when an argument holds a
        // character beyond ASCII (`[weather(city="é")]`); its arguments are drawn in ASCII
        // until that is fixed upstream.
        let calls: Vec<Call> = if format == "pythonic" {
            calls.into_iter().map(|c| c.map(|city| city.replace('é', "e"))).collect()
        } else {
            calls
        };
        let (text, content) = render(format, &content, &calls);
        let expected: Vec<(String, Value)> = calls
            .iter()
            .map(|c| {
                let (name, arguments) = name_and_arguments(c);
                (name.to_owned(), arguments)
            })
            .collect();
        let whole = parse(format, &text, &[0, text.len()]);
        let bounds = cut_at(&text, &cuts);
        let streamed = parse(format, &text, &bounds);
        prop_assert_eq!(&whole, &streamed, "{} {:?} cut at {:?}", format, text, bounds);
        prop_assert_eq!(&whole.0, content.trim(), "{} {:?}", format, text);
        prop_assert_eq!(&whole.1, &expected, "{} {:?}", format, text);
    }
}
