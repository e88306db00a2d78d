//! GBNF rules against naive models: a set-of-positions matcher over the rules, the `regex`
//! crate for regular expressions, and a small JSON Schema validator for schemas.

use std::collections::BTreeSet;

use proptest::prelude::*;
use serde_json::{Value, json};

use super::*;

/// The positions where `expr` can end when started at any of `from`.
fn ends(rules: &Rules, expr: &Expr, s: &[char], from: &BTreeSet<usize>) -> BTreeSet<usize> {
    if from.is_empty() {
        return BTreeSet::new();
    }
    match expr {
        Expr::Text(text) => {
            let text: Vec<char> = text.chars().collect();
            from.iter()
                .filter(|&&i| s[i..].starts_with(&text))
                .map(|&i| i + text.len())
                .collect()
        }
        Expr::Class(ranges) => from
            .iter()
            .filter(|&&i| i < s.len() && ranges.iter().any(|&(lo, hi)| (lo..=hi).contains(&s[i])))
            .map(|&i| i + 1)
            .collect(),
        Expr::Seq(items) => items
            .iter()
            .fold(from.clone(), |at, item| ends(rules, item, s, &at)),
        Expr::Alt(items) => items
            .iter()
            .flat_map(|item| ends(rules, item, s, from))
            .collect(),
        Expr::Repeat { expr, min, max } => {
            // Past `min`, a repetition that consumes nothing adds nothing: so at most
            // `min + len + 1` rounds.
            let rounds = max.unwrap_or(u32::MAX).min(min + s.len() as u32 + 1);
            let mut out = if *min == 0 {
                from.clone()
            } else {
                BTreeSet::new()
            };
            let mut at = from.clone();
            for round in 1..=rounds {
                at = ends(rules, expr, s, &at);
                if at.is_empty() {
                    break;
                }
                if round >= *min {
                    out.extend(at.iter().copied());
                }
            }
            out
        }
        Expr::Rule(name) => ends(rules, rules.get(name).expect("a defined rule"), s, from),
    }
}

fn matches(rules: &Rules, text: &str) -> bool {
    let s: Vec<char> = text.chars().collect();
    let root = rules.get("root").expect("a root rule");
    ends(rules, root, &s, &BTreeSet::from([0])).contains(&s.len())
}

fn regex_rules(pattern: &str) -> Rules {
    rules(&Constraint::Regex(pattern.into())).expect("translates")
}

fn schema_rules(schema: &Value) -> Rules {
    rules(&Constraint::JsonSchema(schema.to_string())).expect("translates")
}

/// Regular expressions over a small alphabet, with quotes and backslashes in it.
fn pattern() -> impl Strategy<Value = String> {
    let atom = prop_oneof![
        prop::sample::select(vec!['a', 'b', '"', '\\', '-', 'é', '\n'])
            .prop_map(|c| regex_syntax::escape(&c.to_string())),
        Just("[a-c]".to_owned()),
        Just("[^a\\\\]".to_owned()),
        Just(".".to_owned()),
        Just("\\d".to_owned()),
        Just("(?i:A)".to_owned()),
    ];
    atom.prop_recursive(4, 24, 3, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 2..4).prop_map(|parts| parts.concat()),
            prop::collection::vec(inner.clone(), 2..4)
                .prop_map(|parts| format!("(?:{})", parts.join("|"))),
            (
                inner.clone(),
                prop::sample::select(vec!["*", "+", "?", "{2}", "{0,2}", "{1,}"])
            )
                .prop_map(|(p, op)| format!("(?:{p}){op}")),
        ]
    })
}

fn text() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop::sample::select(vec!['a', 'b', 'c', 'A', '"', '\\', '-', 'é', '\n', '7']),
        0..7,
    )
    .prop_map(|chars| chars.into_iter().collect())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// A pattern's rules match a text exactly when the pattern matches all of it.
    #[test]
    fn a_regex_matches_what_the_regex_crate_matches_whole(pattern in pattern(), texts in prop::collection::vec(text(), 8)) {
        let rules = regex_rules(&pattern);
        let whole = ::regex::Regex::new(&format!("^(?:{pattern})$")).expect("compiles");
        for text in texts {
            prop_assert_eq!(matches(&rules, &text), whole.is_match(&text), "{:?} on {:?}\n{}", pattern, text, rules.print());
        }
    }
}

