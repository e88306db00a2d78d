//! The step engine around the model: continuous batching, chunked prefill, a paged prefix
//! cache with LRU eviction under a memory budget, KV events, sampling.
//!
//! Every step decodes one token for each running sequence that has finished its prompt and
//! computes the next chunk of the prompts still being prefilled, within a token budget
//! (`max_batched_tokens`), in one forward pass. Admission takes waiting requests while
//! fewer than `max_num_seqs` run.
//!
//! The prefix cache keeps the keys and values of every full block of `block_size` tokens a
//! sequence computed (prompt and output), keyed by the block hashes every component uses
//! (`switchyard_core::blocks_for`); a request whose first blocks are cached copies them
//! instead of computing them (all but the last prompt token, whose logits are needed).
//! Stores and evictions are published as KV events, so KV-aware routing sees the real
//! cache. The cache holds copies: evicting a block never touches a running sequence.
//!
//! Media are merged: a prompt's media spans take the input embeddings projected from the
//! embeddings its encoder computed (carried in `media_inputs`, one per span) in place of
//! their placeholder tokens. A request sent ahead of its media (`media_pending`) computes
//! its text up to its first media position and waits there; its frontend sends it again
//! with the embeddings, and the text computed meanwhile is found in the prefix cache. A
//! request with media and no embeddings is served only when its media's KV is cached.
//!
//! Files: `cache.rs` holds the prefix cache and what a sequence takes from and gives to
//! it; `sequence.rs` a running request; `step.rs` admission, the step and the rest of the
//! worker's
//! [`StepEngine`](switchyard_worker::driver::StepEngine) interface; `sampling.rs` the token draw ([`sample`]).

mod cache;
mod sampling;
mod sequence;
mod step;

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use candle_core::Tensor;
use hashlink::LinkedHashMap;
use switchyard_core::perf::PerfModel;
use switchyard_core::protocol::{EngineError, GenerateRequest};
use switchyard_core::{KvEvent, KvEventData, StorageTier, WorkerKey};
use switchyard_grammar::{GrammarError, Grammars, Guide};

use crate::model::Model;
use cache::PrefixCache;
pub use sampling::{Distribution, sample};
use sequence::Sequence;

pub use switchyard_worker::config::CandleConfig;

/// The engine.
pub struct CandleEngine {
    model: Model,
    config: CandleConfig,
    worker: WorkerKey,
    cache: PrefixCache,
    waiting: VecDeque<Sequence>,
    running: Vec<Sequence>,
    next_event: u64,
    vocab: usize,
    /// Seconds a step takes per token it computes (a moving average), to size prompt chunks
    /// so a step stays within `step_target`.
    per_token: Option<f64>,
    /// The timing profile given, and the step's token budget it sets (replacing the
    /// running measurement, so the same work is chunked the same way every time, as the
    /// mocker replaying the profile chunks it).
    timing: Option<(PerfModel, u32)>,
    /// Media projectors by encoder width (see [`Model::media_projector`]).
    projectors: HashMap<usize, Tensor>,
    /// Constraints compiled over the model's vocabulary, when it has one `llguidance`
    /// reads (see [`Self::with_grammars`]).
    grammars: Option<Arc<Grammars>>,
}

impl std::fmt::Debug for CandleEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CandleEngine")
            .field("model", &self.model)
            .field("waiting", &self.waiting.len())
            .field("running", &self.running.len())
            .field("cached_blocks", &self.cache.blocks.len())
            .finish()
    }
}

impl CandleEngine {
    pub fn new(model: Model, config: CandleConfig, worker: WorkerKey) -> Self {
        let block_bytes = model.shape.kv_bytes_per_token() * config.block_size as usize;
        let budget_blocks = (config.cache_mib as usize * 1024 * 1024) / block_bytes.max(1);
        let vocab = model.shape.vocab;
        CandleEngine {
            model,
            cache: PrefixCache {
                blocks: LinkedHashMap::new(),
                budget_blocks,
            },
            config,
            worker,
            waiting: VecDeque::new(),
            running: Vec::new(),
            next_event: 0,
            vocab,
            per_token: None,
            timing: None,
            projectors: HashMap::new(),
            grammars: None,
        }
    }

    /// Enforces constraints (structured output) over the model's vocabulary: each step's
    /// logits are masked to what a request's constraint allows. No steering: an answer cut
    /// by its budget ends with `length`, never as a complete one.
    pub fn with_grammars(mut self, grammars: Arc<Grammars>) -> Self {
        self.grammars = Some(grammars);
        self
    }

    /// The name of the vocabulary it enforces constraints over, if it does.
    pub fn vocabulary(&self) -> Option<&str> {
        self.grammars.as_deref().map(Grammars::vocabulary)
    }

