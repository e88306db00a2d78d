//! One request's attempts: routing it away from workers that failed it, sending it with a
//! deadline, and trying another worker (after a backoff while nothing was generated) when
//! one cannot take it.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use switchyard_core::protocol::{
    EngineError, GenerateOutput, GenerateRequest, KvHandle, MediaInput, Phase, Prompt, Resume,
    SamplingParams,
};
use switchyard_core::{RequestId, Token, WorkerKey};
use switchyard_router::RoutingOverrides;
use switchyard_router::flow::{self, RequestLife, Routing, TryFailure};
use switchyard_runtime::{ResponseStream, WorkerInstance};
use tokio::sync::watch;
use tokio::time::Instant;

use super::encode::{MediaStatus, resize_media};
use super::{Frontend, PipelineShell, Prepared, given_up};
use crate::feature_store::StagingRefused;
use crate::media::OnEncoderFailure;
use crate::openai::ApiError;
use crate::routing::{Progress, RouteFailure, Routed};

/// One worker's stream of a request.
pub(super) struct Attempt {
    pub(super) worker: WorkerKey,
    pub(super) stream: ResponseStream,
    /// Changes when the worker is found unhealthy.
    pub(super) outage: watch::Receiver<u64>,
    /// Where its tokens mark the worker's progress.
    pub(super) progress: Progress,
    /// Its first token came from a remote prefill: the decode worker's first one follows
    /// a KV transfer, and is waited for as a first token, not as the next one.
    pub(super) handoff: bool,
    /// The worker got the request ahead of its media: it is to be told when they are
    /// ready.
    pub(super) media_on: Option<WorkerInstance>,
    /// The prompt it was sent (see [`RequestRun::prompt_version`]).
    pub(super) prompt_version: u32,
}

/// What a request needs across its attempts.
pub(super) struct RequestRun {
    pub(super) frontend: Arc<Frontend>,
    pub(super) id: RequestId,
    prompt: Prompt,
    max_tokens: u32,
    sampling: SamplingParams,
    overrides: RoutingOverrides,
    pub(super) arrived: Instant,
    /// Output tokens delivered so far: a move resumes after them.
    pub(super) generated: Vec<Token>,
    /// Its life's decisions and counts: tries, exclusions, moves.
    pub(super) life: RequestLife,
    /// Frees the request's router slot and counts it out, however it ends.
    guard: Option<InFlight>,
    tenant: Option<Arc<str>>,
    /// The request's trace span.
    pub(super) span: tracing::Span,
    /// Its media, while they are being encoded (it went ahead of them).
    pub(super) media: Option<watch::Receiver<MediaStatus>>,
    /// Its media items' embeddings, for workers that merge them.
    pub(super) features: super::encode::MediaFeatures,
    /// Its media items in the feature store (see [`crate::feature_store`]).
    pub(super) hold: Option<super::encode::SharedHold>,
    /// See [`Self::prompt_version`].
    prompt_version: u32,
}

impl Drop for RequestRun {
    fn drop(&mut self) {
        self.span
            .record("completion_tokens", self.generated.len() as u64);
        if let Some(tenant) = &self.tenant {
            self.frontend.metrics.count_tenant_tokens(
                tenant,
                "completion",
                self.generated.len() as u64,
            );
        }
    }
}

/// Why a request's media are taken as failed when their encoding ends without a word.
pub(super) const MEDIA_LOST: &str = "the encoding of the request's media stopped";

/// How often a request under way that no worker can take looks again, between changes of
/// the fleet.
const NO_WORKER_POLL: Duration = Duration::from_millis(500);

impl RequestRun {
    pub(super) fn new(
        frontend: Arc<Frontend>,
        id: RequestId,
        prepared: &Prepared,
        arrived: Instant,
    ) -> Self {
        RequestRun {
            id,
            prompt: prepared.prompt.clone(),
            max_tokens: prepared.max_tokens,
            sampling: prepared.sampling.clone(),
            overrides: prepared.overrides,
            arrived,
            generated: Vec::new(),
            life: RequestLife::new(
                id,
                &frontend.config.routing(),
                prepared.max_tokens,
                prepared.sampling.stop_token_ids.clone(),
            ),
            guard: None,
            tenant: prepared.tenant.clone(),
            span: prepared.span.clone(),
            media: prepared.media.clone(),
            features: prepared.features.clone(),
            hold: prepared.hold.clone(),
            prompt_version: 0,
            frontend,
        }
    }

    /// Tokens of the prompt the client sent.
    pub(super) fn prompt_tokens(&self) -> u32 {
        self.prompt.len() as u32
    }

