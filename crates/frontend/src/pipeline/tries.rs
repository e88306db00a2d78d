//! One try of a request: sent to the worker it was routed to, or first to a prefill
//! worker whose KV its decode worker then pulls. What follows a try that fails is its
//! life's to decide ([`super::dispatch`]).

use std::sync::Arc;

use futures::StreamExt;
use switchyard_core::protocol::{
    EngineError, FinishReason, GenerateOutput, GenerateRequest, KvHandle, Phase, Prompt, Resume,
    TokenLogprobs,
};
use switchyard_core::{Token, WorkerKey};
use switchyard_router::flow::{self, Event, Step, TryFailure};
use switchyard_runtime::{ResponseStream, WorkerInstance};
use tokio::time::Instant;

use super::PipelineShell;
use super::dispatch::{Attempt, RequestRun};
use crate::openai::ApiError;
use crate::routing::Routed;

/// A prefill's answer.
pub(super) struct Prefilled {
    first_token: Token,
    /// Where its KV is.
    kv: KvHandle,
    /// The prompt tokens it found cached.
    cached_tokens: u32,
    /// The first token's log probabilities, and the prompt's, when asked.
    logprobs: Option<TokenLogprobs>,
    prompt: Option<Vec<TokenLogprobs>>,
}

/// What one try came to.
pub(super) enum Tried {
    /// The request is under way on its worker.
    UnderWay(Box<Attempt>),
    /// A worker failed it: its life decides what follows.
    Failed(WorkerKey, TryFailure),
    /// It is routed again at once, no try counted (its prompt changed behind it).
    Again,
}

impl RequestRun {
    /// A try on a (prefill, decode) pair: its prompt computed on the prefill worker, then
    /// its stream from the decode worker, which pulls the KV (its media are encoded by
    /// now: its life had it wait for them).
    pub(super) async fn try_pair(
        &mut self,
        routed: &Routed,
        (prefill_instance, prefill): (WorkerInstance, WorkerKey),
        prompt: Prompt,
    ) -> Result<Tried, ApiError> {
        let frontend = Arc::clone(&self.frontend);
        let worker = routed.decision.worker;
        let generated = self.generated.len() as u32;
        let done = self
            .remote_prefill(&prefill_instance, prefill, &prompt, generated)
            .await;
        let mut prefilled = match done {
            Ok(done) => done,
            Err(failure) => {
                // The prefill worker failed it: that worker is left out, and the pair is
                // chosen afresh.
                frontend.metrics.count_prefill("failed");
                frontend.metrics.count_dispatch(prefill, false);
                tracing::warn!(worker = %prefill.worker_id, ?failure, "the prefill worker failed the request");
                return Ok(Tried::Failed(prefill, failure));
            }
        };
        let handed_over = Event::HandedOver {
            token: prefilled.first_token,
        };
        let ends = match self.life.step(handed_over, &mut PipelineShell(&frontend)) {
            Step::Stream => None,
            Step::Finish(reason) => Some(reason),
            step => return Err(super::dispatch::unexpected(step)),
        };
        frontend.metrics.count_prefill("remote");
        frontend.metrics.count_dispatch(prefill, true);
        frontend.metrics.count_dispatch(worker, true);
        prefilled.kv.address = prefill_instance.address.clone();
        let outage = frontend.routing.outages(worker.worker_id);
        let stream = self.decode_stream(&routed.instance, worker, prompt, prefilled, ends);
        Ok(Tried::UnderWay(Box::new(Attempt {
            worker,
            stream,
            outage,
            progress: frontend.routing.progress(worker.worker_id),
            handoff: true,
            media_on: None,
            prompt_version: self.prompt_version(),
        })))
    }

