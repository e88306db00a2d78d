//! The mocker as a hosted engine: a [`MockEngine`] on the timed step driver.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use switchyard_core::protocol::{EngineError, GenerateRequest, Phase, TokenOutput};
use switchyard_core::{
    KvEvent, LoadSnapshot, RequestId, SequenceHash, WorkerKey, WorkerRole, blocks_for,
};
use switchyard_grammar::{GrammarError, Grammars, Guide};
use switchyard_mocker::tokens::TokenRules;
use switchyard_mocker::{MockEngine, MockRequest, PerfModel, Rejected, StepOutput};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{KvTransferConfig, MockerConfig};
use crate::driver::{self, EVENT_CAPACITY, StepEngine};
use crate::engine::{Engine, EngineCapabilities, RunningEngine, StepService};
use crate::error::WorkerError;
use crate::faults::Pace;

/// The mocker, configured and not yet started.
#[derive(Debug)]
pub struct Mocker {
    engine: MockEngine,
    pace: Pace,
    transfer: KvTransferConfig,
    /// The grammars of its tokenizer's vocabulary, when it was given one.
    grammars: Option<Arc<Grammars>>,
}

impl Mocker {
    /// A mocker publishing events as `worker`. Every worker of a fleet draws tokens from the
    /// same seed, so any of them continues a stream another started.
    pub fn new(worker: WorkerKey, config: &MockerConfig) -> Result<Self, WorkerError> {
        let perf = match &config.perf_profile {
            Some(path) => switchyard_mocker::perf::load(path)?,
            None => PerfModel::Polynomial,
        };
        config.kv_transfer.validate()?;
        let grammars = match &config.tokenizer {
            Some(dir) => Some(tokenizer_grammars(dir)?),
            None => None,
        };
        Ok(Mocker {
            engine: MockEngine::new(worker, config.args, perf, config.seed)?,
            pace: Pace::default(),
            transfer: config.kv_transfer,
            grammars,
        })
    }
}

#[async_trait]
impl Engine for Mocker {
    fn capabilities(&self) -> EngineCapabilities {
        let args = self.engine.args();
        EngineCapabilities {
            role: WorkerRole::Aggregated,
            kv_events: args.enable_prefix_caching,
            reports_load: true,
            block_size: Some(args.block_size),
            capacity_blocks: Some(u64::from(args.num_gpu_blocks)),
            max_num_seqs: Some(args.max_num_seqs),
            dp_size: 1,
            prompt_text: false,
            media_embeddings: false,
            modalities: switchyard_core::Modalities::default(),
            // It knows what the built-in vocabularies' tokens spell, and its tokenizer's.
            constraints: switchyard_core::protocol::ConstraintKinds::all(),
            vocabularies: Grammars::BUILT_IN
                .iter()
                .map(|&name| name.to_owned())
                .chain(self.grammars.iter().map(|g| g.vocabulary().to_owned()))
                .collect(),
            // Its exact distribution (`switchyard_mocker::logprobs`).
            logprobs: true,
            prompt_logprobs: true,
        }
    }

    fn timing(&self) -> Option<(switchyard_core::perf::PerfModel, u32)> {
        let args = self.engine.args();
        Some((self.engine.perf().clone(), args.max_num_batched_tokens))
    }

    fn pace(&self) -> Option<Pace> {
        Some(self.pace.clone())
    }

    fn kv_transfer_time(&self, tokens: u32) -> Option<Duration> {
        let model = self.transfer.time(tokens).as_secs_f64();
        let real = model / self.engine.args().speedup_ratio;
        Some(Duration::try_from_secs_f64(real).unwrap_or(Duration::MAX))
    }

    async fn start(
        self: Box<Self>,
        tracker: &TaskTracker,
        cancel: CancellationToken,
    ) -> Result<RunningEngine, WorkerError> {
        let (events_tx, events) = mpsc::channel(EVENT_CAPACITY);
        let mut stepped = SteppedMocker::new(self.engine);
        stepped.pace = Some(self.pace);
        stepped.grammars = self.grammars;
        let (handle, _task) = driver::spawn_timed(stepped, Some(events_tx), tracker, cancel);
        let load = handle.watch_load();
        Ok(RunningEngine {
            service: Arc::new(StepService::new(handle)),
            events: Some(events),
            load: Some(load),
        })
    }
}

/// The mocker as a step engine, for either driver. On the threaded driver it steps as fast
/// as it can (its modelled step times are not waited out): the path a CPU engine takes.
#[derive(Debug)]
pub struct SteppedMocker {
    engine: MockEngine,
    out: StepOutput,
    /// Slows its steps down (fault injection).
    pace: Option<Pace>,
    /// The grammars of its tokenizer's vocabulary, besides the built-in ones.
    grammars: Option<Arc<Grammars>>,
    /// Its last step did nothing: every request it has waits on its media. It has no work
    /// until something changes (a request comes or goes, media arrive).
    stalled: bool,
}

impl SteppedMocker {
    pub fn new(engine: MockEngine) -> Self {
        SteppedMocker {
            engine,
            out: StepOutput::default(),
            pace: None,
            grammars: None,
            stalled: false,
        }
    }
}

/// How a mocker refusal reads on the request plane.
fn engine_error(rejected: Rejected) -> EngineError {
    rejected.engine_error()
}

