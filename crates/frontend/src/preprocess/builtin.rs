//! The built-in byte-level tokenizer, so `switchyard serve` runs without model files, over
//! the vocabulary of `switchyard_core::builtin_vocab`: encoding is a string's UTF-8 bytes, so
//! any text round-trips exactly; decoding spells each token (special ones as nothing).

use switchyard_core::builtin_vocab::{self, Piece};
#[cfg(test)]
use switchyard_core::builtin_vocab::{FIRST_WORD, words::WORDS};

use super::error::PreprocessError;
use super::utf8_stream::Utf8Stream;

/// Size of the built-in vocabulary: valid ids are `0..BUILTIN_VOCAB_SIZE`.
pub const BUILTIN_VOCAB_SIZE: u32 = builtin_vocab::VOCAB_SIZE;
/// Beginning of sequence (special: decodes to nothing; `encode` never produces it).
pub const BUILTIN_BOS: u32 = builtin_vocab::BOS;
/// End of sequence (special: decodes to nothing); the built-in stop token.
pub const BUILTIN_EOS: u32 = builtin_vocab::EOS;

/// What one built-in token stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BuiltinPiece {
    Byte(u8),
    Special,
    Word(&'static str),
}

/// Stateless: the vocabulary is code, not data.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct BuiltinTokenizer;

impl BuiltinTokenizer {
    pub(crate) fn encode(self, text: &str) -> Vec<u32> {
        text.bytes().map(u32::from).collect()
    }

    pub(crate) fn piece(self, id: u32) -> Result<BuiltinPiece, PreprocessError> {
        match builtin_vocab::piece(id) {
            Some(Piece::Byte(byte)) => Ok(BuiltinPiece::Byte(byte)),
            Some(Piece::Special(_)) => Ok(BuiltinPiece::Special),
            Some(Piece::Word(word)) => Ok(BuiltinPiece::Word(word)),
            None => Err(PreprocessError::UnknownToken {
                id,
                vocab_size: BUILTIN_VOCAB_SIZE,
            }),
        }
    }

    /// Decodes a whole sequence: bytes are joined across tokens before UTF-8 decoding (so a
    /// character split over several byte tokens comes out whole), invalid UTF-8 becomes
    /// U+FFFD, special tokens vanish.
    pub(crate) fn decode(self, tokens: &[u32]) -> Result<String, PreprocessError> {
        let mut bytes = Vec::with_capacity(tokens.len());
        for &id in tokens {
            match self.piece(id)? {
                BuiltinPiece::Byte(byte) => bytes.push(byte),
                BuiltinPiece::Special => {}
                BuiltinPiece::Word(word) => {
                    bytes.push(b' ');
                    bytes.extend_from_slice(word.as_bytes());
                }
            }
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }
}

/// Streams the built-in tokenizer's output: the same byte stream as [`BuiltinTokenizer::decode`]
/// fed through a [`Utf8Stream`], so the pieces add up to exactly the full decode.
#[derive(Debug, Default)]
pub(crate) struct BuiltinStream {
    utf8: Utf8Stream,
}

impl BuiltinStream {
    pub(crate) fn push(&mut self, id: u32) -> Result<String, PreprocessError> {
        let mut out = String::new();
        match BuiltinTokenizer.piece(id)? {
            BuiltinPiece::Byte(byte) => self.utf8.push(&[byte], &mut out),
            BuiltinPiece::Special => {}
            BuiltinPiece::Word(word) => {
                self.utf8.push(b" ", &mut out);
                self.utf8.push(word.as_bytes(), &mut out);
            }
        }
        Ok(out)
    }

    pub(crate) fn finish(&mut self) -> String {
        let mut out = String::new();
        self.utf8.finish(&mut out);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn word_ids_cycle_through_the_word_list() {
        let tokenizer = BuiltinTokenizer;
        assert_eq!(
            tokenizer.piece(FIRST_WORD).ok(),
            Some(BuiltinPiece::Word(WORDS[0]))
        );
        let wrapped = FIRST_WORD + WORDS.len() as u32;
        assert_eq!(
            tokenizer.piece(wrapped).ok(),
            Some(BuiltinPiece::Word(WORDS[0]))
        );
        assert_eq!(
            tokenizer.piece(BUILTIN_VOCAB_SIZE - 1).ok(),
            Some(BuiltinPiece::Word(
                WORDS[(BUILTIN_VOCAB_SIZE - 1 - FIRST_WORD) as usize % WORDS.len()]
            ))
        );
    }

    #[test]
    fn ids_past_the_vocabulary_are_errors() {
        let error = BuiltinTokenizer.piece(BUILTIN_VOCAB_SIZE);
        assert!(matches!(
            error,
            Err(PreprocessError::UnknownToken { id: 32_000, .. })
        ));
        assert!(BuiltinTokenizer.decode(&[104, u32::MAX]).is_err());
    }

    #[test]
    fn word_list_is_a_few_hundred_distinct_lowercase_words() {
        assert!((200..=1000).contains(&WORDS.len()));
        let mut seen = std::collections::HashSet::new();
        for word in WORDS {
            assert!(
                !word.is_empty() && word.bytes().all(|b| b.is_ascii_lowercase()),
                "{word:?}"
            );
            assert!(seen.insert(word), "duplicate word {word:?}");
        }
    }

    #[test]
    fn a_word_completes_a_pending_character_with_a_replacement() {
        // E2 82 is an unfinished "€"; the word's space proves it will never finish.
        let mut stream = BuiltinStream::default();
        assert_eq!(stream.push(0xE2).ok().as_deref(), Some(""));
        assert_eq!(stream.push(0x82).ok().as_deref(), Some(""));
        assert_eq!(
            stream.push(FIRST_WORD).ok().as_deref(),
            Some("\u{FFFD} the")
        );
        assert_eq!(
            BuiltinTokenizer
                .decode(&[0xE2, 0x82, FIRST_WORD])
                .ok()
                .as_deref(),
            Some("\u{FFFD} the")
        );
    }

    #[test]
    fn special_tokens_do_not_interrupt_a_character() {
        let mut stream = BuiltinStream::default();
        assert_eq!(stream.push(0xC3).ok().as_deref(), Some(""));
        assert_eq!(stream.push(BUILTIN_EOS).ok().as_deref(), Some(""));
        assert_eq!(stream.push(0xA9).ok().as_deref(), Some("é"));
        assert_eq!(
            BuiltinTokenizer
                .decode(&[0xC3, BUILTIN_BOS, 0xA9])
                .ok()
                .as_deref(),
            Some("é")
        );
    }
}
