//! A constraint as a GBNF grammar, the form llama.cpp's servers read (the `grammar` field of
//! llama-server and of llama-cpp-python's server).
//!
//! The constraint is first built as [`Rules`] of [`Expr`]s, then printed. JSON Schemas
//! ([`schema`]) and regular expressions ([`regex`]) are translated here; a grammar in
//! llguidance's Lark syntax is not (a [`GbnfError`] names it).
//!
//! The grammar admits only text the constraint admits. Where a schema allows more than a
//! grammar can say simply, it admits less and says so:
//! - properties come in the schema's order, and none beyond those listed unless the object
//!   lists none;
//! - a `pattern` must match the whole string (JSON Schema would search it);
//! - `oneOf` is read as `anyOf`, as llguidance and llama.cpp read it.
//!
//! Keywords that would need more are refused by name, never ignored.

pub mod regex;
pub mod schema;

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::fmt::Write as _;

use switchyard_core::protocol::Constraint;

/// Why a constraint has no GBNF form here.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct GbnfError(pub String);

/// One GBNF expression.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expr {
    /// Exactly this text.
    Text(String),
    /// One character in any of these inclusive ranges.
    Class(Vec<(char, char)>),
    /// Each in turn.
    Seq(Vec<Expr>),
    /// Any one of them.
    Alt(Vec<Expr>),
    /// Between `min` and `max` (unbounded when `None`) of it.
    Repeat {
        expr: Box<Expr>,
        min: u32,
        max: Option<u32>,
    },
    /// The rule of this name.
    Rule(String),
}

impl Expr {
    pub fn text(text: impl Into<String>) -> Expr {
        Expr::Text(text.into())
    }

    pub fn rule(name: impl Into<String>) -> Expr {
        Expr::Rule(name.into())
    }

    /// Between `min` and `max` of `expr`: nothing when `max` is zero, `expr` itself when
    /// both are one.
    pub fn repeat(expr: Expr, min: u32, max: Option<u32>) -> Expr {
        match (min, max) {
            (_, Some(0)) => return Expr::empty(),
            (1, Some(1)) => return expr,
            _ => {}
        }
        Expr::Repeat {
            expr: Box::new(expr),
            min,
            max,
        }
    }

    pub fn optional(expr: Expr) -> Expr {
        Expr::repeat(expr, 0, Some(1))
    }

    /// Nothing: the empty sequence.
    pub fn empty() -> Expr {
        Expr::Seq(Vec::new())
    }
}

/// Named rules, `root` among them once built; printed in the order they were defined.
#[derive(Debug, Clone, Default)]
pub struct Rules {
    order: Vec<String>,
    rules: HashMap<String, Expr>,
}

impl Rules {
    /// Defines (or redefines) a rule.
    pub fn define(&mut self, name: &str, expr: Expr) {
        if self.rules.insert(name.to_owned(), expr).is_none() {
            self.order.push(name.to_owned());
        }
    }

    pub fn get(&self, name: &str) -> Option<&Expr> {
        self.rules.get(name)
    }

    pub fn contains(&self, name: &str) -> bool {
        self.rules.contains_key(name)
    }

    /// The grammar's text: one rule per line.
    pub fn print(&self) -> String {
        let mut out = String::new();
        for name in &self.order {
            let _ = writeln!(out, "{name} ::= {}", print(&self.rules[name], 0));
        }
        out
    }
}

/// The GBNF grammar that admits what `constraint` admits, its start rule `root`.
pub fn gbnf(constraint: &Constraint) -> Result<String, GbnfError> {
    Ok(rules(constraint)?.print())
}