    /// The prompt as the next worker must see it: the original, then what was generated.
    fn current_prompt(&self) -> Prompt {
        let mut prompt = self.prompt.clone();
        prompt.token_ids.extend_from_slice(&self.generated);
        prompt
    }

    /// Where its media stand, if it went ahead of them: `Some(true)` while they are being
    /// encoded, `Some(false)` once they are ready (and from then on none). Media that could
    /// not be encoded fail the request, or are stripped from its prompt (see
    /// [`Self::media_failed`]).
    pub(super) fn media_pending(&mut self) -> Result<Option<bool>, ApiError> {
        let Some(media) = &mut self.media else {
            return Ok(None);
        };
        let status = media.borrow_and_update().clone();
        match status {
            MediaStatus::Encoding => Ok(Some(true)),
            MediaStatus::Ready(resized, features) => {
                self.media = None;
                self.features = features;
                if resize_media(&mut self.prompt, &resized).is_some() {
                    self.prompt_version += 1;
                }
                Ok(Some(false))
            }
            MediaStatus::Failed(why) => self.media_failed(why).map(|()| Some(false)),
        }
    }

    /// Its media could not be encoded (`why`): a 503, or (`on_encoder_failure =
    /// "text_only"`) its prompt without them.
    pub(super) fn media_failed(&mut self, why: String) -> Result<(), ApiError> {
        self.media = None;
        match self.frontend.media.on_encoder_failure().0 {
            OnEncoderFailure::Fail => Err(ApiError::unavailable(why, Duration::from_secs(1))),
            OnEncoderFailure::TextOnly => {
                self.frontend.text_only(&mut self.prompt, &why);
                self.prompt_version += 1;
                Ok(())
            }
        }
    }

    /// The embeddings of `prompt`'s media, one per span, for a worker that merges them;
    /// none when any is missing (the worker then needs their KV cached, or refuses).
    fn media_inputs(&self, prompt: &Prompt) -> Vec<MediaInput> {
        prompt
            .media
            .iter()
            .map(|span| self.features.get(&span.media_hash).cloned())
            .collect::<Option<Vec<_>>>()
            .unwrap_or_default()
    }

    /// Which prompt it has: a new one each time its media change behind it (encoded
    /// smaller, or dropped).
    pub(super) fn prompt_version(&self) -> u32 {
        self.prompt_version
    }

    /// Stages its media items for the worker they go to next (see [`crate::feature_store`]):
    /// waits for staging memory, within `feature_store.staging_wait`, then a 503.
    pub(super) async fn stage_media(&self) -> Result<(), ApiError> {
        let Some(hold) = &self.hold else {
            return Ok(());
        };
        if self.prompt.media.is_empty() {
            return Ok(());
        }
        let hashes = self.prompt.media.iter().map(|span| span.media_hash);
        crate::feature_store::stage(hold, hashes)
            .await
            .map_err(|StagingRefused::Full(waited)| {
                ApiError::unavailable(
                    format!(
                        "No staging memory came free for the request's media within {}; retry shortly.",
                        humantime::format_duration(waited)
                    ),
                    self.frontend.config.admission.retry_after,
                )
            })
    }

    /// Its worker computed its prompt: the media items it staged are prefilled.
    pub(super) fn media_prefilled(&self) {
        if let Some(hold) = &self.hold {
            hold.lock().prefilled();
        }
    }

    /// Waits until its media are encoded, or could not be (see [`Self::media_pending`]).
    async fn media_settled(&mut self) -> Result<(), ApiError> {
        while self.media_pending()? == Some(true) {
            let Some(media) = &mut self.media else {
                break;
            };
            if media.changed().await.is_err() {
                return self.media_failed(MEDIA_LOST.to_owned());
            }
        }
        Ok(())
    }

