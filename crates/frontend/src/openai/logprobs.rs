//! Log probabilities in a response: chat's `logprobs.content` (one entry per generated
//! token, with its `top_logprobs`) and completions' legacy `logprobs` (parallel lists).
//!
//! A token is named by what it spells ([`Preprocessor::token_bytes`]): `bytes` are exact,
//! `token` is them read as UTF-8 (a token holding part of a character shows U+FFFD).
//! Engines report raw log probabilities; JSON has no infinity, so one below
//! [`FLOOR`] is reported as it, as vLLM does.

use serde::ser::SerializeMap;
use serde::{Serialize, Serializer};

use crate::pipeline::{Scored, Spelled};
use crate::preprocess::Preprocessor;

/// The lowest log probability reported.
pub const FLOOR: f32 = -9999.0;

fn floored(logprob: f32) -> f32 {
    if logprob.is_nan() {
        FLOOR
    } else {
        logprob.max(FLOOR)
    }
}

/// What a token spells, as text and bytes.
fn spelled(preprocessor: &Preprocessor, token: &Spelled) -> (String, Vec<u8>) {
    match token {
        Spelled::Id(id) => {
            let bytes = preprocessor.token_bytes(*id).unwrap_or_default();
            (String::from_utf8_lossy(&bytes).into_owned(), bytes)
        }
        Spelled::Text(text) => (text.clone(), text.as_bytes().to_vec()),
    }
}

/// Chat's `choices[].logprobs`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, utoipa::ToSchema)]
pub struct ChatLogprobs {
    pub content: Vec<ChatTokenLogprob>,
}

#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct ChatTokenLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
    /// The likeliest tokens at this position, likeliest first (as many as asked).
    pub top_logprobs: Vec<TopLogprob>,
}

#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct TopLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
}

impl ChatLogprobs {
    /// The entries of `scored`, in order.
    pub fn of(preprocessor: &Preprocessor, scored: &[Scored]) -> Self {
        let content = scored
            .iter()
            .map(|s| {
                let (token, bytes) = spelled(preprocessor, &s.token);
                let top_logprobs = s
                    .top
                    .iter()
                    .map(|(id, logprob)| {
                        let (token, bytes) = spelled(preprocessor, id);
                        let logprob = *logprob;
                        TopLogprob {
                            token,
                            logprob: floored(logprob),
                            bytes,
                        }
                    })
                    .collect();
                ChatTokenLogprob {
                    token,
                    logprob: floored(s.logprob),
                    bytes,
                    top_logprobs,
                }
            })
            .collect();
        ChatLogprobs { content }
    }
}

/// Completions' `choices[].logprobs`: one entry per token in each list.
#[derive(Debug, Clone, Default, PartialEq, Serialize, utoipa::ToSchema)]
pub struct CompletionLogprobs {
    pub tokens: Vec<String>,
    pub token_logprobs: Vec<Option<f32>>,
    /// Per token, its likeliest alternatives by text (likeliest first; `null` for an
    /// echoed prompt's first token); `null` for a request that asked for none
    /// (`logprobs: 0`).
    #[schema(value_type = Option<Vec<Object>>)]
    pub top_logprobs: Option<Vec<Option<Alternatives>>>,
    /// Where each token's text starts in the choice's text, in characters.
    pub text_offset: Vec<u32>,
}

/// Alternatives by their text, serialized as a JSON object in likeliest-first order (two
/// tokens spelling the same text keep the likelier).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Alternatives(pub Vec<(String, f32)>);

impl Serialize for Alternatives {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut seen = std::collections::HashSet::new();
        let unique: Vec<_> = self.0.iter().filter(|(t, _)| seen.insert(t)).collect();
        let mut map = serializer.serialize_map(Some(unique.len()))?;
        for (token, logprob) in unique {
            map.serialize_entry(token, logprob)?;
        }
        map.end()
    }
}

impl CompletionLogprobs {
    /// Adds an echoed prompt's first token, which has no log probability.
    fn first(&mut self, preprocessor: &Preprocessor, token: u32, top: bool) {
        self.tokens
            .push(spelled(preprocessor, &Spelled::Id(token)).0);
        self.token_logprobs.push(None);
        self.text_offset.push(0);
        if top {
            self.top_logprobs.get_or_insert_with(Vec::new).push(None);
        }
    }