/// The rules of [`gbnf`], unprinted.
pub fn rules(constraint: &Constraint) -> Result<Rules, GbnfError> {
    let mut rules = Rules::default();
    match constraint {
        Constraint::JsonObject => schema::json_object(&mut rules),
        Constraint::JsonSchema(text) => schema::json_schema(&mut rules, text)?,
        Constraint::Regex(pattern) => {
            let expr = regex::regex(pattern)?;
            rules.define("root", expr);
        }
        Constraint::Choice(choices) => {
            if choices.is_empty() {
                return Err(GbnfError("a choice needs at least one string".into()));
            }
            let alternatives = choices.iter().map(|c| Expr::text(c.as_str())).collect();
            rules.define("root", Expr::Alt(alternatives));
        }
        Constraint::Grammar(_) => {
            return Err(GbnfError(
                "a grammar in llguidance's Lark syntax has no GBNF form here".into(),
            ));
        }
    }
    Ok(rules)
}

/// Binding strength, loosest first: an alternation inside a sequence, or anything but an
/// atom under a repetition, is parenthesised.
const ALT: u8 = 0;
const SEQ: u8 = 1;
const ATOM: u8 = 2;

fn print(expr: &Expr, context: u8) -> String {
    let (text, strength) = match expr {
        Expr::Text(text) => (quote(text), ATOM),
        Expr::Class(ranges) => (class(ranges), ATOM),
        Expr::Rule(name) => (name.clone(), ATOM),
        Expr::Seq(items) if items.iter().all(is_empty) => ("\"\"".to_owned(), ATOM),
        Expr::Seq(items) if items.iter().filter(|e| !is_empty(e)).count() == 1 => {
            let item = items.iter().find(|e| !is_empty(e));
            return print(item.unwrap_or(expr), context);
        }
        Expr::Seq(items) => (
            items
                .iter()
                .filter(|e| !is_empty(e))
                .map(|e| print(e, SEQ))
                .collect::<Vec<_>>()
                .join(" "),
            SEQ,
        ),
        Expr::Alt(items) if items.len() == 1 => return print(&items[0], context),
        Expr::Alt(items) => (
            items
                .iter()
                .map(|e| print(e, SEQ))
                .collect::<Vec<_>>()
                .join(" | "),
            ALT,
        ),
        Expr::Repeat { expr, min, max } => {
            let suffix = match (min, max) {
                (0, None) => "*".to_owned(),
                (1, None) => "+".to_owned(),
                (0, Some(1)) => "?".to_owned(),
                (m, None) => format!("{{{m},}}"),
                (m, Some(n)) if m == n => format!("{{{m}}}"),
                (m, Some(n)) => format!("{{{m},{n}}}"),
            };
            (format!("{}{suffix}", print(expr, ATOM)), ATOM)
        }
    };
    if strength < context {
        format!("({text})")
    } else {
        text
    }
}

fn is_empty(expr: &Expr) -> bool {
    match expr {
        Expr::Seq(items) => items.iter().all(is_empty),
        Expr::Text(text) => text.is_empty(),
        _ => false,
    }
}

/// A quoted literal: quotes, backslashes and all but printable ASCII escaped.
fn quote(text: &str) -> String {
    let mut out = String::from("\"");
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            ' '..='~' => out.push(c),
            _ => out.push_str(&escape(c)),
        }
    }
    out.push('"');
    out
}

/// A character class: its bounds escaped unless plain letters, digits or common punctuation.
fn class(ranges: &[(char, char)]) -> String {
    let mut out = String::from("[");
    for &(lo, hi) in ranges {
        out.push_str(&class_char(lo));
        if hi != lo {
            out.push('-');
            out.push_str(&class_char(hi));
        }
    }
    out.push(']');
    out
}

fn class_char(c: char) -> String {
    match c {
        '\\' | ']' | '[' | '-' | '^' | '"' => escape(c),
        ' '..='~' => c.to_string(),
        _ => escape(c),
    }
}

/// `\xHH`, `\uHHHH` or `\UHHHHHHHH`, the escapes llama.cpp's grammar parser reads.
fn escape(c: char) -> String {
    let code = u32::from(c);
    if code < 0x80 {
        format!("\\x{code:02X}")
    } else if code < 0x1_0000 {
        format!("\\u{code:04X}")
    } else {
        format!("\\U{code:08X}")
    }
}