    /// Routes and sends the request (resumed after what was generated, if anything),
    /// trying other workers when one cannot take it (what to try, and when to stop, is its
    /// life's to decide: see [`switchyard_router::flow`]).
    pub(super) async fn dispatch(&mut self) -> Result<Attempt, ApiError> {
        let frontend = Arc::clone(&self.frontend);
        let config = frontend.config.migration;
        let mut tries = 0u32;
        let mut backoff: Option<Duration> = None;
        loop {
            if let Some(wait) = backoff.take() {
                tokio::time::sleep(wait).await;
            }
            tries += 1;
            // Media that go with the request take staging memory first (media still
            // encoding take it when they are ready).
            let pending = self.media_pending()? == Some(true);
            if !pending {
                self.stage_media().await?;
            }
            let overrides = RoutingOverrides {
                media_pending: pending,
                max_tokens: Some(self.life.tokens_left()),
                ..self.overrides
            };
            let prompt = self.current_prompt();
            let sent_version = self.prompt_version;
            let routed = self.route(&prompt, overrides, tries).await?;
            // From here on the request holds a router slot, released by the guard.
            if self.guard.is_none() {
                self.guard = Some(InFlight::new(Arc::clone(&frontend), self.id, self.arrived));
            }
            let worker = routed.decision.worker;
            let generated = self.generated.len() as u32;
            if let Some(local) = routed.local {
                frontend.metrics.count_prefill(local.name());
            }
            let pending = self.media_pending()? == Some(true);
            if flow::media::waits_for_media(routed.prefill.is_some(), pending) {
                // A prefill worker hands over a finished prompt: its media come first (the
                // pair is chosen again once they are, its prompt may have changed).
                self.life.reroute(&mut PipelineShell(&frontend));
                self.media_settled().await?;
                continue;
            }
            if let Some((prefill_instance, prefill)) = &routed.prefill {
                let done = self
                    .remote_prefill(prefill_instance, prefill.worker, &prompt, generated)
                    .await;
                match done {
                    Ok((first_token, mut kv, cached_tokens)) => {
                        self.life.prefill_handed_over(&mut PipelineShell(&frontend));
                        frontend.metrics.count_prefill("remote");
                        frontend.metrics.count_dispatch(prefill.worker, true);
                        frontend.metrics.count_dispatch(worker, true);
                        kv.address = prefill_instance.address.clone();
                        let outage = frontend.routing.outages(worker.worker_id);
                        let stream = self.decode_stream(
                            &routed.instance,
                            worker,
                            prompt,
                            (first_token, kv, cached_tokens),
                        );
                        self.life.under_way();
                        return Ok(Attempt {
                            worker,
                            stream,
                            outage,
                            progress: frontend.routing.progress(worker.worker_id),
                            handoff: true,
                            media_on: None,
                            prompt_version: self.prompt_version,
                        });
                    }
                    Err(failure) => {
                        // The prefill worker failed it: that worker is left out, and the
                        // pair is chosen afresh.
                        frontend.metrics.count_prefill("failed");
                        frontend.metrics.count_dispatch(prefill.worker, false);
                        tracing::warn!(worker = %prefill.worker.worker_id, ?failure, "the prefill worker failed the request");
                        backoff = self.try_failed(prefill.worker, failure)?;
                        continue;
                    }
                }
            }
            let mut prompt = prompt;
            if routed.instance.prompt_text {
                // Its engine takes text: the prompt as rendered, special tokens included.
                match frontend.preprocessor.render_tokens(&prompt.token_ids) {
                    Ok(text) => prompt.text = Some(text),
                    Err(e) => {
                        self.life.abandoned(&mut PipelineShell(&frontend));
                        return Err(ApiError::internal(format!(
                            "Cannot render the prompt as text: {e}"
                        )));
                    }
                }
            }
            let media_pending = match self.media_pending() {
                Ok(pending) => pending == Some(true),
                Err(e) => {
                    self.life.abandoned(&mut PipelineShell(&frontend));
                    return Err(e);
                }
            };
            if self.prompt_version != sent_version {
                // Its media changed (encoded smaller, or dropped) since it was routed:
                // routed again (not a failed try).
                self.life.reroute(&mut PipelineShell(&frontend));
                continue;
            }
            // A worker that merges the media's embeddings gets them (once they are there).
            let media_inputs = if routed.instance.media_embeddings && !media_pending {
                self.media_inputs(&prompt)
            } else {
                Vec::new()
            };
            // Sent ahead of its media: where its engine stops until they are ready.
            let gate = media_pending
                .then(|| prompt.media.iter().map(|m| m.offset).min())
                .flatten()
                .map(|from| (prompt.len() as u64, u64::from(from)));
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
                // The worker was found unhealthy meanwhile: do not wait on it (whoever
                // found it counted the failure).
                Ok(()) = outage.changed() => Err(TryFailure::FoundUnhealthy),
            };
            match sent {
                Ok(stream) => {
                    frontend.metrics.count_dispatch(worker, true);
                    if let Some((tokens, from)) = gate {
                        frontend.routing.media_pending(self.id, tokens, from);
                    }
                    self.life.under_way();
                    return Ok(Attempt {
                        worker,
                        stream,
                        outage,
                        progress: frontend.routing.progress(worker.worker_id),
                        handoff: false,
                        media_on: media_pending.then(|| routed.instance.clone()),
                        prompt_version: sent_version,
                    });
                }
                Err(failure) => {
                    frontend.metrics.count_dispatch(worker, false);
                    tracing::warn!(worker = %worker.worker_id, ?failure, "cannot dispatch to the worker");
                    backoff = self.try_failed(worker, failure)?;
                }
            }
        }
    }

    /// A try on `worker` failed: what its life says follows (a backoff before the next
    /// try, or the error it gives up with).
    fn try_failed(
        &mut self,
        worker: WorkerKey,
        failure: TryFailure,
    ) -> Result<Option<Duration>, ApiError> {
        let frontend = Arc::clone(&self.frontend);
        let mut shell = PipelineShell(&frontend);
        self.life
            .try_failed(worker.worker_id, failure, &mut shell)
            .map_err(|give_up| {
                given_up(
                    give_up,
                    frontend.config.admission.retry_after,
                    &frontend.metrics,
                )
            })
    }

    /// Picks a worker (or a pair) for the request, away from those that failed it. When
    /// none can take it, a request under way waits for one to join or recover, looking
    /// again at every change of the fleet (and twice a second, for breakers that
    /// half-open), as long as its life allows.
    async fn route(
        &mut self,
        prompt: &Prompt,
        overrides: RoutingOverrides,
        attempt: u32,
    ) -> Result<Routed, ApiError> {
        let frontend = Arc::clone(&self.frontend);
        let route_span = tracing::info_span!(parent: &self.span, "route", attempt);
        let mut waiting = false;
        loop {
            let changed = frontend.routing.fleet_changed();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let decided = std::time::Instant::now();
            let routed = self.life.route(self.arrived.elapsed(), |exclude| {
                let routed = route_span
                    .in_scope(|| frontend.routing.route(self.id, prompt, overrides, exclude));
                match routed {
                    Ok(routed) => Ok(Some(routed)),
                    Err(RouteFailure::InvalidPrompt(message)) => Err(ApiError::invalid(message)),
                    Err(RouteFailure::Internal(message)) => Err(ApiError::internal(message)),
                    Err(RouteFailure::NoWorkers) => Ok(None),
                }
            })?;
            let until = match routed {
                Routing::Routed(routed) => {
                    frontend
                        .metrics
                        .routing_decision
                        .observe(decided.elapsed().as_secs_f64());
                    return Ok(routed);
                }
                Routing::Wait { until } => until,
                Routing::GiveUp(give_up) => {
                    return Err(given_up(
                        give_up,
                        frontend.config.admission.retry_after,
                        &frontend.metrics,
                    ));
                }
            };
            if !waiting {
                waiting = true;
                tracing::info!(request = %self.id, "no worker can take the request now: waiting for one");
            }
            let left = until.saturating_sub(self.arrived.elapsed());
            let _ = tokio::time::timeout(left.min(NO_WORKER_POLL), changed).await;
        }
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
    ) -> Result<(Token, KvHandle, u32), TryFailure> {
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
            match stream.next().await {
                Some(Ok(GenerateOutput::PrefillDone {
                    first_token,
                    kv,
                    cached_tokens,
                })) => Ok((first_token, kv, cached_tokens)),
                Some(Ok(other)) => Err(EngineError::Internal(format!(
                    "the prefill worker answered with {other:?}"
                ))),
                Some(Err(e)) => Err(e),
                None => Err(EngineError::Disconnected),
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
    /// first token ends it goes no further.
    fn decode_stream(
        &self,
        instance: &WorkerInstance,
        worker: WorkerKey,
        mut prompt: Prompt,
        (first_token, kv, cached_tokens): (Token, KvHandle, u32),
    ) -> ResponseStream {
        let generated = self.generated.len() as u32;
        let left = self.max_tokens.saturating_sub(generated).max(1);
        let first = GenerateOutput::Tokens {
            token_ids: vec![first_token],
            cached_tokens: Some(cached_tokens),
        };
        if let Some(reason) = self.life.ended_by_prefill_token(first_token) {
            let finished = GenerateOutput::Finished {
                reason,
                completion_tokens: 1,
                cached_tokens: None,
            };
            return futures::stream::iter([Ok(first), Ok(finished)]).boxed();
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
        futures::stream::once(futures::future::ready(Ok(first)))
            .chain(rest)
            .boxed()
    }
}

/// Frees the router slot and counts the request out, however it ends.
struct InFlight {
    frontend: Arc<Frontend>,
    id: RequestId,
    started: Instant,
}

impl InFlight {
    fn new(frontend: Arc<Frontend>, id: RequestId, started: Instant) -> Self {
        frontend.metrics.in_flight.inc();
        InFlight {
            frontend,
            id,
            started,
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.frontend.routing.finish(self.id);
        self.frontend.metrics.in_flight.dec();
        self.frontend
            .metrics
            .observe_duration(self.started.elapsed());
    }
}
