//! A request the engine holds: its tokens, its keys and values, its blocks, its media.

use candle_core::Tensor;
use switchyard_core::TokenBlocks;
use switchyard_core::protocol::{GenerateRequest, TokenLogprobs};

use super::Distribution;
use crate::model::SeqKv;

pub(super) struct Sequence {
    pub(super) request: GenerateRequest,
    /// Prompt then output.
    pub(super) tokens: Vec<u32>,
    pub(super) prompt_len: usize,
    pub(super) kv: SeqKv,
    /// The sequence's blocks as everyone hashes them, extended as it grows.
    pub(super) blocks: TokenBlocks,
    /// Full blocks already offered to the cache.
    pub(super) offered: usize,
    pub(super) cached_tokens: u32,
    /// Output tokens so far, counting those before a resume.
    pub(super) generated: u32,
    /// The media spans' input embeddings: (offset, rows [length, hidden]).
    pub(super) media: Vec<(usize, Tensor)>,
    /// Its media are being encoded: its prefill stops before this position.
    pub(super) hold: Option<usize>,
    /// It came with media and no embeddings: the prefix cache must hold up to here.
    pub(super) needs_cached: usize,
    /// Its constraint, where it stands in it.
    pub(super) guide: Option<Box<switchyard_grammar::Guide>>,
    /// The prompt's log probabilities so far, when the request asked (and is not resumed):
    /// each prompt token's after the first, with this many alternatives.
    pub(super) prompt_logprobs: Option<(u32, Vec<TokenLogprobs>)>,
}

/// A step's rows of a prompt whose log probabilities are asked: each row's logits give
/// the next prompt token's entry.
pub(super) struct PromptRows {
    /// The prompt token each row predicts (none past the prompt).
    predicted: Vec<Option<u32>>,
    top: usize,
    pub(super) entries: Vec<TokenLogprobs>,
}

impl PromptRows {
    /// For `seq`'s positions `from..to` in a step, if its prompt's are asked.
    pub(super) fn of(seq: &Sequence, from: usize, to: usize) -> Option<PromptRows> {
        let (top, _) = seq.prompt_logprobs.as_ref()?;
        Some(PromptRows {
            predicted: (from..to)
                .map(|p| (p + 1 < seq.prompt_len).then(|| seq.tokens[p + 1]))
                .collect(),
            top: *top as usize,
            entries: Vec::new(),
        })
    }

    /// Row `row`'s logits.
    pub(super) fn take(&mut self, row: usize, logits: &[f32]) {
        if let Some(Some(token)) = self.predicted.get(row) {
            let d = Distribution::of(logits, self.top);
            self.entries.push(TokenLogprobs {
                logprob: d.logprob(logits[*token as usize]),
                top: d.top,
            });
        }
    }
}

impl Sequence {
    /// Whether more than the last token is still to compute (else it decodes).
    pub(super) fn prefilling(&self) -> bool {
        self.kv.len() + 1 < self.tokens.len()
    }

    /// Whether it waits for its media with everything before them computed.
    pub(super) fn waits_for_media(&self) -> bool {
        self.hold.is_some_and(|h| self.kv.len() >= h)
    }

    /// The media embeddings for its positions `from..to`, as
    /// [`StepInput::embeds`](crate::model::StepInput::embeds).
    pub(super) fn embeds(
        &self,
        from: usize,
        to: usize,
    ) -> Result<Vec<(usize, Tensor)>, candle_core::Error> {
        let mut out = Vec::new();
        for (offset, rows) in &self.media {
            let (lo, hi) = ((*offset).max(from), (offset + rows.dim(0)?).min(to));
            if lo < hi {
                out.push((lo - from, rows.narrow(0, lo - offset, hi - lo)?));
            }
        }
        Ok(out)
    }
}
