//! The mocker engine as a request-plane service.

use async_trait::async_trait;
use futures::StreamExt;
use switchyard_core::protocol::{FinishReason, GenerateOutput, GenerateRequest};
use switchyard_core::{HashSeed, TokenBlocks};
use switchyard_mocker::MockRequest;
use switchyard_mocker::driver::{EngineHandle, SubmitError};
use switchyard_runtime::{EngineService, RequestPlaneError, ResponseStream};

/// Serves requests on a mocker engine running on the real-time driver.
#[derive(Debug, Clone)]
pub struct MockerService {
    engine: EngineHandle,
    block_size: u32,
}

impl MockerService {
    pub fn new(engine: EngineHandle, block_size: u32) -> Self {
        MockerService { engine, block_size }
    }
}

/// Where a response stream is: emitting tokens, or done (after one `Finished`).
enum State {
    Streaming {
        tokens: tokio::sync::mpsc::UnboundedReceiver<switchyard_mocker::TokenOutput>,
        sent: u32,
    },
    Done,
}

#[async_trait]
impl EngineService for MockerService {
    async fn generate(
        &self,
        request: GenerateRequest,
    ) -> Result<ResponseStream, RequestPlaneError> {
        let prompt = TokenBlocks::new(&request.token_ids, self.block_size, HashSeed::default())
            .map_err(|e| RequestPlaneError::Rejected(e.to_string()))?;
        let mock = MockRequest {
            id: request.id,
            prompt,
            max_output_tokens: request.max_tokens,
        };
        let tokens = self.engine.submit(mock).await.map_err(|e| match e {
            SubmitError::Rejected(r) => RequestPlaneError::Rejected(r.to_string()),
            SubmitError::Stopped(s) => RequestPlaneError::Unavailable(s.to_string()),
        })?;
        let stops = request.sampling.stop_token_ids;
        // Each engine token becomes a Tokens item; the last one (by length or stop token)
        // is followed by Finished. Dropping the stream drops the receiver, which cancels
        // the request in the engine.
        let stream = futures::stream::unfold(State::Streaming { tokens, sent: 0 }, move |state| {
            let stops = stops.clone();
            async move {
                let State::Streaming { mut tokens, sent } = state else {
                    return None;
                };
                match tokens.recv().await {
                    Some(t) => {
                        let item = GenerateOutput::Tokens {
                            token_ids: vec![t.token],
                            cached_tokens: (t.index == 0).then_some(t.cached_tokens),
                        };
                        let sent = sent + 1;
                        let reason = if stops.contains(&t.token) {
                            Some(FinishReason::Stop)
                        } else if t.finished {
                            Some(FinishReason::Length)
                        } else {
                            None
                        };
                        match reason {
                            None => Some((vec![Ok(item)], State::Streaming { tokens, sent })),
                            Some(reason) => Some((
                                vec![
                                    Ok(item),
                                    Ok(GenerateOutput::Finished {
                                        reason,
                                        completion_tokens: sent,
                                    }),
                                ],
                                State::Done,
                            )),
                        }
                    }
                    // The engine went away without finishing the request.
                    None => Some((vec![Err(RequestPlaneError::Disconnected)], State::Done)),
                }
            }
        })
        .flat_map(futures::stream::iter);
        Ok(stream.boxed())
    }
}
