//! A JSON Schema (or JSON mode) as GBNF rules: the JSON text of a value the schema accepts.
//!
//! Read: `type` (one or a list), `enum`, `const`, `anyOf`, `oneOf` (as `anyOf`), a single
//! `allOf`, local `$ref`s (`#`, `#/$defs/…`, `#/definitions/…`, recursive ones included);
//! objects' `properties`, `required` and `additionalProperties`; arrays' `items`,
//! `minItems`, `maxItems`; strings' `minLength`, `maxLength`, `pattern`; a `minimum` of 0.
//! Annotations (`title`, `description`, `default`, …) say nothing to generate by. Any
//! other keyword is refused by name.

use std::collections::HashMap;

use serde_json::{Map, Value};

use super::regex::regex;
use super::{Expr, GbnfError, Rules};

/// Keywords that describe and do not constrain.
const ANNOTATIONS: [&str; 11] = [
    "title",
    "description",
    "default",
    "examples",
    "$schema",
    "$id",
    "$comment",
    "deprecated",
    "readOnly",
    "writeOnly",
    "$defs",
];

/// Keywords read here, beyond the annotations.
const READ: [&str; 19] = [
    "definitions",
    "type",
    "enum",
    "const",
    "anyOf",
    "oneOf",
    "allOf",
    "$ref",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "minItems",
    "maxItems",
    "uniqueItems",
    "minLength",
    "maxLength",
    "pattern",
    "minimum",
];

/// The most whitespace between two tokens: a space, or a new line and its indentation.
const INDENT: u32 = 16;

/// JSON mode: any JSON object.
pub fn json_object(rules: &mut Rules) {
    rules.define("root", Expr::rule("object"));
    define_any(rules);
}

/// The rules for `schema` (its text), its start rule `root`.
pub fn json_schema(rules: &mut Rules, schema: &str) -> Result<(), GbnfError> {
    let root: Value =
        serde_json::from_str(schema).map_err(|e| GbnfError(format!("the schema: {e}")))?;
    rules.define("root", Expr::empty());
    let mut converter = Converter {
        root: &root,
        rules,
        refs: HashMap::new(),
        objects: 0,
    };
    let expr = converter.schema(&root, "#")?;
    converter.rules.define("root", expr);
    Ok(())
}

struct Converter<'a> {
    root: &'a Value,
    rules: &'a mut Rules,
    /// Each `$ref` followed so far, and its rule.
    refs: HashMap<String, String>,
    /// Objects given rules of their own so far (their rules' names count them).
    objects: usize,
}

