//! The engine seam: what the worker host needs from an engine, whatever it is.
//!
//! An engine says what it can do ([`EngineCapabilities`]: its role, whether it publishes KV
//! events and load, its block size and capacity when it has them) and, once started, hands
//! the host a [`RunningEngine`]: the service that answers generate requests, and the
//! streams of KV events and load reports, when it has them. The host registers the worker
//! from the capabilities (a worker without events gets the approximate cache view), serves
//! the service on a request plane, and publishes the streams.
//!
//! Engines that work in steps (the mocker; a model computed on the CPU) run on the
//! [`crate::driver`] and are served by [`StepService`]; engines that are themselves
//! services (the echo engine; a remote OpenAI-compatible server) implement
//! [`EngineService`] directly.

use std::sync::Arc;

use async_trait::async_trait;
use futures::StreamExt;
use switchyard_core::protocol::{ConstraintKinds, EngineError, GenerateOutput, GenerateRequest};
use switchyard_core::{KvEvent, LoadSnapshot, Modalities, RequestId, SequenceHash, WorkerRole};
use switchyard_runtime::{EngineService, ResponseStream};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::driver::{DriverHandle, TokenStream};
use crate::error::WorkerError;

/// What an engine can do, as announced in discovery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineCapabilities {
    pub role: WorkerRole,
    /// It publishes KV events (else the router assumes what it routed there is cached).
    pub kv_events: bool,
    /// It reports its load (else the router relies on its own count of requests).
    pub reports_load: bool,
    /// Tokens per KV block, when its cache is visible in blocks.
    pub block_size: Option<u32>,
    pub capacity_blocks: Option<u64>,
    pub max_num_seqs: Option<u32>,
    /// Data-parallel ranks.
    pub dp_size: u32,
    /// It takes the prompt as text (an OpenAI-compatible upstream): frontends send it
    /// rendered along with the tokens.
    pub prompt_text: bool,
    /// It merges media embeddings into the sequences it prefills: requests with media must
    /// carry them (`media_inputs`).
    pub media_embeddings: bool,
    /// What it encodes, for an encoder (every modality unless it says).
    pub modalities: Modalities,
    /// The constraint kinds it enforces (structured output).
    pub constraints: ConstraintKinds,
    /// The vocabularies of the token ids it enforces them over; none for an engine that
    /// takes text.
    pub vocabularies: Vec<String>,
    /// It reports log probabilities when a request asks ([`SamplingParams::logprobs`]: the
    /// generated token's and up to 20 alternatives').
    ///
    /// [`SamplingParams::logprobs`]: switchyard_core::protocol::SamplingParams::logprobs
    pub logprobs: bool,
    /// It reports a prompt's log probabilities too ([`SamplingParams::prompt_logprobs`]).
    ///
    /// [`SamplingParams::prompt_logprobs`]: switchyard_core::protocol::SamplingParams::prompt_logprobs
    pub prompt_logprobs: bool,
}

/// A started engine, as the host uses it.
#[derive(Debug)]
pub struct RunningEngine {
    pub service: Arc<dyn EngineService>,
    /// KV event batches, in order (engines with `kv_events`).
    pub events: Option<mpsc::Receiver<Vec<KvEvent>>>,
    /// The load after each step (engines with `reports_load`).
    pub load: Option<watch::Receiver<LoadSnapshot>>,
}

/// An engine a worker can host.
#[async_trait]
pub trait Engine: Send + std::fmt::Debug {
    fn capabilities(&self) -> EngineCapabilities;

    /// Its timing model and step budget in tokens, announced so routers can predict
    /// latency; none for engines that do not know theirs.
    fn timing(&self) -> Option<(switchyard_core::perf::PerfModel, u32)> {
        None
    }

    /// How long moving the KV of `tokens` tokens to this worker takes, for engines that
    /// serve disaggregated requests (prefill-only, and decode from KV computed elsewhere);
    /// none for engines that cannot.
    fn kv_transfer_time(&self, tokens: u32) -> Option<std::time::Duration> {
        let _ = tokens;
        None
    }

    /// The factor on its step times, for engines that can be slowed down (fault
    /// injection's `slow`).
    fn pace(&self) -> Option<crate::faults::Pace> {
        None
    }

    /// Starts the engine; its tasks run on `tracker` until `cancel`.
    async fn start(
        self: Box<Self>,
        tracker: &TaskTracker,
        cancel: CancellationToken,
    ) -> Result<RunningEngine, WorkerError>;
}

/// Serves requests on an engine running on the step driver: each token becomes a `Tokens`
/// item, the last one followed by `Finished`. Dropping the response stream cancels the
/// request in the engine.
#[derive(Debug, Clone)]
pub struct StepService {
    engine: DriverHandle,
}

impl StepService {
    pub fn new(engine: DriverHandle) -> Self {
        StepService { engine }
    }
}

/// Where a response stream is: emitting tokens, or done (after one `Finished`).
enum State {
    Streaming { tokens: TokenStream, sent: u32 },
    Done,
}

#[async_trait]
impl EngineService for StepService {
    async fn held_blocks(&self, blocks: &[SequenceHash]) -> Result<u32, EngineError> {
        self.engine.held_prefix(blocks.to_vec()).await
    }

    async fn media_ready(&self, id: RequestId) -> Result<bool, EngineError> {
        self.engine.media_ready(id).await
    }

    async fn generate(&self, request: GenerateRequest) -> Result<ResponseStream, EngineError> {
        let tokens = self.engine.submit(request).await?;
        let stream =
            futures::stream::unfold(State::Streaming { tokens, sent: 0 }, |state| async move {
                let State::Streaming { mut tokens, sent } = state else {
                    return None;
                };
                match tokens.recv().await {
                    Some(t) => {
                        // The prompt's log probabilities go before its first token.
                        let prompt = t.prompt_logprobs.map(|logprobs| {
                            Ok(GenerateOutput::PromptLogprobs {
                                logprobs: *logprobs,
                            })
                        });
                        let item = GenerateOutput::Tokens {
                            token_ids: vec![t.token],
                            cached_tokens: (sent == 0).then_some(t.cached_tokens),
                            logprobs: t.logprobs.map(|l| *l).into_iter().collect(),
                        };
                        let sent = sent + 1;
                        let items = prompt.into_iter().chain([Ok(item)]);
                        match t.finish {
                            None => Some((items.collect(), State::Streaming { tokens, sent })),
                            Some(reason) => Some((
                                items
                                    .chain([Ok(GenerateOutput::Finished {
                                        reason,
                                        completion_tokens: sent,
                                        cached_tokens: None,
                                    })])
                                    .collect(),
                                State::Done,
                            )),
                        }
                    }
                    // The engine stopped without finishing the request.
                    None => Some((vec![Err(EngineError::Stopping)], State::Done)),
                }
            })
            .flat_map(futures::stream::iter);
        Ok(stream.boxed())
    }
}