    /// The request's guide under its constraint, past the output a resumed request already
    /// generated; none without a constraint.
    fn guide(&self, request: &GenerateRequest) -> Result<Option<Box<Guide>>, EngineError> {
        let Some(constraint) = &request.sampling.constraint else {
            return Ok(None);
        };
        let Some(grammars) = self
            .grammars
            .as_ref()
            .filter(|g| request.sampling.vocabulary.as_deref() == Some(g.vocabulary()))
        else {
            return Err(EngineError::Unsupported(
                "this engine enforces constraints over its model's vocabulary only".into(),
            ));
        };
        let refused =
            |e: GrammarError| EngineError::Invalid(format!("the request's constraint: {e}"));
        let mut guide = grammars.guide(constraint).map_err(refused)?;
        let ids = &request.prompt.token_ids;
        let generated = (request.generated() as usize).min(ids.len());
        guide.take(&ids[ids.len() - generated..]).map_err(refused)?;
        Ok(Some(Box::new(guide)))
    }

    /// The input embeddings of `request`'s media spans, from the embeddings it carries.
    fn merge_inputs(
        &mut self,
        request: &GenerateRequest,
    ) -> Result<Vec<(usize, Tensor)>, EngineError> {
        let spans = &request.prompt.media;
        if request.media_inputs.len() != spans.len() {
            return Err(EngineError::Invalid(format!(
                "{} media spans and {} media inputs",
                spans.len(),
                request.media_inputs.len()
            )));
        }
        let failed = |e: crate::model::ModelError| EngineError::Internal(e.to_string());
        let mut media = Vec::with_capacity(spans.len());
        for (span, input) in spans.iter().zip(&request.media_inputs) {
            let (_, dim, rows) = input
                .embedding_rows()
                .map_err(|e| EngineError::Invalid(e.to_string()))?;
            let projector = match self.projectors.get(&dim) {
                Some(p) => p.clone(),
                None => {
                    let p = self.model.media_projector(dim).map_err(failed)?;
                    self.projectors.insert(dim, p.clone());
                    p
                }
            };
            let rows = self
                .model
                .media_embeddings(&projector, &rows, dim, span.length as usize)
                .map_err(failed)?;
            media.push((span.offset as usize, rows));
        }
        Ok(media)
    }

    /// Takes a timing profile of this engine: its step budget becomes the most tokens whose
    /// predicted prefill fits `step_target` (at most `max_batched_tokens`).
    pub fn with_timing(mut self, perf: PerfModel) -> Self {
        let tokens = step_tokens(
            &perf,
            self.config.step_target,
            self.config.max_batched_tokens,
        );
        tracing::info!(step_tokens = tokens, "step budget from the timing profile");
        self.timing = Some((perf, tokens));
        self
    }

    /// The timing profile and step budget, when one was given.
    pub fn timing(&self) -> Option<(PerfModel, u32)> {
        self.timing.clone()
    }

    pub fn model(&self) -> &Model {
        &self.model
    }

    /// Blocks the cache holds at most.
    pub fn capacity_blocks(&self) -> u64 {
        self.cache.budget_blocks as u64
    }

    fn event(&mut self, data: KvEventData) -> KvEvent {
        self.next_event += 1;
        KvEvent {
            worker_id: self.worker.worker_id,
            dp_rank: self.worker.dp_rank,
            event_id: self.next_event,
            tier: StorageTier::Device,
            data,
        }
    }

    fn prefill_tokens_left(&self) -> u64 {
        self.running
            .iter()
            .chain(self.waiting.iter())
            .map(|s| s.tokens.len().saturating_sub(s.kv.len()) as u64)
            .sum()
    }
}

/// The most tokens (from 1 to `max`) whose predicted prefill fits `target`; 1 when none
/// does.
pub fn step_tokens(perf: &PerfModel, target: std::time::Duration, max: u32) -> u32 {
    let target_ms = target.as_secs_f64() * 1e3;
    (1..=max.max(1))
        .rev()
        .find(|&t| perf.prefill_ms(t) <= target_ms)
        .unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use switchyard_core::perf::Profile;

    use super::*;

    #[test]
    fn the_step_budget_is_the_most_tokens_that_fit_the_target() {
        // 10 ms plus 2 ms a token.
        let perf = PerfModel::from_profile(Profile {
            prefill_isl: vec![1.0, 1001.0],
            prefill_ttft_ms: vec![12.0, 2012.0],
            decode_active_kv_tokens: vec![1.0, 100.0],
            decode_context_length: vec![1.0, 100.0],
            decode_itl: vec![vec![5.0, 5.0], vec![5.0, 5.0]],
            mixed_step_saving: 0.0,
            prefill_context_ms: 0.0,
        })
        .unwrap();
        assert_eq!(step_tokens(&perf, Duration::from_millis(110), 512), 50);
        assert_eq!(step_tokens(&perf, Duration::from_millis(111), 512), 50);
        assert_eq!(step_tokens(&perf, Duration::from_millis(112), 512), 51);
        // Nothing fits: a token a step still moves.
        assert_eq!(step_tokens(&perf, Duration::from_millis(5), 512), 1);
        // Everything fits: the configured most.
        assert_eq!(step_tokens(&perf, Duration::from_secs(10), 512), 512);
        assert_eq!(step_tokens(&perf, Duration::from_secs(10), 0), 1);
    }
}