    /// Adds the entries of `scored`, their offsets `shift` characters on (past an echoed
    /// prompt); `top`: whether alternatives were asked for.
    pub fn extend(
        &mut self,
        preprocessor: &Preprocessor,
        scored: &[Scored],
        top: bool,
        shift: u32,
    ) {
        for s in scored {
            self.tokens.push(spelled(preprocessor, &s.token).0);
            self.token_logprobs.push(Some(floored(s.logprob)));
            self.text_offset.push(s.offset + shift);
            if top {
                let alternatives = s
                    .top
                    .iter()
                    .map(|(id, logprob)| (spelled(preprocessor, id).0, floored(*logprob)))
                    .collect();
                self.top_logprobs
                    .get_or_insert_with(Vec::new)
                    .push(Some(Alternatives(alternatives)));
            }
        }
    }

    /// An echoed prompt's: its first token (which has none), then `scored`.
    pub fn of_prompt(
        preprocessor: &Preprocessor,
        first: u32,
        scored: &[Scored],
        top: bool,
    ) -> Self {
        let mut logprobs = CompletionLogprobs::default();
        logprobs.first(preprocessor, first, top);
        logprobs.extend(preprocessor, scored, top, 0);
        logprobs
    }

    /// The entries of `scored`, as [`Self::extend`] adds them.
    pub fn of(preprocessor: &Preprocessor, scored: &[Scored], top: bool, shift: u32) -> Self {
        let mut logprobs = CompletionLogprobs::default();
        logprobs.extend(preprocessor, scored, top, shift);
        if top {
            logprobs.top_logprobs.get_or_insert_with(Vec::new);
        }
        logprobs
    }
}

#[cfg(test)]
mod tests {
    use switchyard_core::protocol::TokenLogprobs;

    use super::*;

    fn scored(token: u32, offset: u32, logprob: f32, top: Vec<(u32, f32)>) -> Scored {
        let mut scored = Scored::of_ids(token, TokenLogprobs { logprob, top });
        scored.offset = offset;
        scored
    }

    #[test]
    fn chat_entries_spell_tokens_and_floor_infinities() {
        let preprocessor = Preprocessor::smollm2(None).unwrap();
        let ids = preprocessor.encode(" hello é").unwrap();
        let entries: Vec<Scored> = ids
            .iter()
            .map(|&t| scored(t, 0, f32::NEG_INFINITY, vec![(ids[0], -0.5)]))
            .collect();
        let logprobs = ChatLogprobs::of(&preprocessor, &entries);
        let bytes: Vec<u8> = logprobs
            .content
            .iter()
            .flat_map(|e| e.bytes.clone())
            .collect();
        assert_eq!(bytes, " hello é".as_bytes());
        assert_eq!(logprobs.content[0].token, " hello");
        assert!(logprobs.content.iter().all(|e| e.logprob == FLOOR));
        assert_eq!(logprobs.content[0].top_logprobs[0].token, " hello");
        assert_eq!(logprobs.content[0].top_logprobs[0].logprob, -0.5);
        let json = serde_json::to_value(&logprobs).unwrap();
        assert_eq!(json["content"][0]["logprob"], serde_json::json!(-9999.0));
    }

    #[test]
    fn completion_alternatives_are_an_object_likeliest_first() {
        let preprocessor = Preprocessor::builtin(1024);
        let a = u32::from(b'a');
        let b = u32::from(b'b');
        let entries = [
            scored(a, 0, -0.1, vec![(a, -0.1), (b, -2.0), (a, -3.0)]),
            scored(b, 1, -2.0, vec![(a, -0.2)]),
        ];
        let logprobs = CompletionLogprobs::of(&preprocessor, &entries, true, 0);
        let json = serde_json::to_string(&logprobs).unwrap();
        assert_eq!(
            json,
            r#"{"tokens":["a","b"],"token_logprobs":[-0.1,-2.0],"top_logprobs":[{"a":-0.1,"b":-2.0},{"a":-0.2}],"text_offset":[0,1]}"#
        );
        let none = CompletionLogprobs::of(&preprocessor, &entries, false, 0);
        assert_eq!(
            serde_json::to_value(&none).unwrap()["top_logprobs"],
            serde_json::Value::Null
        );
    }
}
