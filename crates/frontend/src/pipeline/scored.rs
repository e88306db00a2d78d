//! Keeping log probabilities with the text they came from: a token's entry goes out with
//! the piece of text that completes its own, once that text is past the stop strings; the
//! entries of tokens a stop string cut are dropped with their text.

use std::collections::VecDeque;

use super::Scored;

/// The entries whose text has not all gone out, counted in characters of the answer.
#[derive(Debug, Default)]
pub(super) struct Pending {
    /// Each entry with where its token's text ends.
    queue: VecDeque<(usize, Scored)>,
    /// Characters decoded so far, and of them gone out.
    decoded: usize,
    emitted: usize,
}

impl Pending {
    /// A token whose text is `piece`, `before` characters after what went before it (in
    /// the same output, not yet [`Self::decoded`]), and its entry; returns the piece's
    /// characters.
    pub(super) fn token(&mut self, before: usize, piece: &str, mut scored: Scored) -> usize {
        let start = self.decoded + before;
        let end = start + piece.chars().count();
        scored.offset = start as u32;
        self.queue.push_back((end, scored));
        end - start
    }

    /// Text decoded, on its way to the stop strings.
    pub(super) fn decoded(&mut self, text: &str) {
        self.decoded += text.chars().count();
    }

    /// Text gone out: the entries it completes.
    pub(super) fn emitted(&mut self, text: &str) -> Vec<Scored> {
        self.emitted += text.chars().count();
        let mut out = Vec::new();
        while let Some((end, _)) = self.queue.front()
            && *end <= self.emitted
        {
            out.extend(self.queue.pop_front().map(|(_, s)| s));
        }
        out
    }

    /// The generation ended with all its text out: every entry left (tokens that decode
    /// to nothing, such as the end of sequence).
    pub(super) fn rest(&mut self) -> Vec<Scored> {
        self.queue.drain(..).map(|(_, s)| s).collect()
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use switchyard_core::Token;
    use switchyard_core::protocol::TokenLogprobs;

    use super::*;
    use crate::pipeline::Spelled;
    use crate::stop::{StopCheck, StopMatcher};

    fn logprob(token: Token) -> Scored {
        let logprobs = TokenLogprobs {
            logprob: -(token as f32),
            top: Vec::new(),
        };
        Scored::of_ids(token, logprobs)
    }

    fn id(scored: &Scored) -> Token {
        match scored.token {
            Spelled::Id(id) => id,
            Spelled::Text(_) => panic!("{scored:?}"),
        }
    }

    /// Streams `pieces` (token i spells `pieces[i]`), arriving `per` tokens at a time,
    /// through the stop strings: the text and entries that go out.
    fn stream(pieces: &[String], per: usize, stops: &[String]) -> (String, Vec<Scored>) {
        let mut pending = Pending::default();
        let mut matcher = StopMatcher::new(stops.to_vec());
        let (mut text, mut scored) = (String::new(), Vec::new());
        let mut stopped = false;
        for (round, chunk) in pieces.chunks(per.max(1)).enumerate() {
            let mut decoded = String::new();
            let mut before = 0;
            for (i, piece) in chunk.iter().enumerate() {
                let token = (round * per.max(1) + i) as Token;
                before += pending.token(before, piece, logprob(token));
                decoded.push_str(piece);
            }
            pending.decoded(&decoded);
            let (out, stop) = match matcher.push(&decoded) {
                StopCheck::Emit(out) => (out, false),
                StopCheck::Stopped(out) => (out, true),
            };
            scored.extend(pending.emitted(&out));
            text.push_str(&out);
            if stop {
                stopped = true;
                break;
            }
        }
        if !stopped {
            let rest = matcher.flush();
            scored.extend(pending.emitted(&rest));
            text.push_str(&rest);
            scored.extend(pending.rest());
        }
        (text, scored)
    }

    #[test]
    fn a_stop_string_drops_the_entries_of_the_tokens_it_cut() {
        let pieces: Vec<String> = ["He", "llo", " ST", "OP", " more"]
            .map(String::from)
            .to_vec();
        let (text, scored) = stream(&pieces, 1, &["STOP".into()]);
        assert_eq!(text, "Hello ");
        let tokens: Vec<Token> = scored.iter().map(id).collect();
        // " ST" holds the stop's start: its text did not all go out.
        assert_eq!(tokens, [0, 1]);
        assert_eq!(scored[1].offset, 2);
    }

    proptest! {
        /// Against a naive model: an entry goes out exactly when its token's whole text
        /// is in the answer, in order, with its offset; a stream without stops keeps
        /// every entry; how tokens are grouped into outputs changes nothing.
        #[test]
        fn entries_follow_their_text(
            pieces in prop::collection::vec("[ab é]{0,3}", 0..24),
            per in 1usize..5,
            stop in prop::option::of("[ab ]{1,3}"),
        ) {
            let stops: Vec<String> = stop.into_iter().collect();
            let (text, scored) = stream(&pieces, per, &stops);
            let (one, one_scored) = stream(&pieces, 1, &stops);
            prop_assert_eq!(&text, &one);
            prop_assert_eq!(&scored, &one_scored);
            let whole: String = pieces.concat();
            let cut = stops
                .first()
                .and_then(|s| whole.find(s.as_str()))
                .unwrap_or(whole.len());
            prop_assert_eq!(&text, &whole[..cut]);
            // Stopped: the tokens whose text ends before the stop; else every one.
            let stopped = cut < whole.len();
            let cut_chars = whole[..cut].chars().count();
            let mut start = 0;
            let mut expected = Vec::new();
            for (token, piece) in pieces.iter().enumerate() {
                let end = start + piece.chars().count();
                if !stopped || end <= cut_chars {
                    expected.push((token as Token, start as u32));
                }
                start = end;
            }
            let got: Vec<(Token, u32)> = scored.iter().map(|s| (id(s), s.offset)).collect();
            prop_assert_eq!(got, expected);
        }
    }
}
