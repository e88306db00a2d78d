//! The echo engine: streams the prompt's tokens back (cycling when asked for more), with
//! optional delays. With no delays it answers at once, which isolates the cost of
//! everything around the engine.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use switchyard_core::WorkerRole;
use switchyard_core::protocol::{EngineError, FinishReason, GenerateOutput, GenerateRequest};
use switchyard_runtime::{EngineService, ResponseStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::EchoConfig;
use crate::engine::{Engine, EngineCapabilities, RunningEngine};
use crate::error::WorkerError;

/// The echo engine: no cache, no events, no load reports, no limits.
#[derive(Debug, Clone)]
pub struct Echo {
    config: EchoConfig,
}

impl Echo {
    pub fn new(config: EchoConfig) -> Self {
        Echo { config }
    }
}

#[async_trait]
impl Engine for Echo {
    fn capabilities(&self) -> EngineCapabilities {
        EngineCapabilities {
            role: WorkerRole::Aggregated,
            kv_events: false,
            reports_load: false,
            block_size: Some(self.config.block_size.max(1)),
            capacity_blocks: None,
            max_num_seqs: None,
            dp_size: 1,
            prompt_text: false,
            media_embeddings: false,
            modalities: switchyard_core::Modalities::default(),
            constraints: switchyard_core::protocol::ConstraintKinds::NONE,
            vocabularies: Vec::new(),
            logprobs: false,
            prompt_logprobs: false,
        }
    }

    async fn start(
        self: Box<Self>,
        _tracker: &TaskTracker,
        _cancel: CancellationToken,
    ) -> Result<RunningEngine, WorkerError> {
        Ok(RunningEngine {
            service: Arc::new(EchoService::new(self.config)),
            events: None,
            load: None,
        })
    }
}

#[derive(Debug, Clone)]
pub struct EchoService {
    config: EchoConfig,
}

impl EchoService {
    pub fn new(config: EchoConfig) -> Self {
        EchoService { config }
    }
}

#[async_trait]
impl EngineService for EchoService {
    async fn generate(&self, request: GenerateRequest) -> Result<ResponseStream, EngineError> {
        if request.prompt.is_empty() {
            return Err(EngineError::Invalid("the prompt is empty".into()));
        }
        let tokens: Vec<u32> = request
            .prompt
            .token_ids
            .iter()
            .copied()
            .cycle()
            .take(request.max_tokens as usize)
            .collect();
        let stops = request.sampling.stop_token_ids;
        let end = tokens
            .iter()
            .position(|t| stops.contains(t))
            .map_or(tokens.len(), |i| i + 1);
        let reason = if tokens[..end].last().is_some_and(|t| stops.contains(t)) {
            FinishReason::Stop
        } else {
            FinishReason::Length
        };
        let items: Vec<_> = tokens[..end]
            .iter()
            .enumerate()
            .map(|(i, &t)| {
                Ok(GenerateOutput::Tokens {
                    token_ids: vec![t],
                    cached_tokens: (i == 0).then_some(0),
                    logprobs: Vec::new(),
                })
            })
            .chain(std::iter::once(Ok(GenerateOutput::Finished {
                reason,
                completion_tokens: end as u32,
                cached_tokens: None,
            })))
            .collect();
        let (first, every) = (self.config.first_token_delay, self.config.token_delay);
        if first.is_zero() && every.is_zero() {
            return Ok(futures::stream::iter(items).boxed());
        }
        let paced = futures::stream::iter(items.into_iter().enumerate()).then(
            move |(i, item)| async move {
                let wait = if i == 0 {
                    first
                } else if matches!(item, Ok(GenerateOutput::Tokens { .. })) {
                    every
                } else {
                    Duration::ZERO
                };
                if !wait.is_zero() {
                    tokio::time::sleep(wait).await;
                }
                item
            },
        );
        Ok(paced.boxed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_core::RequestId;

    fn request(tokens: Vec<u32>, max_tokens: u32, stop: Vec<u32>) -> GenerateRequest {
        let mut request = GenerateRequest::text(RequestId(1), tokens, max_tokens);
        request.sampling.stop_token_ids = stop;
        request
    }

    async fn collect(service: &EchoService, r: GenerateRequest) -> Vec<GenerateOutput> {
        service
            .generate(r)
            .await
            .unwrap()
            .map(|i| i.unwrap())
            .collect()
            .await
    }

    #[tokio::test]
    async fn echoes_and_cycles_up_to_max_tokens() {
        let s = EchoService::new(EchoConfig::default());
        let out = collect(&s, request(vec![5, 6], 5, vec![])).await;
        let tokens: Vec<u32> = out
            .iter()
            .filter_map(|o| match o {
                GenerateOutput::Tokens { token_ids, .. } => Some(token_ids[0]),
                _ => None,
            })
            .collect();
        assert_eq!(tokens, vec![5, 6, 5, 6, 5]);
        assert_eq!(
            out.last(),
            Some(&GenerateOutput::Finished {
                reason: FinishReason::Length,
                completion_tokens: 5,
                cached_tokens: None,
            })
        );
    }

    #[tokio::test]
    async fn stops_at_a_stop_token_and_refuses_empty_prompts() {
        let s = EchoService::new(EchoConfig::default());
        let out = collect(&s, request(vec![1, 2, 3], 10, vec![2])).await;
        assert_eq!(out.len(), 3);
        assert_eq!(
            out.last(),
            Some(&GenerateOutput::Finished {
                reason: FinishReason::Stop,
                completion_tokens: 2,
                cached_tokens: None,
            })
        );
        assert!(s.generate(request(vec![], 3, vec![])).await.is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn delays_pace_the_stream() {
        let config = EchoConfig {
            first_token_delay: Duration::from_millis(50),
            token_delay: Duration::from_millis(10),
            ..EchoConfig::default()
        };
        let s = EchoService::new(config);
        let start = tokio::time::Instant::now();
        let out = collect(&s, request(vec![1, 2, 3, 4], 4, vec![])).await;
        assert_eq!(out.len(), 5);
        assert_eq!(start.elapsed(), Duration::from_millis(80));
    }
}
