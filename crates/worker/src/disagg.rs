//! A worker's side of disaggregated serving, around its engine's service:
//!
//! - a **prefill-only** request runs on the engine for its first token; the answer is one
//!   [`GenerateOutput::PrefillDone`]: that token and a [`KvHandle`] naming this worker and
//!   the prompt's blocks, which stay in its cache for the decode worker to pull;
//! - a **decode** request starts from KV computed elsewhere: the worker asks its own cache
//!   which of the handle's blocks it already holds, asks the source whether it still holds
//!   them all (over the request plane, [`RequestPlane::held_blocks`]), moves the rest
//!   (timed by the engine's transfer model: bytes per token over the link), checks the
//!   source once more (a source lost mid-transfer loses the copy), then hands the request
//!   to the engine, which computes only the tokens after the transferred ones.
//!
//! A source that is gone, or no longer holds the blocks, makes the decode request fail as
//! [`EngineError::KvLost`]: not this worker's fault, and the frontend prefills the request
//! again. (The source keeps the blocks as cached, not pinned: under memory pressure it may
//! evict them before they are pulled, with the same outcome.)

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use switchyard_core::protocol::{EngineError, GenerateOutput, GenerateRequest, KvHandle, Phase};
use switchyard_core::{SequenceHash, WorkerKey, blocks_for};
use switchyard_runtime::{EngineService, RequestPlane, ResponseStream, WorkerInstance};

/// How long moving the KV of some tokens takes: a fixed latency plus a time per token.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TransferTiming {
    pub latency: Duration,
    pub per_million_tokens: Duration,
}

impl TransferTiming {
    /// From an engine's [`crate::Engine::kv_transfer_time`], if it has one.
    pub fn of(engine: &dyn crate::Engine) -> Option<Self> {
        let latency = engine.kv_transfer_time(0)?;
        let million = engine.kv_transfer_time(1_000_000)?;
        Some(TransferTiming {
            latency,
            per_million_tokens: million.saturating_sub(latency),
        })
    }

    pub fn time(&self, tokens: u32) -> Duration {
        let seconds = self.per_million_tokens.as_secs_f64() * f64::from(tokens) / 1e6;
        self.latency
            .saturating_add(Duration::try_from_secs_f64(seconds).unwrap_or(Duration::MAX))
    }
}

/// An engine service that serves prefill-only and decode requests (see the module docs).
#[derive(Debug)]
pub struct DisaggService {
    inner: Arc<dyn EngineService>,
    worker: WorkerKey,
    block_size: u32,
    /// Reaches the prefill workers a decode request pulls from.
    peers: Arc<dyn RequestPlane>,
    timing: TransferTiming,
}

impl DisaggService {
    pub fn new(
        inner: Arc<dyn EngineService>,
        worker: WorkerKey,
        block_size: u32,
        peers: Arc<dyn RequestPlane>,
        timing: TransferTiming,
    ) -> Self {
        DisaggService {
            inner,
            worker,
            block_size,
            peers,
            timing,
        }
    }

    async fn prefill(&self, request: GenerateRequest) -> Result<ResponseStream, EngineError> {
        let blocks = blocks_for(&request.prompt, self.block_size)
            .map_err(|e| EngineError::Invalid(e.to_string()))?;
        let handle = KvHandle {
            source: WorkerKey {
                worker_id: self.worker.worker_id,
                dp_rank: request.dp_rank,
            },
            request: request.id,
            blocks: blocks.sequence_hashes().to_vec(),
            tokens: request.prompt.len() as u32,
            address: None,
        };
        let mut stream = self.inner.generate(request).await?;
        let answer = async move {
            let mut prompt = None;
            while let Some(item) = stream.next().await {
                match item? {
                    // The prompt's log probabilities, asked: they go first.
                    GenerateOutput::PromptLogprobs { logprobs } => prompt = Some(logprobs),
                    GenerateOutput::Tokens {
                        token_ids,
                        cached_tokens,
                        logprobs,
                    } => {
                        if let Some(&first_token) = token_ids.first() {
                            let done = GenerateOutput::PrefillDone {
                                first_token,
                                kv: handle,
                                cached_tokens: cached_tokens.unwrap_or(0),
                                logprobs: logprobs.into_iter().next(),
                            };
                            let prompt = prompt
                                .take()
                                .map(|logprobs| Ok(GenerateOutput::PromptLogprobs { logprobs }));
                            return Ok(prompt.into_iter().chain([Ok(done)]).collect::<Vec<_>>());
                        }
                    }
                    GenerateOutput::Finished { .. } => break,
                    other => {
                        return Err(EngineError::Internal(format!(
                            "the engine answered a prefill with {other:?}"
                        )));
                    }
                }
            }
            Err(EngineError::Disconnected)
        };
        Ok(futures::stream::once(answer)
            .flat_map(|items| match items {
                Ok(items) => futures::stream::iter(items),
                Err(e) => futures::stream::iter(vec![Err(e)]),
            })
            .boxed())
    }

    /// Pulls what this worker lacks of the request's KV from its source.
    async fn pull(&self, kv: &KvHandle) -> Result<(), EngineError> {
        let held_here = self.inner.held_blocks(&kv.blocks).await.unwrap_or(0);
        let held_tokens = (held_here * self.block_size).min(kv.tokens);
        let missing = kv.tokens - held_tokens;
        if missing == 0 {
            return Ok(());
        }
        let source = WorkerInstance {
            address: kv.address.clone(),
            ..WorkerInstance::new(kv.source.worker_id, "")
        };
        self.source_holds(&source, &kv.blocks).await?;
        tokio::time::sleep(self.timing.time(missing)).await;
        // The copy is whole only if the source lasted until its end.
        self.source_holds(&source, &kv.blocks).await
    }

    async fn source_holds(
        &self,
        source: &WorkerInstance,
        blocks: &[SequenceHash],
    ) -> Result<(), EngineError> {
        let held = self
            .peers
            .held_blocks(source, blocks.to_vec())
            .await
            .map_err(|e| {
                EngineError::KvLost(format!(
                    "cannot pull it from worker {}: {e}",
                    source.worker_id
                ))
            })?;
        if (held as usize) < blocks.len() {
            return Err(EngineError::KvLost(format!(
                "worker {} no longer holds the request's KV ({held} of {} blocks)",
                source.worker_id,
                blocks.len()
            )));
        }
        Ok(())
    }
}

#[async_trait]
impl EngineService for DisaggService {
    async fn held_blocks(&self, blocks: &[SequenceHash]) -> Result<u32, EngineError> {
        self.inner.held_blocks(blocks).await
    }

    async fn media_ready(&self, id: switchyard_core::RequestId) -> Result<bool, EngineError> {
        self.inner.media_ready(id).await
    }

    async fn generate(&self, request: GenerateRequest) -> Result<ResponseStream, EngineError> {
        match &request.phase {
            Phase::Aggregated | Phase::Encode => self.inner.generate(request).await,
            Phase::PrefillOnly => self.prefill(request).await,
            Phase::Decode { kv } => {
                self.pull(kv).await?;
                self.inner.generate(request).await
            }
        }
    }
}
