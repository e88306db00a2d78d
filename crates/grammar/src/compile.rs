//! A constraint compiled into a grammar over a vocabulary, once per distinct constraint.

use std::sync::{Arc, OnceLock};

use hashlink::LruCache;
use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use parking_lot::Mutex;
use serde_json::Value;
use switchyard_core::Token;
use switchyard_core::builtin_vocab::{self, smollm2};
use switchyard_core::protocol::Constraint;
use toktrie::TokEnv;

use crate::guide::Guide;
use crate::vocab::Vocabulary;

/// How many compiled constraints a [`Grammars`] keeps (the least recently used go first).
pub const CACHED: usize = 256;

/// Why a constraint cannot be enforced.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GrammarError {
    /// The constraint itself is wrong (a malformed schema or regular expression, an empty
    /// choice): the client's to fix.
    #[error("{0}")]
    Invalid(String),
    /// Tokens that the constraint does not allow (a resumed request's output, from a
    /// worker with another vocabulary).
    #[error("{0}")]
    Rejected(String),
    /// The vocabulary cannot be used, or the matcher failed.
    #[error("{0}")]
    Internal(String),
}

/// Compiles constraints over one vocabulary, keeping the last [`CACHED`] compiled.
pub struct Grammars {
    vocabulary: String,
    env: TokEnv,
    factory: ParserFactory,
    eos: Token,
    /// Tokens that close a structure, tried in this order when a draw is to end it.
    closers: Arc<[Token]>,
    compiled: Mutex<LruCache<Constraint, Matcher>>,
}

impl std::fmt::Debug for Grammars {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammars")
            .field("vocabulary", &self.vocabulary)
            .field("cached", &self.compiled.lock().len())
            .finish_non_exhaustive()
    }
}

/// The bytes tried, in order, when a draw is to bring a constraint to its end soonest:
/// those that close strings, objects and arrays first, then the separator that ends a
/// number or moves on to a required member, then what completes a value.
const CLOSERS: [&[u8]; 9] = [b"\"", b"}", b"]", b",", b"0", b":", b"a", b"{", b"["];

impl Grammars {
    pub fn new(vocabulary: &Vocabulary) -> Result<Self, GrammarError> {
        let env = vocabulary.env();
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| GrammarError::Internal(e.to_string()))?;
        factory.quiet();
        let trie = env.tok_trie();
        let closers = CLOSERS.iter().filter_map(|c| trie.token_id(c)).collect();
        Ok(Grammars {
            vocabulary: vocabulary.name.clone(),
            env,
            factory,
            eos: vocabulary.eos,
            closers,
            compiled: Mutex::new(LruCache::new(CACHED)),
        })
    }

    /// The names of the built-in vocabularies, whose grammars [`Self::named`] gives.
    pub const BUILT_IN: &'static [&'static str] = &[builtin_vocab::NAME, smollm2::NAME];

    /// The grammars of the built-in byte-level vocabulary, built once per process.
    pub fn builtin() -> Result<Arc<Grammars>, GrammarError> {
        static BUILTIN: OnceLock<Result<Arc<Grammars>, GrammarError>> = OnceLock::new();
        BUILTIN
            .get_or_init(|| Grammars::new(&Vocabulary::builtin()).map(Arc::new))
            .clone()
    }

    /// The grammars of SmolLM2's vocabulary, built once per process.
    pub fn smollm2() -> Result<Arc<Grammars>, GrammarError> {
        static SMOLLM2: OnceLock<Result<Arc<Grammars>, GrammarError>> = OnceLock::new();
        SMOLLM2
            .get_or_init(|| {
                let vocabulary = Vocabulary::smollm2().map_err(GrammarError::Internal)?;
                Grammars::new(&vocabulary).map(Arc::new)
            })
            .clone()
    }

    /// The grammars of the built-in vocabulary named `name` (see [`Self::BUILT_IN`]).
    pub fn named(name: &str) -> Option<Result<Arc<Grammars>, GrammarError>> {
        match name {
            builtin_vocab::NAME => Some(Self::builtin()),
            smollm2::NAME => Some(Self::smollm2()),
            _ => None,
        }
    }

    /// The name of the vocabulary it compiles for.
    pub fn vocabulary(&self) -> &str {
        &self.vocabulary
    }

    /// How many compiled constraints it holds.
    pub fn cached(&self) -> usize {
        self.compiled.lock().len()
    }

    /// A request's guide under `constraint`, compiled unless an earlier request's was.
    pub fn guide(&self, constraint: &Constraint) -> Result<Guide, GrammarError> {
        let cached = self.compiled.lock().get(constraint).cloned();
        let matcher = match cached {
            Some(matcher) => matcher,
            None => {
                // Compiled outside the lock: two requests may compile the same constraint
                // at once, and neither waits on the other.
                let parser = self
                    .factory
                    .create_parser(grammar(constraint)?)
                    .map_err(|e| GrammarError::Invalid(one_line(&e.to_string())))?;
                let matcher = Matcher::new(Ok(parser));
                if let Some(error) = matcher.get_error() {
                    return Err(GrammarError::Invalid(one_line(&error)));
                }
                self.compiled
                    .lock()
                    .insert(constraint.clone(), matcher.clone());
                matcher
            }
        };
        Ok(Guide::new(
            matcher,
            self.env.clone(),
            self.eos,
            Arc::clone(&self.closers),
        ))
    }
}

/// Whether `constraint` compiles: a malformed one is [`GrammarError::Invalid`], with
/// `llguidance`'s words for what is wrong.
pub fn check(constraint: &Constraint) -> Result<(), GrammarError> {
    Grammars::builtin()?.guide(constraint).map(|_| ())
}

/// The grammar of a constraint. A JSON Schema without settings of its own is generated
/// compact (no whitespace between its tokens), as a model asked for JSON answers.
fn grammar(constraint: &Constraint) -> Result<TopLevelGrammar, GrammarError> {
    Ok(match constraint {
        Constraint::JsonObject => {
            TopLevelGrammar::from_json_schema(compact(serde_json::json!({"type": "object"})))
        }
        Constraint::JsonSchema(text) => {
            let schema: Value = serde_json::from_str(text)
                .map_err(|e| GrammarError::Invalid(format!("the schema is not JSON: {e}")))?;
            TopLevelGrammar::from_json_schema(compact(schema))
        }
        Constraint::Regex(regex) => TopLevelGrammar::from_regex(regex),
        Constraint::Choice(choices) => {
            if choices.is_empty() {
                return Err(GrammarError::Invalid("the choice is empty".into()));
            }
            let alternatives: Vec<String> = choices.iter().map(|c| literal(c)).collect();
            TopLevelGrammar::from_lark(format!("start: {}", alternatives.join(" | ")))
        }
        Constraint::Grammar(lark) => TopLevelGrammar::from_lark(lark.clone()),
    })
}

/// `schema` with `llguidance`'s whitespace setting made compact, unless it sets its own.
fn compact(mut schema: Value) -> Value {
    if let Value::Object(map) = &mut schema
        && !map.contains_key("x-guidance")
    {
        map.insert(
            "x-guidance".into(),
            serde_json::json!({"whitespace_flexible": false}),
        );
    }
    schema
}

/// `text` as a Lark string literal: JSON's escapes, and DEL escaped too.
fn literal(text: &str) -> String {
    let quoted = Value::String(text.to_owned()).to_string();
    quoted.replace('\u{7f}', "\\u007f")
}

/// An error message on one line, for an API error.
fn one_line(message: &str) -> String {
    message
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ")
}
