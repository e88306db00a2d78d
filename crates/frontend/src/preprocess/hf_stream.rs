//! Incremental detokenization for Hugging Face tokenizers.
//!
//! Decoding one token at a time is wrong for most tokenizers: a byte-level BPE or byte-fallback
//! token may hold part of a UTF-8 character, and SentencePiece-style decoders drop the leading
//! space of whatever comes first. So each new token is decoded inside a small window that
//! starts at the previously emitted token: the window's text minus the text of its already
//! emitted part is the new piece, released only when it does not end in U+FFFD (an incomplete
//! character the next token may finish). This is the prefix/read-offset scheme of TGI and vLLM.

use std::sync::Arc;

use super::error::PreprocessError;
use super::hf::HfTokenizer;

/// How many tokens may wait for a character to complete before the window is released anyway.
/// A character spans at most 4 byte tokens; a longer run of text ending in U+FFFD means invalid
/// output, whose replacement characters are final. The bound keeps each step's decode small
/// even when a model emits garbage for a whole response.
const MAX_PENDING: usize = 64;

#[derive(Debug)]
pub(crate) struct HfStream {
    tokenizer: Arc<HfTokenizer>,
    /// The window: `ids[..read]` were emitted by the last step (context for the decoder),
    /// `ids[read..]` are waiting. Tokens before the window can no longer change any output.
    ids: Vec<u32>,
    read: usize,
    /// Special tokens are text (a format such as Harmony marks an answer's parts with
    /// them), except these (the tokens that end the answer); none: they decode to nothing,
    /// as `skip_special_tokens`.
    keep_special: Option<Vec<u32>>,
}

impl HfStream {
    pub(crate) fn new(tokenizer: Arc<HfTokenizer>, keep_special: Option<Vec<u32>>) -> Self {
        Self {
            tokenizer,
            ids: Vec::new(),
            read: 0,
            keep_special,
        }
    }

    pub(crate) fn push(&mut self, id: u32) -> Result<String, PreprocessError> {
        self.tokenizer.check_id(id)?;
        // Decoding skips special tokens, so keeping them out of the window changes no text
        // and stops a run of them from growing it.
        if self.tokenizer.is_special(id) {
            let kept = match &self.keep_special {
                Some(but) => !but.contains(&id),
                None => false,
            };
            if !kept {
                return Ok(String::new());
            }
            // A special token stands alone: the text before it is complete.
            let mut text = self.finish();
            text.push_str(&self.tokenizer.decode_with_special(&[id])?);
            return Ok(text);
        }
        self.ids.push(id);
        let emitted = self.tokenizer.decode_known(&self.ids[..self.read])?;
        let text = self.tokenizer.decode_known(&self.ids)?;
        let complete = text.len() > emitted.len() && !text.ends_with(char::REPLACEMENT_CHARACTER);
        if !complete && self.ids.len() - self.read < MAX_PENDING {
            return Ok(String::new());
        }
        let piece = new_suffix(&text, &emitted);
        self.ids.drain(..self.read);
        self.read = self.ids.len();
        Ok(piece)
    }

    pub(crate) fn finish(&mut self) -> String {
        let piece = if self.read < self.ids.len() {
            let emitted = self.tokenizer.decode_known(&self.ids[..self.read]);
            let text = self.tokenizer.decode_known(&self.ids);
            match (emitted, text) {
                (Ok(emitted), Ok(text)) => new_suffix(&text, &emitted),
                // Ids were checked on the way in, so this is a tokenizer bug; show that text
                // was lost rather than end the stream silently short.
                _ => char::REPLACEMENT_CHARACTER.to_string(),
            }
        } else {
            String::new()
        };
        self.ids.clear();
        self.read = 0;
        piece
    }
}

/// The part of `text` after `emitted`. When the decoder rewrote already emitted text (byte
/// fallback regroups invalid bytes differently once more arrive), nothing shown is repeated:
/// the piece starts at the first character boundary past what was emitted.
fn new_suffix(text: &str, emitted: &str) -> String {
    if let Some(suffix) = text.strip_prefix(emitted) {
        return suffix.to_owned();
    }
    let start = (emitted.len()..text.len()).find(|&i| text.is_char_boundary(i));
    start
        .and_then(|start| text.get(start..))
        .unwrap_or_default()
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_suffix_strips_the_emitted_prefix() {
        assert_eq!(new_suffix("Hello world", "Hello"), " world");
        assert_eq!(new_suffix("Hello", "Hello"), "");
    }

    #[test]
    fn new_suffix_never_cuts_a_character_when_the_prefix_changed() {
        // "é" (2 bytes) was emitted, then the decoder turned its bytes into replacements.
        assert_eq!(
            new_suffix("\u{FFFD}\u{FFFD}\u{FFFD}a", "é"),
            "\u{FFFD}\u{FFFD}a"
        );
        assert_eq!(new_suffix("ab", "xyz"), "");
    }
}