impl Converter<'_> {
    fn schema(&mut self, schema: &Value, at: &str) -> Result<Expr, GbnfError> {
        let object = match schema {
            Value::Bool(true) => return Ok(self.any("value")),
            Value::Bool(false) => return Err(refuse(at, "is `false`: no value is valid")),
            Value::Object(object) => object,
            _ => return Err(refuse(at, "is neither an object nor a boolean")),
        };
        if let Some(key) = object
            .keys()
            .find(|k| !ANNOTATIONS.contains(&k.as_str()) && !READ.contains(&k.as_str()))
        {
            return Err(refuse(at, &format!("has `{key}`, which is not read here")));
        }
        let constraining = |allowed: &[&str]| {
            object
                .keys()
                .filter(|k| {
                    !ANNOTATIONS.contains(&k.as_str())
                        && k.as_str() != "definitions"
                        && !allowed.contains(&k.as_str())
                })
                .cloned()
                .collect::<Vec<_>>()
        };
        let alone = |keyword: &str, allowed: &[&str]| -> Result<(), GbnfError> {
            let others = constraining(allowed);
            match others.first() {
                Some(other) => Err(refuse(
                    at,
                    &format!("has `{other}` beside `{keyword}`, which are not read together here"),
                )),
                None => Ok(()),
            }
        };
        if let Some(reference) = object.get("$ref") {
            alone("$ref", &["$ref"])?;
            return self.reference(reference, at);
        }
        if let Some(value) = object.get("const") {
            alone("const", &["const", "type"])?;
            check_type(object, value, at)?;
            return Ok(Expr::text(value.to_string()));
        }
        if let Some(values) = object.get("enum") {
            alone("enum", &["enum", "type"])?;
            let values = values
                .as_array()
                .filter(|v| !v.is_empty())
                .ok_or_else(|| refuse(at, "has an `enum` that is not a non-empty array"))?;
            for value in values {
                check_type(object, value, at)?;
            }
            return Ok(Expr::Alt(
                values.iter().map(|v| Expr::text(v.to_string())).collect(),
            ));
        }
        for keyword in ["anyOf", "oneOf", "allOf"] {
            if let Some(list) = object.get(keyword) {
                alone(keyword, &[keyword])?;
                let list = list.as_array().filter(|l| !l.is_empty()).ok_or_else(|| {
                    refuse(
                        at,
                        &format!("has a `{keyword}` that is not a non-empty array"),
                    )
                })?;
                if keyword == "allOf" && list.len() > 1 {
                    return Err(refuse(at, "has an `allOf` of more than one schema"));
                }
                return Ok(Expr::Alt(
                    list.iter()
                        .enumerate()
                        .map(|(i, s)| self.schema(s, &format!("{at}/{keyword}/{i}")))
                        .collect::<Result<_, _>>()?,
                ));
            }
        }
        let types: Vec<&str> = match object.get("type") {
            Some(Value::String(t)) => vec![t.as_str()],
            Some(Value::Array(list)) if !list.is_empty() => list
                .iter()
                .map(|t| {
                    t.as_str()
                        .ok_or_else(|| refuse(at, "has a `type` list of non-strings"))
                })
                .collect::<Result<_, _>>()?,
            Some(_) => return Err(refuse(at, "has a `type` that is neither a name nor a list")),
            None => inferred(object),
        };
        if types.is_empty() {
            return Ok(self.any("value"));
        }
        let alternatives = types
            .iter()
            .map(|t| self.typed(t, object, at))
            .collect::<Result<_, _>>()?;
        Ok(Expr::Alt(alternatives))
    }

    fn typed(
        &mut self,
        kind: &str,
        object: &Map<String, Value>,
        at: &str,
    ) -> Result<Expr, GbnfError> {
        let minimum = match object.get("minimum") {
            None => None,
            Some(m) if m.as_f64() == Some(0.0) => Some(0),
            Some(m) => {
                return Err(refuse(
                    at,
                    &format!("has `minimum` {m}: only 0 is read here"),
                ));
            }
        };
        Ok(match kind {
            "object" => self.object(object, at)?,
            "array" => self.array(object, at)?,
            "string" => self.string(object, at)?,
            "integer" if minimum.is_some() => self.any("natural"),
            "integer" => self.any("integer"),
            "number" if minimum.is_some() => self.any("unsigned"),
            "number" => self.any("number"),
            "boolean" => self.any("boolean"),
            "null" => self.any("null"),
            other => return Err(refuse(at, &format!("has an unknown `type` {other:?}"))),
        })
    }

    fn object(&mut self, object: &Map<String, Value>, at: &str) -> Result<Expr, GbnfError> {
        let empty = Map::new();
        let properties = match object.get("properties") {
            None => &empty,
            Some(Value::Object(p)) => p,
            Some(_) => return Err(refuse(at, "has `properties` that are not an object")),
        };
        let required: Vec<&str> = match object.get("required") {
            None => Vec::new(),
            Some(Value::Array(list)) => list
                .iter()
                .map(|r| {
                    r.as_str()
                        .ok_or_else(|| refuse(at, "has a `required` list of non-strings"))
                })
                .collect::<Result<_, _>>()?,
            Some(_) => return Err(refuse(at, "has `required` that is not a list")),
        };
        if let Some(missing) = required.iter().find(|r| !properties.contains_key(**r)) {
            return Err(refuse(
                at,
                &format!("requires `{missing}`, which its `properties` do not list"),
            ));
        }
        let ws = self.any("ws");
        if properties.is_empty() {
            // A map: any keys, each value as `additionalProperties` says.
            let value = match object.get("additionalProperties") {
                None | Some(Value::Bool(true)) => return Ok(self.any("object")),
                Some(Value::Bool(false)) => {
                    return Ok(delimited("{", Expr::empty(), "}", 0, Some(0)));
                }
                Some(schema) => self.schema(schema, &format!("{at}/additionalProperties"))?,
            };
            let member = member(self.any("string"), value);
            let member = self.named("map", member);
            return Ok(delimited("{", member, "}", 0, None));
        }
        let mut members = Vec::with_capacity(properties.len());
        for (name, schema) in properties {
            let value = self.schema(schema, &format!("{at}/properties/{name}"))?;
            members.push((
                required.contains(&name.as_str()),
                member(Expr::text(Value::String(name.clone()).to_string()), value),
            ));
        }
        self.objects += 1;
        let id = self.objects;
        // `head i`: members from the i-th on, none written yet; `tail i`: the same after
        // at least one (so each starts with a comma). Rules, so each is written once.
        let head = |i: usize| format!("object{id}-head{i}");
        let tail = |i: usize| format!("object{id}-tail{i}");
        let n = members.len();
        self.rules.define(&head(n), Expr::empty());
        self.rules.define(&tail(n), Expr::empty());
        for (i, (is_required, member)) in members.into_iter().enumerate().rev() {
            let after = Expr::Seq(vec![
                Expr::text(","),
                ws.clone(),
                member.clone(),
                Expr::rule(tail(i + 1)),
            ]);
            let first = Expr::Seq(vec![member, Expr::rule(tail(i + 1))]);
            if is_required {
                self.rules.define(&tail(i), after);
                self.rules.define(&head(i), first);
            } else {
                self.rules
                    .define(&tail(i), Expr::Alt(vec![after, Expr::rule(tail(i + 1))]));
                self.rules
                    .define(&head(i), Expr::Alt(vec![first, Expr::rule(head(i + 1))]));
            }
        }
        Ok(Expr::Seq(vec![
            Expr::text("{"),
            ws,
            Expr::rule(head(0)),
            Expr::text("}"),
        ]))
    }

    fn array(&mut self, object: &Map<String, Value>, at: &str) -> Result<Expr, GbnfError> {
        if object
            .get("uniqueItems")
            .is_some_and(|u| u != &Value::Bool(false))
        {
            return Err(refuse(at, "has `uniqueItems`, which is not read here"));
        }
        let min = count(object, "minItems", at)?.unwrap_or(0);
        let max = count(object, "maxItems", at)?;
        let ws = self.any("ws");
        let item = match object.get("items") {
            None | Some(Value::Bool(true)) => self.any("value"),
            Some(Value::Bool(false)) => return Ok(delimited("[", Expr::empty(), "]", 0, Some(0))),
            Some(schema) => {
                let item = self.schema(schema, &format!("{at}/items"))?;
                self.named("item", item)
            }
        };
        if max.is_some_and(|m| m < min) {
            return Err(refuse(at, "has `maxItems` below `minItems`"));
        }
        Ok(delimited("[", Expr::Seq(vec![item, ws]), "]", min, max))
    }

    fn string(&mut self, object: &Map<String, Value>, at: &str) -> Result<Expr, GbnfError> {
        let min = count(object, "minLength", at)?;
        let max = count(object, "maxLength", at)?;
        if let Some(pattern) = object.get("pattern") {
            if min.is_some() || max.is_some() {
                return Err(refuse(
                    at,
                    "has `pattern` beside a length, which are not read together here",
                ));
            }
            let pattern = pattern
                .as_str()
                .ok_or_else(|| refuse(at, "has a `pattern` that is not a string"))?;
            let inner = regex(pattern)
                .map_err(|e| refuse(at, &format!("has a `pattern` that cannot be read: {e}")))?;
            return Ok(Expr::Seq(vec![
                Expr::text("\""),
                json_text(inner)?,
                Expr::text("\""),
            ]));
        }
        if min.is_none() && max.is_none() {
            return Ok(self.any("string"));
        }
        let min = min.unwrap_or(0);
        if max.is_some_and(|m| m < min) {
            return Err(refuse(at, "has `maxLength` below `minLength`"));
        }
        self.any("string");
        Ok(Expr::Seq(vec![
            Expr::text("\""),
            Expr::repeat(Expr::rule("char"), min, max),
            Expr::text("\""),
        ]))
    }

    fn reference(&mut self, reference: &Value, at: &str) -> Result<Expr, GbnfError> {
        let reference = reference
            .as_str()
            .ok_or_else(|| refuse(at, "has a `$ref` that is not a string"))?;
        if let Some(name) = self.refs.get(reference) {
            return Ok(Expr::rule(name.clone()));
        }
        let target = reference
            .strip_prefix('#')
            .and_then(|pointer| self.root.pointer(pointer))
            .ok_or_else(|| {
                refuse(
                    at,
                    &format!("refers to `{reference}`, which is not in this schema"),
                )
            })?;
        let stem: String = reference
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .chars()
            .filter(char::is_ascii_alphanumeric)
            .collect();
        let name = format!("ref{}-{stem}", self.refs.len() + 1);
        self.refs.insert(reference.to_owned(), name.clone());
        self.rules.define(&name, Expr::empty());
        let expr = self.schema(target, reference)?;
        self.rules.define(&name, expr);
        Ok(Expr::rule(name))
    }

    /// `expr` as a rule of its own (so it is written once however often it is used),
    /// unless it is already one name or one literal.
    fn named(&mut self, kind: &str, expr: Expr) -> Expr {
        if matches!(expr, Expr::Rule(_) | Expr::Text(_)) {
            return expr;
        }
        let mut i = 1;
        while self.rules.contains(&format!("{kind}{i}")) {
            i += 1;
        }
        let name = format!("{kind}{i}");
        self.rules.define(&name, expr);
        Expr::rule(name)
    }

    /// One of the rules for any JSON value, defined on first use.
    fn any(&mut self, name: &str) -> Expr {
        define_any(self.rules);
        Expr::rule(name)
    }
}

