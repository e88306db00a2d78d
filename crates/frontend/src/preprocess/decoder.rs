//! Turning one response's token stream into text, piece by piece.

use super::builtin::BuiltinStream;
use super::error::PreprocessError;
use super::hf_stream::HfStream;

/// Detokenizes one response stream incrementally; get one from
/// [`Preprocessor::decoder`](super::Preprocessor::decoder).
///
/// The pieces returned by [`push`](Self::push) and [`finish`](Self::finish), concatenated,
/// are the decoded text of all pushed tokens; no piece ends inside a UTF-8 character or a
/// multi-token word. Special tokens (EOS and the like) decode to nothing.
#[derive(Debug)]
pub struct IncrementalDecoder {
    state: DecoderState,
}

#[derive(Debug)]
enum DecoderState {
    Builtin(BuiltinStream),
    Hf(HfStream),
}

impl IncrementalDecoder {
    pub(super) fn builtin() -> Self {
        Self {
            state: DecoderState::Builtin(BuiltinStream::default()),
        }
    }

    pub(super) fn hf(stream: HfStream) -> Self {
        Self {
            state: DecoderState::Hf(stream),
        }
    }

    /// Feeds one generated token; returns the text it completes (possibly empty: a multi-byte
    /// character or a multi-token word may still be incomplete). Never splits a UTF-8
    /// character. An id outside the vocabulary is an error and leaves the decoder as it was.
    pub fn push(&mut self, token: u32) -> Result<String, PreprocessError> {
        match &mut self.state {
            DecoderState::Builtin(stream) => stream.push(token),
            DecoderState::Hf(stream) => stream.push(token),
        }
    }

    /// End of stream: whatever is left (an incomplete character becomes U+FFFD). The decoder
    /// is then empty, as if new.
    pub fn finish(&mut self) -> String {
        match &mut self.state {
            DecoderState::Builtin(stream) => stream.finish(),
            DecoderState::Hf(stream) => stream.finish(),
        }
    }
}
