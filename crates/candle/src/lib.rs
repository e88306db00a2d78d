//! An engine that runs a real GGUF model on the CPU with candle.
//!
//! - [`model`]: a Llama-architecture model computed for many sequences per step.
//! - [`engine`]: continuous batching, chunked prefill, the paged prefix cache and its KV
//!   events, sampling: a step engine for the worker's threaded driver.
//!
//! [`CandleWorker`] is the `Engine` a worker hosts: `worker --engine candle --model
//! PATH.gguf` (with the `candle` feature of the `switchyard` binary).

pub mod engine;
pub mod model;

use std::sync::Arc;

use async_trait::async_trait;
use switchyard_core::{WorkerKey, WorkerRole};
use switchyard_worker::driver::{self, EVENT_CAPACITY};
use switchyard_worker::{Engine, EngineCapabilities, RunningEngine, StepService, WorkerError};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use engine::{CandleConfig, CandleEngine};
pub use model::{Gguf, Model, ModelError, ModelShape};

/// A loaded model, ready to be hosted by a worker.
#[derive(Debug)]
pub struct CandleWorker {
    engine: CandleEngine,
    config: CandleConfig,
    /// The vocabulary it enforces constraints over, by name (none: it enforces none).
    vocabularies: Vec<String>,
}

/// Constraints over the model's vocabulary (its GGUF tokenizer's tokens, its end of
/// sequence), or why they cannot be.
pub fn grammars(gguf: &Gguf) -> Result<Arc<switchyard_grammar::Grammars>, String> {
    let files = gguf.tokenizer_files().map_err(|e| e.to_string())?;
    let eos = gguf
        .eos_token()
        .ok_or("the model names no end-of-sequence token")?;
    let vocabulary = switchyard_grammar::Vocabulary::from_tokenizer_json(&files.tokenizer, eos)?;
    switchyard_grammar::Grammars::new(&vocabulary)
        .map(Arc::new)
        .map_err(|e| e.to_string())
}

impl CandleWorker {
    /// Loads the model the configuration names (a clear error for a missing, truncated or
    /// foreign file).
    pub fn load(config: &CandleConfig, worker: WorkerKey) -> Result<CandleWorker, ModelError> {
        config.validate().map_err(|source| ModelError::Settings {
            path: config.model.display().to_string(),
            source,
        })?;
        // A bad profile fails before the model takes seconds to load.
        let perf = match &config.perf_profile {
            Some(path) => Some(switchyard_mocker::perf::load(path)?),
            None => None,
        };
        let mut gguf = Gguf::open(&config.model)?;
        let model = Model::load(&mut gguf, config.dense_weights)?;
        tracing::info!(model = %config.model.display(), shape = ?model.shape, "model loaded");
        let mut engine = CandleEngine::new(model, config.clone(), worker);
        if let Some(perf) = perf {
            engine = engine.with_timing(perf);
        }
        match grammars(&gguf) {
            Ok(grammars) => engine = engine.with_grammars(grammars),
            Err(why) => {
                tracing::warn!(%why, "the model's vocabulary cannot be read for constraints: this worker enforces none")
            }
        }
        let vocabularies = engine.vocabulary().map(str::to_owned).into_iter().collect();
        Ok(CandleWorker {
            engine,
            config: config.clone(),
            vocabularies,
        })
    }

    pub fn shape(&self) -> ModelShape {
        self.engine.model().shape
    }
}

#[async_trait]
impl Engine for CandleWorker {
    fn capabilities(&self) -> EngineCapabilities {
        EngineCapabilities {
            role: WorkerRole::Aggregated,
            kv_events: true,
            reports_load: true,
            block_size: Some(self.config.block_size),
            capacity_blocks: Some(self.engine.capacity_blocks()),
            max_num_seqs: Some(self.config.max_num_seqs),
            dp_size: 1,
            prompt_text: false,
            media_embeddings: true,
            modalities: switchyard_core::Modalities::default(),
            constraints: if self.vocabularies.is_empty() {
                switchyard_core::protocol::ConstraintKinds::NONE
            } else {
                switchyard_core::protocol::ConstraintKinds::all()
            },
            vocabularies: self.vocabularies.clone(),
            logprobs: true,
            prompt_logprobs: true,
        }
    }

    fn timing(&self) -> Option<(switchyard_core::perf::PerfModel, u32)> {
        self.engine.timing()
    }

    async fn start(
        self: Box<Self>,
        tracker: &TaskTracker,
        cancel: CancellationToken,
    ) -> Result<RunningEngine, WorkerError> {
        let (events_tx, events) = mpsc::channel(EVENT_CAPACITY);
        let (handle, _task) =
            driver::spawn_threaded(self.engine, Some(events_tx), tracker, cancel)?;
        let load = handle.watch_load();
        Ok(RunningEngine {
            service: Arc::new(StepService::new(handle)),
            events: Some(events),
            load: Some(load),
        })
    }
}