/// The rules for any JSON value and its parts, unless already defined.
fn define_any(rules: &mut Rules) {
    if rules.contains("value") {
        return;
    }
    let ws = Expr::rule("ws");
    let digits = |min, max| Expr::repeat(Expr::Class(vec![('0', '9')]), min, Some(max));
    let seq = Expr::Seq;
    let text = Expr::text;
    let rule = Expr::rule;
    rules.define(
        "value",
        Expr::Alt(
            ["object", "array", "string", "number", "boolean", "null"]
                .map(rule)
                .to_vec(),
        ),
    );
    rules.define(
        "object",
        delimited("{", member(rule("string"), rule("value")), "}", 0, None),
    );
    rules.define(
        "array",
        delimited("[", seq(vec![rule("value"), ws.clone()]), "]", 0, None),
    );
    rules.define(
        "string",
        seq(vec![
            text("\""),
            Expr::repeat(rule("char"), 0, None),
            text("\""),
        ]),
    );
    // Any character but a quote, a backslash or a control character; or an escape.
    rules.define(
        "char",
        Expr::Alt(vec![
            Expr::Class(vec![(' ', '!'), ('#', '['), (']', '\u{10FFFF}')]),
            seq(vec![
                text("\\"),
                Expr::Alt(vec![
                    Expr::Class(vec![
                        ('"', '"'),
                        ('\\', '\\'),
                        ('/', '/'),
                        ('b', 'b'),
                        ('f', 'f'),
                        ('n', 'n'),
                        ('r', 'r'),
                        ('t', 't'),
                    ]),
                    seq(vec![
                        text("u"),
                        Expr::repeat(
                            Expr::Class(vec![('0', '9'), ('a', 'f'), ('A', 'F')]),
                            4,
                            Some(4),
                        ),
                    ]),
                ]),
            ]),
        ]),
    );
    // At most 16 digits before the point, 16 after it and 3 in the exponent: enough for
    // any double, and a bound on a model that would write digits forever.
    rules.define(
        "natural",
        Expr::Alt(vec![
            text("0"),
            seq(vec![Expr::Class(vec![('1', '9')]), digits(0, 15)]),
        ]),
    );
    rules.define(
        "integer",
        seq(vec![Expr::optional(text("-")), rule("natural")]),
    );
    let fraction = Expr::optional(seq(vec![text("."), digits(1, 16)]));
    let exponent = Expr::optional(seq(vec![
        Expr::Class(vec![('E', 'E'), ('e', 'e')]),
        Expr::optional(Expr::Class(vec![('+', '+'), ('-', '-')])),
        digits(1, 3),
    ]));
    rules.define(
        "unsigned",
        seq(vec![rule("natural"), fraction.clone(), exponent.clone()]),
    );
    rules.define("number", seq(vec![rule("integer"), fraction, exponent]));
    rules.define("boolean", Expr::Alt(vec![text("true"), text("false")]));
    rules.define("null", text("null"));
    rules.define(
        "ws",
        Expr::optional(Expr::Alt(vec![
            text(" "),
            seq(vec![text("\n"), Expr::repeat(text(" "), 0, Some(INDENT))]),
        ])),
    );
}