impl StepEngine for SteppedMocker {
    fn add(&mut self, request: GenerateRequest) -> Result<(), EngineError> {
        let prompt = blocks_for(&request.prompt, self.engine.args().block_size)
            .map_err(|e| EngineError::Invalid(e.to_string()))?;
        let (max_output_tokens, imported_tokens) = match &request.phase {
            Phase::Aggregated => (request.max_tokens, 0),
            Phase::Encode => {
                return Err(EngineError::Unsupported(
                    "an LLM worker does not encode media; send it to an encoder worker".into(),
                ));
            }
            // The prompt, for its first token only; the blocks stay cached for the decode
            // worker to pull.
            Phase::PrefillOnly => (1, 0),
            // The KV of the first `kv.tokens` tokens came over (pulled before the request
            // reached the engine): only what follows is computed.
            Phase::Decode { kv } => {
                if kv.tokens as usize >= request.prompt.len() {
                    return Err(EngineError::Invalid(format!(
                        "the transferred KV covers {} tokens but the prompt has {}: nothing to decode from",
                        kv.tokens,
                        request.prompt.len()
                    )));
                }
                (request.max_tokens, kv.tokens)
            }
        };
        let rules = TokenRules::of(&request.sampling);
        // Penalties count the output so far, part of which a resumed request carries at
        // the end of its prompt.
        let earlier_output = if rules.reshapes() {
            let ids = &request.prompt.token_ids;
            ids[ids.len().saturating_sub(request.generated() as usize)..].to_vec()
        } else {
            Vec::new()
        };
        let guide = guide(&request, self.grammars.as_ref())?;
        // Never for a resumed request: its prompt's went out with its first token.
        let prompt_logprobs = request
            .sampling
            .prompt_logprobs
            .filter(|_| request.generated() == 0)
            .map(|n| (n, request.prompt.token_ids.clone()));
        let mock = MockRequest {
            id: request.id,
            prompt,
            max_output_tokens,
            generated: request.generated(),
            stream_key: request.stream_key(),
            rules,
            earlier_output,
            stop_token_ids: request.sampling.stop_token_ids,
            imported_tokens,
            // Sent ahead of its media: its prefill stops at the first of them until they
            // are ready.
            media_gate: request
                .media_pending
                .then(|| request.prompt.media.iter().map(|m| m.offset).min())
                .flatten(),
            // Staged before its prefill reaches them, unless their KV came over.
            media: (imported_tokens == 0)
                .then(|| switchyard_core::MediaSpan::extent(&request.prompt.media))
                .flatten(),
            guide,
            logprobs: request.sampling.logprobs,
            prompt_logprobs,
        };
        self.stalled = false;
        self.engine.add_request(mock).map_err(engine_error)
    }

    fn cancel(&mut self, id: RequestId) -> bool {
        self.stalled = false;
        self.engine.cancel(id)
    }

    fn has_work(&self) -> bool {
        self.engine.has_work() && !self.stalled
    }

    fn media_ready(&mut self, id: RequestId) -> bool {
        let held = self.engine.media_ready(id);
        self.stalled &= !held;
        held
    }

    fn step(
        &mut self,
        now: Duration,
        tokens: &mut Vec<TokenOutput>,
        events: &mut Vec<KvEvent>,
    ) -> Duration {
        self.engine.step(now, &mut self.out);
        self.stalled = self.out.shape.prefill_tokens == 0
            && self.out.shape.decode_seqs == 0
            && self.engine.waiting_on_media();
        tokens.append(&mut self.out.tokens);
        events.append(&mut self.out.events);
        match &self.pace {
            Some(pace) => self.out.duration.mul_f64(pace.factor()),
            None => self.out.duration,
        }
    }

    fn load(&self) -> LoadSnapshot {
        self.engine.load()
    }

    fn held_prefix(&self, blocks: &[SequenceHash]) -> u32 {
        self.engine.block_manager().cached_prefix(blocks) as u32
    }
}

/// The grammars of the vocabulary of the model directory `dir`.
fn tokenizer_grammars(dir: &std::path::Path) -> Result<Arc<Grammars>, WorkerError> {
    let vocabulary = switchyard_grammar::Vocabulary::from_model_dir(dir)
        .map_err(|e| WorkerError::Start(format!("workers.mocker.tokenizer: {e}")))?;
    Grammars::new(&vocabulary)
        .map(Arc::new)
        .map_err(|e| WorkerError::Start(format!("workers.mocker.tokenizer: {e}")))
}

/// The request's constraint, compiled over its vocabulary (a built-in one, or `own`, its
/// tokenizer's; once per distinct constraint), past the output a resumed request already
/// generated.
fn guide(
    request: &GenerateRequest,
    own: Option<&Arc<Grammars>>,
) -> Result<Option<Box<Guide>>, EngineError> {
    let Some(constraint) = &request.sampling.constraint else {
        return Ok(None);
    };
    let refused = |error: GrammarError| match error {
        GrammarError::Invalid(message) | GrammarError::Rejected(message) => {
            EngineError::Invalid(format!("the request's constraint: {message}"))
        }
        GrammarError::Internal(message) => EngineError::Internal(message),
    };
    let vocabulary = request.sampling.vocabulary.as_deref().unwrap_or_default();
    let grammars = match own.filter(|g| g.vocabulary() == vocabulary) {
        Some(grammars) => Arc::clone(grammars),
        None => match Grammars::named(vocabulary) {
            Some(grammars) => grammars.map_err(refused)?,
            None => {
                return Err(EngineError::Unsupported(format!(
                    "this worker enforces constraints over the built-in vocabularies and its tokenizer's only, not `{vocabulary}`"
                )));
            }
        },
    };
    let mut guide = grammars.guide(constraint).map_err(refused)?;
    let ids = &request.prompt.token_ids;
    let generated = (request.generated() as usize).min(ids.len());
    guide.take(&ids[ids.len() - generated..]).map_err(refused)?;
    Ok(Some(Box::new(guide)))
}
