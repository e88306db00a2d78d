//! Stop strings: cut the output at the first occurrence of any of them, without ever
//! streaming part of one (text that could still turn into a stop string is held back).

/// What feeding text produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopCheck {
    /// Text that can be sent (possibly empty).
    Emit(String),
    /// A stop string was found: send this text, then stop.
    Stopped(String),
}

#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    pending: String,
    longest: usize,
}

impl StopMatcher {
    pub fn new(stops: Vec<String>) -> Self {
        let stops: Vec<String> = stops.into_iter().filter(|s| !s.is_empty()).collect();
        let longest = stops.iter().map(String::len).max().unwrap_or(0);
        StopMatcher {
            stops,
            pending: String::new(),
            longest,
        }
    }

    pub fn push(&mut self, text: &str) -> StopCheck {
        if self.stops.is_empty() {
            return StopCheck::Emit(text.to_string());
        }
        self.pending.push_str(text);
        let first = self
            .stops
            .iter()
            .filter_map(|s| self.pending.find(s.as_str()))
            .min();
        if let Some(at) = first {
            let out = self.pending[..at].to_string();
            self.pending.clear();
            return StopCheck::Stopped(out);
        }
        // Hold back the longest tail that is a prefix of some stop string.
        let mut keep = 0;
        for len in (1..self.longest.min(self.pending.len() + 1)).rev() {
            let start = self.pending.len() - len;
            if !self.pending.is_char_boundary(start) {
                continue;
            }
            let tail = &self.pending[start..];
            if self.stops.iter().any(|s| s.starts_with(tail)) {
                keep = len;
                break;
            }
        }
        let cut = self.pending.len() - keep;
        let out = self.pending[..cut].to_string();
        self.pending.drain(..cut);
        StopCheck::Emit(out)
    }

    /// The end of the stream: whatever was held back.
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn holds_back_possible_stop_prefixes() {
        let mut m = StopMatcher::new(vec!["END".into()]);
        assert_eq!(m.push("hello E"), StopCheck::Emit("hello ".into()));
        assert_eq!(m.push("N"), StopCheck::Emit(String::new()));
        assert_eq!(m.push("x"), StopCheck::Emit("ENx".into()));
        assert_eq!(m.push(" and EN"), StopCheck::Emit(" and ".into()));
        assert_eq!(m.push("D more"), StopCheck::Stopped("".into()));
    }

    #[test]
    fn earliest_stop_wins_and_flush_returns_the_rest() {
        let mut m = StopMatcher::new(vec!["bb".into(), "a".into()]);
        assert_eq!(m.push("xxbba"), StopCheck::Stopped("xx".into()));
        let mut m = StopMatcher::new(vec!["zz".into()]);
        assert_eq!(m.push("abz"), StopCheck::Emit("ab".into()));
        assert_eq!(m.flush(), "z");
    }

    #[test]
    fn multibyte_text_is_never_cut_inside_a_character() {
        let mut m = StopMatcher::new(vec!["é!".into()]);
        assert_eq!(m.push("caf"), StopCheck::Emit("caf".into()));
        assert_eq!(m.push("é"), StopCheck::Emit(String::new()));
        assert_eq!(m.push("é!"), StopCheck::Stopped("é".into()));
    }

    proptest! {
        // Streaming in pieces gives the same text as cutting the whole at the first stop.
        #[test]
        fn streaming_equals_whole(text in "[ab]{0,30}", stop in "[ab]{1,3}", cuts in prop::collection::vec(0usize..30, 0..6)) {
            let expected = match text.find(&stop) { Some(i) => (text[..i].to_string(), true), None => (text.clone(), false) };
            let mut m = StopMatcher::new(vec![stop.clone()]);
            let mut out = String::new();
            let mut stopped = false;
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(text.len())).collect();
            cuts.sort_unstable();
            let mut start = 0;
            for cut in cuts.into_iter().chain([text.len()]) {
                match m.push(&text[start..cut]) {
                    StopCheck::Emit(s) => out.push_str(&s),
                    StopCheck::Stopped(s) => { out.push_str(&s); stopped = true; break; }
                }
                start = cut;
            }
            if !stopped { out.push_str(&m.flush()); }
            prop_assert_eq!((out, stopped), expected);
        }
    }
}