    /// A try on the worker it was routed to, with a deadline, given up early when the
    /// worker is found unhealthy meanwhile. `version` is the prompt's when it was routed:
    /// one changed since (its media encoded smaller, or dropped) is routed again.
    pub(super) async fn try_worker(
        &mut self,
        routed: &Routed,
        mut prompt: Prompt,
        version: u32,
    ) -> Result<Tried, ApiError> {
        let frontend = Arc::clone(&self.frontend);
        let config = frontend.config.migration;
        let worker = routed.decision.worker;
        let generated = self.generated.len() as u32;
        if routed.instance.prompt_text {
            // Its engine takes text: the prompt as rendered, special tokens included.
            match frontend.preprocessor.render_tokens(&prompt.token_ids) {
                Ok(text) => prompt.text = Some(text),
                Err(e) => {
                    self.life
                        .step(Event::Abandoned, &mut PipelineShell(&frontend));
                    return Err(ApiError::internal(format!(
                        "Cannot render the prompt as text: {e}"
                    )));
                }
            }
        }
        let media_pending = match self.media_pending() {
            Ok(pending) => pending == Some(true),
            Err(e) => {
                self.life
                    .step(Event::Abandoned, &mut PipelineShell(&frontend));
                return Err(e);
            }
        };
        if self.prompt_version() != version {
            self.life
                .step(Event::PromptChanged, &mut PipelineShell(&frontend));
            return Ok(Tried::Again);
        }
        // A worker that merges the media's embeddings gets them (once they are there).
        let media_inputs = if routed.instance.media_embeddings && !media_pending {
            self.media_inputs(&prompt)
        } else {
            Vec::new()
        };
        let ahead_of_media = media_pending
            .then(|| flow::media::gate(&prompt.media))
            .flatten()
            .map(|from| (prompt.len() as u64, from));
        let request = GenerateRequest {
            id: self.id,
            prompt,
            max_tokens: self.life.tokens_left().max(1),
            sampling: self.sampling.clone(),
            dp_rank: worker.dp_rank,
            resume: (generated > 0).then_some(Resume { generated }),
            phase: Phase::Aggregated,
            media_inputs,
            media_pending,
        };
        // Subscribe before sending: an outage during the call is not missed.
        let mut outage = frontend.routing.outages(worker.worker_id);
        // The worker's span of the request is a child of this one.
        let dispatch_span = tracing::info_span!(
            parent: &self.span,
            "dispatch",
            worker = %worker.worker_id,
            resumed_after = generated,
        );
        let sent = tokio::select! {
            sent = tokio::time::timeout(
                config.dispatch_timeout,
                tracing::Instrument::instrument(
                    frontend.requests.generate(&routed.instance, request),
                    dispatch_span,
                ),
            ) => match sent {
                Ok(Ok(stream)) => Ok(stream),
                Ok(Err(error)) => Err(TryFailure::Refused(error)),
                // Nothing answered in time: gone, or too busy to take a request.
                Err(_) => Err(TryFailure::TimedOut(config.dispatch_timeout)),
            },
            // The worker was found unhealthy meanwhile: do not wait on it (whoever found
            // it counted the failure).
            Ok(()) = outage.changed() => Err(TryFailure::FoundUnhealthy),
        };
        let stream = match sent {
            Ok(stream) => stream,
            Err(failure) => {
                frontend.metrics.count_dispatch(worker, false);
                tracing::warn!(worker = %worker.worker_id, ?failure, "cannot dispatch to the worker");
                return Ok(Tried::Failed(worker, failure));
            }
        };
        frontend.metrics.count_dispatch(worker, true);
        let sent = Event::Sent { ahead_of_media };
        self.life.step(sent, &mut PipelineShell(&frontend));
        Ok(Tried::UnderWay(Box::new(Attempt {
            worker,
            stream,
            outage,
            progress: frontend.routing.progress(worker.worker_id),
            handoff: false,
            media_on: media_pending.then(|| routed.instance.clone()),
            prompt_version: version,
        })))
    }