#[test]
fn anchors_at_the_ends_say_nothing_and_others_are_refused() {
    let rules = regex_rules("^(ab|c)$");
    assert!(matches(&rules, "ab") && matches(&rules, "c") && !matches(&rules, "abc"));
    for pattern in ["a^b", "a\\b", "(?m)^a", "a$b"] {
        let error = super::regex::regex(pattern).unwrap_err();
        assert!(error.0.contains("assertion"), "{pattern}: {error}");
    }
}

/// A small JSON Schema validator for the keywords the generator below uses.
fn valid(root: &Value, schema: &Value, value: &Value) -> bool {
    let Some(object) = schema.as_object() else {
        return schema == &Value::Bool(true);
    };
    if let Some(reference) = object.get("$ref").and_then(Value::as_str) {
        return valid(
            root,
            root.pointer(&reference[1..]).expect("resolves"),
            value,
        );
    }
    if let Some(c) = object.get("const") {
        return c == value;
    }
    if let Some(values) = object.get("enum").and_then(Value::as_array) {
        return values.contains(value);
    }
    if let Some(list) = object.get("anyOf").and_then(Value::as_array) {
        return list.iter().any(|s| valid(root, s, value));
    }
    let types: Vec<&str> = match object.get("type") {
        Some(Value::String(t)) => vec![t],
        Some(Value::Array(list)) => list.iter().filter_map(Value::as_str).collect(),
        _ => vec!["object", "array", "string", "number", "boolean", "null"],
    };
    let of_type = types.iter().any(|t| match *t {
        "object" => value.is_object(),
        "array" => value.is_array(),
        "string" => value.is_string(),
        "integer" => value.is_i64() || value.is_u64(),
        "number" => value.is_number(),
        "boolean" => value.is_boolean(),
        "null" => value.is_null(),
        _ => false,
    });
    let count = |k: &str| object.get(k).and_then(Value::as_u64);
    of_type
        && match value {
            Value::Object(members) => {
                let properties = object.get("properties").and_then(Value::as_object);
                let required = object
                    .get("required")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                let closed = object.get("additionalProperties") == Some(&Value::Bool(false));
                required
                    .iter()
                    .all(|r| members.contains_key(r.as_str().unwrap_or_default()))
                    && members
                        .iter()
                        .all(|(k, v)| match properties.and_then(|p| p.get(k)) {
                            Some(s) => valid(root, s, v),
                            None => !closed,
                        })
            }
            Value::Array(items) => {
                let n = items.len() as u64;
                count("minItems").is_none_or(|m| n >= m)
                    && count("maxItems").is_none_or(|m| n <= m)
                    && object
                        .get("items")
                        .is_none_or(|s| items.iter().all(|i| valid(root, s, i)))
            }
            Value::String(s) => {
                let n = s.chars().count() as u64;
                count("minLength").is_none_or(|m| n >= m)
                    && count("maxLength").is_none_or(|m| n <= m)
            }
            Value::Number(n) => {
                object.get("minimum").is_none() || n.as_f64().is_some_and(|x| x >= 0.0)
            }
            _ => true,
        }
}

/// Schemas of the kinds read: typed leaves, enums, consts, objects (closed, with required
/// and optional properties), maps, arrays with bounds, and `anyOf`.
fn schema() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(json!({"type": "string"})),
        (0u32..3, 0u32..3).prop_map(
            |(min, extra)| json!({"type": "string", "minLength": min, "maxLength": min + extra})
        ),
        Just(json!({"type": "integer"})),
        Just(json!({"type": "integer", "minimum": 0})),
        Just(json!({"type": "number", "title": "x"})),
        Just(json!({"type": "boolean"})),
        Just(json!({"type": ["string", "null"]})),
        Just(json!({"enum": ["red", 1, null, {"a": [true]}]})),
        Just(json!({"const": "fixed \"one\""})),
        Just(json!({})),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            (prop::collection::vec((inner.clone(), any::<bool>()), 0..4)).prop_map(|members| {
                let mut properties = serde_json::Map::new();
                let mut required = Vec::new();
                for (i, (schema, is_required)) in members.into_iter().enumerate() {
                    let name = ["a", "b c", "d\"", "e"][i].to_owned();
                    if is_required {
                        required.push(Value::String(name.clone()));
                    }
                    properties.insert(name, schema);
                }
                json!({"type": "object", "properties": properties, "required": required, "additionalProperties": false})
            }),
            inner.clone().prop_map(|value| json!({"type": "object", "additionalProperties": value})),
            (inner.clone(), 0u32..3, prop::option::of(0u32..3)).prop_map(|(items, min, extra)| {
                let mut schema = json!({"type": "array", "items": items, "minItems": min});
                if let Some(extra) = extra {
                    schema["maxItems"] = json!(min + extra);
                }
                schema
            }),
            prop::collection::vec(inner, 1..3).prop_map(|list| json!({"anyOf": list})),
        ]
    })
}

