//! Constrained decoding: what an engine may generate for a request with a
//! [`Constraint`] (JSON mode, a JSON Schema, a regular expression, a choice, a grammar).
//!
//! A constraint is compiled once per distinct text into a token-level matcher by
//! `llguidance` over the engine's own [`Vocabulary`] ([`Grammars`]: a bounded cache, so no
//! request compiles again what an earlier one did). Each request then gets a [`Guide`]: it
//! gives the tokens allowed next, takes the tokens generated, and draws the mocker's
//! tokens under the mask (see [`Guide::pick`]).
//!
//! - [`vocab`]: a vocabulary as the bytes of each token, and the built-in one.
//! - [`compile`]: a constraint into a grammar, the cache, and checking a constraint.
//! - [`guide`]: one request's matcher and the draw under it.
//! - [`gbnf`]: a constraint as a GBNF grammar, for llama.cpp's servers.

pub mod compile;
pub mod gbnf;
pub mod guide;
pub mod vocab;

pub use compile::{GrammarError, Grammars, check};
pub use guide::{Guide, Pick};
pub use switchyard_core::protocol::{Constraint, ConstraintKind};
pub use vocab::Vocabulary;

#[cfg(test)]
mod tests;