    /// Has the prompt computed on a prefill worker: its first token, the handle to its KV,
    /// and the prompt tokens it found cached; or the error, with how it counts against the
    /// worker.
    async fn remote_prefill(
        &self,
        instance: &WorkerInstance,
        worker: WorkerKey,
        prompt: &Prompt,
        generated: u32,
    ) -> Result<Prefilled, TryFailure> {
        let frontend = &self.frontend;
        let request = GenerateRequest {
            id: self.id,
            prompt: prompt.clone(),
            max_tokens: 1,
            sampling: self.sampling.clone(),
            dp_rank: worker.dp_rank,
            resume: (generated > 0).then_some(Resume { generated }),
            phase: Phase::PrefillOnly,
            // Its media are encoded by now (it waited for them).
            media_inputs: if instance.media_embeddings {
                self.media_inputs(prompt)
            } else {
                Vec::new()
            },
            media_pending: false,
        };
        let span = tracing::info_span!(
            parent: &self.span,
            "prefill",
            worker = %worker.worker_id,
        );
        let work = async {
            let mut stream = frontend.requests.generate(instance, request).await?;
            let mut prompt = None;
            loop {
                return match stream.next().await {
                    Some(Ok(GenerateOutput::PromptLogprobs { logprobs })) => {
                        prompt = Some(logprobs);
                        continue;
                    }
                    Some(Ok(GenerateOutput::PrefillDone {
                        first_token,
                        kv,
                        cached_tokens,
                        logprobs,
                    })) => Ok(Prefilled {
                        first_token,
                        kv,
                        cached_tokens,
                        logprobs,
                        prompt,
                    }),
                    Some(Ok(other)) => Err(EngineError::Internal(format!(
                        "the prefill worker answered with {other:?}"
                    ))),
                    Some(Err(e)) => Err(e),
                    None => Err(EngineError::Disconnected),
                };
            }
        };
        let limit =
            frontend.config.migration.dispatch_timeout + frontend.routing.first_token_timeout();
        let mut outage = frontend.routing.outages(worker.worker_id);
        tokio::select! {
            done = tokio::time::timeout(limit, tracing::Instrument::instrument(work, span)) => {
                match done {
                    Ok(Ok(done)) => Ok(done),
                    Ok(Err(error)) => Err(TryFailure::Refused(error)),
                    Err(_) => Err(TryFailure::TimedOut(limit)),
                }
            }
            // Whoever found it counted the failure.
            Ok(()) = outage.changed() => Err(TryFailure::FoundUnhealthy),
        }
    }

    /// The stream of a disaggregated request: the first token, from its prefill, at once;
    /// then what the decode worker generates once it has pulled the KV. A request whose
    /// first token ends it (`ends`, as its life decided) goes no further.
    fn decode_stream(
        &self,
        instance: &WorkerInstance,
        worker: WorkerKey,
        mut prompt: Prompt,
        prefilled: Prefilled,
        ends: Option<FinishReason>,
    ) -> ResponseStream {
        let Prefilled {
            first_token,
            kv,
            cached_tokens,
            logprobs,
            prompt: prompt_logprobs,
        } = prefilled;
        let generated = self.generated.len() as u32;
        let left = self.max_tokens.saturating_sub(generated).max(1);
        let first = GenerateOutput::Tokens {
            token_ids: vec![first_token],
            cached_tokens: Some(cached_tokens),
            logprobs: logprobs.into_iter().collect(),
        };
        // The prompt's log probabilities, asked: before the first token.
        let before: Vec<Result<GenerateOutput, EngineError>> = prompt_logprobs
            .map(|logprobs| Ok(GenerateOutput::PromptLogprobs { logprobs }))
            .into_iter()
            .collect();
        if let Some(reason) = ends {
            let finished = GenerateOutput::Finished {
                reason,
                completion_tokens: 1,
                cached_tokens: None,
            };
            let items = before.into_iter().chain([Ok(first), Ok(finished)]);
            return futures::stream::iter(items).boxed();
        }
        prompt.token_ids.push(first_token);
        let request = GenerateRequest {
            id: self.id,
            prompt,
            max_tokens: left - 1,
            sampling: self.sampling.clone(),
            dp_rank: worker.dp_rank,
            resume: Some(Resume {
                generated: generated + 1,
            }),
            phase: Phase::Decode { kv },
            media_inputs: Vec::new(),
            media_pending: false,
        };
        let frontend = Arc::clone(&self.frontend);
        let instance = instance.clone();
        let handed_over = Instant::now();
        let rest = futures::stream::once(async move {
            let opened = frontend.requests.generate(&instance, request).await;
            (opened, frontend)
        })
        .flat_map(move |(opened, frontend)| match opened {
            Ok(stream) => {
                let mut first = true;
                stream
                    .inspect(move |_| {
                        if std::mem::take(&mut first) {
                            frontend
                                .metrics
                                .disagg_handoff
                                .observe(handed_over.elapsed().as_secs_f64());
                        }
                    })
                    .boxed()
            }
            Err(e) => futures::stream::once(futures::future::ready(Err(e))).boxed(),
        });
        futures::stream::iter(before)
            .chain(futures::stream::once(futures::future::ready(Ok(first))))
            .chain(rest)
            .boxed()
    }
}