fn pick(choices: &mut impl Iterator<Item = u32>, n: u32) -> u32 {
    choices.next().unwrap_or(0) % n.max(1)
}

/// A value `schema` accepts, its members in the schema's order, chosen by `choices`.
fn instance(
    root: &Value,
    schema: &Value,
    choices: &mut impl Iterator<Item = u32>,
    depth: u32,
) -> Value {
    let object = schema.as_object().cloned().unwrap_or_default();
    if let Some(reference) = object.get("$ref").and_then(Value::as_str) {
        let target = root.pointer(&reference[1..]).expect("resolves").clone();
        return instance(root, &target, choices, depth + 1);
    }
    if let Some(c) = object.get("const") {
        return c.clone();
    }
    if let Some(values) = object.get("enum").and_then(Value::as_array) {
        return values[pick(choices, values.len() as u32) as usize].clone();
    }
    if let Some(list) = object.get("anyOf").and_then(Value::as_array) {
        let branch = list[pick(choices, list.len() as u32) as usize].clone();
        return instance(root, &branch, choices, depth + 1);
    }
    let kind = match object.get("type") {
        Some(Value::String(t)) => t.clone(),
        Some(Value::Array(list)) => list[pick(choices, list.len() as u32) as usize]
            .as_str()
            .unwrap_or("null")
            .to_owned(),
        _ => {
            ["string", "integer", "boolean", "null", "object"][pick(choices, 5) as usize].to_owned()
        }
    };
    let count = |k: &str| object.get(k).and_then(Value::as_u64).map(|n| n as u32);
    match kind.as_str() {
        "object" => {
            let mut out = serde_json::Map::new();
            let required = object
                .get("required")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            if let Some(properties) = object.get("properties").and_then(Value::as_object) {
                for (name, sub) in properties {
                    if required.contains(&Value::String(name.clone()))
                        || (depth < 3 && pick(choices, 2) == 0)
                    {
                        out.insert(name.clone(), instance(root, sub, choices, depth + 1));
                    }
                }
            } else if let Some(additional) =
                object.get("additionalProperties").filter(|_| depth < 3)
            {
                for key in ["k", "k2"].iter().take(pick(choices, 3) as usize) {
                    out.insert(
                        (*key).to_owned(),
                        instance(root, additional, choices, depth + 1),
                    );
                }
            }
            Value::Object(out)
        }
        "array" => {
            let min = count("minItems").unwrap_or(0);
            let most = count("maxItems").unwrap_or(min + 2).min(min + 2);
            let n = if depth < 3 {
                min + pick(choices, most - min + 1)
            } else {
                min
            };
            let items = object.get("items").cloned().unwrap_or(json!({}));
            Value::Array(
                (0..n)
                    .map(|_| instance(root, &items, choices, depth + 1))
                    .collect(),
            )
        }
        "string" => {
            let min = count("minLength").unwrap_or(0);
            let most = count("maxLength").unwrap_or(min + 4).min(min + 4);
            let n = min + pick(choices, most - min + 1);
            let alphabet = ['a', '"', '\\', '\n', 'é', '/', '\u{1}', '😀'];
            Value::String(
                (0..n)
                    .map(|_| alphabet[pick(choices, 8) as usize])
                    .collect(),
            )
        }
        "integer" if object.contains_key("minimum") => json!(pick(choices, 1000)),
        "integer" => json!(i64::from(pick(choices, 2000)) - 1000),
        "number" => json!(
            [
                json!(f64::from(pick(choices, 100)) / 8.0 - 4.0),
                json!(-3),
                json!(1e-7)
            ][pick(choices, 3) as usize]
        ),
        "boolean" => json!(pick(choices, 2) == 1),
        _ => Value::Null,
    }
}