/// `open`, then between `min` and `max` of `item` separated by commas, then `close`, with
/// whitespace after the opening and each comma (an item ends with its own).
fn delimited(open: &str, item: Expr, close: &str, min: u32, max: Option<u32>) -> Expr {
    let ws = Expr::rule("ws");
    let (open, close) = (Expr::text(open), Expr::text(close));
    if max == Some(0) {
        return Expr::Seq(vec![open, ws, close]);
    }
    let rest = |least: u32| {
        Expr::repeat(
            Expr::Seq(vec![Expr::text(","), ws.clone(), item.clone()]),
            least,
            max.map(|m| m - 1),
        )
    };
    let items = if min == 0 {
        Expr::optional(Expr::Seq(vec![item.clone(), rest(0)]))
    } else {
        Expr::Seq(vec![item.clone(), rest(min - 1)])
    };
    Expr::Seq(vec![open, ws.clone(), items, close])
}

/// An object's member: `key`, a colon, `value`, with whitespace around the colon and after.
fn member(key: Expr, value: Expr) -> Expr {
    let ws = Expr::rule("ws");
    Expr::Seq(vec![
        key,
        ws.clone(),
        Expr::text(":"),
        ws.clone(),
        value,
        ws,
    ])
}

/// The types a schema without `type` is about, from its keywords (none: any value).
fn inferred(object: &Map<String, Value>) -> Vec<&'static str> {
    let has = |keys: &[&str]| keys.iter().any(|k| object.contains_key(*k));
    let mut types = Vec::new();
    if has(&["properties", "required", "additionalProperties"]) {
        types.push("object");
    }
    if has(&["items", "minItems", "maxItems", "uniqueItems"]) {
        types.push("array");
    }
    if has(&["minLength", "maxLength", "pattern"]) {
        types.push("string");
    }
    if has(&["minimum"]) {
        types.push("number");
    }
    types
}

