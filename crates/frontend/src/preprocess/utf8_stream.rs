//! Lossy UTF-8 decoding of a byte stream that arrives in pieces.
//!
//! The output of [`Utf8Stream`] over any split of a byte string, concatenated, equals
//! `String::from_utf8_lossy` of the whole: complete characters come out as soon as their last
//! byte arrives, an incomplete sequence at the end is held back (at most 3 bytes), and each
//! invalid sequence becomes one U+FFFD exactly where `from_utf8_lossy` puts one.

/// Incremental lossy UTF-8 decoder.
#[derive(Debug, Default, Clone)]
pub(crate) struct Utf8Stream {
    /// The start of a character whose remaining bytes have not arrived yet.
    pending: Vec<u8>,
}

impl Utf8Stream {
    /// Appends `bytes` and writes to `out` everything that is now final.
    pub(crate) fn push(&mut self, bytes: &[u8], out: &mut String) {
        self.pending.extend_from_slice(bytes);
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(text) => {
                    out.push_str(text);
                    rest = &[];
                    break;
                }
                Err(error) => {
                    let (valid, after) = rest.split_at(error.valid_up_to());
                    // `valid` is valid UTF-8 by `valid_up_to`'s contract; the lossy conversion
                    // borrows it without copying or replacing anything.
                    out.push_str(&String::from_utf8_lossy(valid));
                    match error.error_len() {
                        Some(invalid) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            rest = after.get(invalid..).unwrap_or_default();
                        }
                        // A valid prefix of a character cut off by the end of the input: the
                        // next bytes decide what it becomes.
                        None => {
                            rest = after;
                            break;
                        }
                    }
                }
            }
        }
        let consumed = self.pending.len() - rest.len();
        self.pending.drain(..consumed);
    }

    /// End of input: an incomplete character becomes one U+FFFD, as in `from_utf8_lossy`.
    pub(crate) fn finish(&mut self, out: &mut String) {
        if !self.pending.is_empty() {
            self.pending.clear();
            out.push(char::REPLACEMENT_CHARACTER);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(pieces: &[&[u8]]) -> Vec<String> {
        let mut decoder = Utf8Stream::default();
        let mut chunks = Vec::new();
        for piece in pieces {
            let mut out = String::new();
            decoder.push(piece, &mut out);
            chunks.push(out);
        }
        let mut out = String::new();
        decoder.finish(&mut out);
        chunks.push(out);
        chunks
    }

    #[test]
    fn holds_a_character_until_its_last_byte() {
        // "€" is E2 82 AC.
        assert_eq!(stream(&[b"a\xE2", b"\x82", b"\xACb"]), ["a", "", "€b", ""]);
    }

    #[test]
    fn invalid_bytes_become_one_replacement_each_like_from_utf8_lossy() {
        let bytes: &[u8] = b"\xFFa\x80\xE2\x82b\xF0\x9F";
        let expected = String::from_utf8_lossy(bytes);
        let chunks: Vec<&[u8]> = bytes.chunks(1).collect();
        assert_eq!(stream(&chunks).concat(), expected);
        assert_eq!(expected, "\u{FFFD}a\u{FFFD}\u{FFFD}b\u{FFFD}");
    }

    #[test]
    fn incomplete_tail_becomes_a_replacement_at_finish() {
        assert_eq!(stream(&[b"ok\xF0\x9F\x98"]), ["ok", "\u{FFFD}"]);
    }

    #[test]
    fn finish_twice_adds_nothing() {
        let mut decoder = Utf8Stream::default();
        let mut out = String::new();
        decoder.push(b"\xE2", &mut out);
        decoder.finish(&mut out);
        decoder.finish(&mut out);
        assert_eq!(out, "\u{FFFD}");
    }
}