fn any_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        (-5i64..5).prop_map(|n| json!(n)),
        Just(json!(2.5)),
        text().prop_map(Value::String),
        Just(json!("red")),
    ];
    leaf.prop_recursive(3, 12, 3, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
            prop::collection::vec(
                (
                    prop::sample::select(vec!["a", "b c", "d\"", "e", "k"]),
                    inner
                ),
                0..3
            )
            .prop_map(|members| Value::Object(
                members
                    .into_iter()
                    .map(|(k, v)| (k.to_owned(), v))
                    .collect()
            )),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// The rules accept every value the schema accepts written in its order (compact),
    /// and whatever they accept the schema accepts.
    #[test]
    fn a_schema_admits_its_values_and_only_them(
        schema in schema(),
        choices in prop::collection::vec(any::<u32>(), 64),
        others in prop::collection::vec(any_value(), 4),
    ) {
        let rules = schema_rules(&schema);
        let mut draws = choices.iter().copied().cycle();
        for _ in 0..4 {
            let value = instance(&schema, &schema, &mut draws, 0);
            prop_assert!(valid(&schema, &schema, &value), "the generator: {} for {}", value, schema);
            prop_assert!(matches(&rules, &value.to_string()), "{} rejected under {}\n{}", value, schema, rules.print());
        }
        for value in others {
            if matches(&rules, &value.to_string()) {
                prop_assert!(valid(&schema, &schema, &value), "{} accepted under {}\n{}", value, schema, rules.print());
            }
        }
    }
}

#[test]
fn recursive_references_and_patterns_are_read() {
    let tree = json!({
        "$defs": {"tree": {"type": "object", "properties": {
            "v": {"type": "integer"},
            "kids": {"type": "array", "items": {"$ref": "#/$defs/tree"}, "maxItems": 2}
        }, "required": ["v"], "additionalProperties": false}},
        "$ref": "#/$defs/tree"
    });
    let rules = schema_rules(&tree);
    assert!(
        matches(&rules, r#"{"v":1,"kids":[{"v":2},{"v":3,"kids":[]}]}"#),
        "{}",
        rules.print()
    );
    assert!(
        matches(&rules, "{\"v\": -4,\n  \"kids\": [ ]}"),
        "whitespace between tokens"
    );
    assert!(
        !matches(&rules, r#"{"v":1,"kids":[{"v":2},{"v":3},{"v":4}]}"#),
        "three kids"
    );
    assert!(!matches(&rules, r#"{"kids":[]}"#), "no v");

    // A pattern in a string: the JSON text escapes the quote; the class loses the backslash.
    let code = json!({"type": "string", "pattern": r#"^a"[b-d\\]$"#});
    let rules = schema_rules(&code);
    assert!(matches(&rules, r#""a\"c""#), "{}", rules.print());
    assert!(!matches(&rules, r#""a"c""#) && !matches(&rules, r#""a\"\\""#));
}

#[test]
fn what_is_not_read_is_refused_by_name() {
    for (schema, named) in [
        (json!({"type": "string", "format": "date"}), "`format`"),
        (json!({"type": "integer", "minimum": 5}), "`minimum` 5"),
        (
            json!({"allOf": [{"type": "string"}, {"minLength": 2}]}),
            "`allOf`",
        ),
        (
            json!({"type": "array", "uniqueItems": true}),
            "`uniqueItems`",
        ),
        (json!({"$ref": "#/$defs/missing"}), "`#/$defs/missing`"),
        (
            json!({"type": "object", "properties": {"a": {"type": "wat"}}}),
            "\"wat\"",
        ),
        (json!({"const": 1, "type": "string"}), "excludes"),
        (json!(false), "`false`"),
    ] {
        let error = rules(&Constraint::JsonSchema(schema.to_string())).unwrap_err();
        assert!(error.0.contains(named), "{schema}: {error}");
    }
    let lark = rules(&Constraint::Grammar("start: \"a\"".into())).unwrap_err();
    assert!(lark.0.contains("Lark"), "{lark}");
}

#[test]
fn printed_rules_quote_escape_and_group() {
    let mut rules = Rules::default();
    rules.define(
        "root",
        Expr::Seq(vec![
            Expr::text("a\"\\\n\u{e9}\u{1F600}"),
            Expr::repeat(
                Expr::Alt(vec![
                    Expr::text("x"),
                    Expr::Class(vec![('-', '-'), (']', '^'), ('\0', '\u{1F}')]),
                ]),
                2,
                Some(5),
            ),
            Expr::Alt(vec![Expr::text("y"), Expr::empty()]),
            Expr::repeat(Expr::rule("root"), 0, None),
        ]),
    );
    assert_eq!(
        rules.print(),
        r#"root ::= "a\"\\\x0A\u00E9\U0001F600" ("x" | [\x2D\x5D-\x5E\x00-\x1F]){2,5} ("y" | "") root*"#.to_owned() + "\n"
    );
    let choice = gbnf(&Constraint::Choice(vec!["yes".into(), "no \"way\"".into()])).unwrap();
    assert_eq!(choice, "root ::= \"yes\" | \"no \\\"way\\\"\"\n");
}