/// Refuses a `const` or `enum` value that its schema's `type` excludes.
fn check_type(object: &Map<String, Value>, value: &Value, at: &str) -> Result<(), GbnfError> {
    let Some(kind) = object.get("type") else {
        return Ok(());
    };
    let fits = |t: &Value| match t.as_str() {
        Some("object") => value.is_object(),
        Some("array") => value.is_array(),
        Some("string") => value.is_string(),
        Some("integer") => value.is_i64() || value.is_u64(),
        Some("number") => value.is_number(),
        Some("boolean") => value.is_boolean(),
        Some("null") => value.is_null(),
        _ => false,
    };
    let fits = match kind {
        Value::Array(list) => list.iter().any(fits),
        single => fits(single),
    };
    if fits {
        Ok(())
    } else {
        Err(refuse(
            at,
            &format!("allows {value}, which its `type` excludes"),
        ))
    }
}

fn count(object: &Map<String, Value>, keyword: &str, at: &str) -> Result<Option<u32>, GbnfError> {
    match object.get(keyword) {
        None => Ok(None),
        Some(n) => n
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| refuse(at, &format!("has a `{keyword}` that is not a count"))),
    }
}

/// A string pattern's expression as the JSON text of such strings: quotes and backslashes
/// in its literals escaped, and quotes, backslashes and control characters left out of its
/// classes (so the text always decodes to a string that matches).
fn json_text(expr: Expr) -> Result<Expr, GbnfError> {
    Ok(match expr {
        Expr::Text(text) => {
            let quoted = Value::String(text).to_string();
            Expr::Text(quoted[1..quoted.len() - 1].to_owned())
        }
        Expr::Class(ranges) => {
            const CUTS: [(u32, u32); 3] = [(0, 0x1F), (0x22, 0x22), (0x5C, 0x5C)];
            let mut out = Vec::new();
            let char_at = |code: u32| char::from_u32(code).unwrap_or(char::MAX);
            for (lo, hi) in ranges {
                let (mut start, end) = (u32::from(lo), u32::from(hi));
                for (a, b) in CUTS {
                    if b < start || a > end {
                        continue;
                    }
                    if a > start {
                        out.push((char_at(start), char_at(a - 1)));
                    }
                    start = b + 1;
                }
                if start <= end {
                    out.push((char_at(start), hi));
                }
            }
            if out.is_empty() {
                return Err(GbnfError(
                    "a `pattern` class holds only quotes, backslashes or control characters".into(),
                ));
            }
            Expr::Class(out)
        }
        Expr::Seq(items) => Expr::Seq(items.into_iter().map(json_text).collect::<Result<_, _>>()?),
        Expr::Alt(items) => Expr::Alt(items.into_iter().map(json_text).collect::<Result<_, _>>()?),
        Expr::Repeat { expr, min, max } => Expr::repeat(json_text(*expr)?, min, max),
        Expr::Rule(name) => Expr::Rule(name),
    })
}

fn refuse(at: &str, what: &str) -> GbnfError {
    GbnfError(format!("the schema at `{at}` {what}"))
}
