//! One request's attempts: routing it away from workers that failed it, sending it with a
//! deadline, and trying another worker (after a backoff while nothing was generated) when
//! one cannot take it.

use std::sync::Arc;
use std::time::Duration;

use switchyard_core::protocol::{MediaInput, Prompt, SamplingParams};
use switchyard_core::{RequestId, Token, WorkerKey};
use switchyard_router::RoutingOverrides;
use switchyard_router::flow::{Event, GiveUp, RequestLife, Step, TryFailure};
use switchyard_runtime::discovery::Needs;
use switchyard_runtime::{ResponseStream, WorkerInstance};
use tokio::sync::watch;
use tokio::time::Instant;

use super::encode::{MediaStatus, resize_media};
use super::tries::Tried;
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
    pub(super) max_tokens: u32,
    pub(super) sampling: SamplingParams,
    overrides: RoutingOverrides,
    pub(super) arrived: Instant,
    /// Output tokens delivered so far: a move resumes after them.
    pub(super) generated: Vec<Token>,
    /// Its life's decisions and counts: tries, exclusions, moves.
    pub(super) life: RequestLife,
    /// Counts the request out, however it ends; while it is there, the request may hold
    /// router records (released by its life when it is dropped).
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
    /// See [`Prepared::keep_generated`].
    pub(super) keep_generated: bool,
}

impl Drop for RequestRun {
    fn drop(&mut self) {
        // However it ends (its client gone included), its life lets its records go.
        if self.guard.is_some() {
            let frontend = Arc::clone(&self.frontend);
            self.life
                .step(Event::Abandoned, &mut PipelineShell(&frontend));
        }
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
            keep_generated: prepared.keep_generated,
            frontend,
        }
    }

    /// Tokens of the prompt the client sent.
    pub(super) fn prompt_tokens(&self) -> u32 {
        self.prompt.len() as u32
    }

    /// The token ids of the prompt the client sent.
    pub(super) fn prompt_ids(&self) -> &[Token] {
        &self.prompt.token_ids
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
    pub(super) fn media_inputs(&self, prompt: &Prompt) -> Vec<MediaInput> {
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
    pub(super) async fn media_settled(&mut self) -> Result<(), ApiError> {
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
        let mut tries = 0u32;
        loop {
            tries += 1;
            let Some((routed, prompt, version)) = self.route_next(tries).await? else {
                continue;
            };
            let tried = match &routed.prefill {
                Some((instance, prefill)) => {
                    let prefill = (instance.clone(), prefill.worker);
                    self.try_pair(&routed, prefill, prompt).await?
                }
                None => self.try_worker(&routed, prompt, version).await?,
            };
            match tried {
                Tried::UnderWay(attempt) => return Ok(*attempt),
                Tried::Failed(worker, failure) => self.try_failed(worker, failure).await?,
                Tried::Again => {}
            }
        }
    }

    /// Stages its media and routes it, resumed after what was generated: the choice, the
    /// prompt it goes with, and that prompt's version (see [`Self::prompt_version`]); none
    /// when it is to be routed again at once (its media came first).
    async fn route_next(&mut self, tries: u32) -> Result<Option<(Routed, Prompt, u32)>, ApiError> {
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
        let version = self.prompt_version;
        let Some(routed) = self.route(&prompt, overrides, tries).await? else {
            return Ok(None);
        };
        // From here on the request may hold router records, released however it ends.
        if self.guard.is_none() {
            let frontend = Arc::clone(&self.frontend);
            self.guard = Some(InFlight::new(frontend, self.arrived));
        }
        if let Some(local) = routed.local {
            self.frontend.metrics.count_prefill(local.name());
        }
        Ok(Some((routed, prompt, version)))
    }

    /// A try on `worker` failed: what its life says follows (routed again at once, or
    /// after a backoff, or the error it gives up with).
    async fn try_failed(&mut self, worker: WorkerKey, failure: TryFailure) -> Result<(), ApiError> {
        let frontend = Arc::clone(&self.frontend);
        let failed = Event::TryFailed {
            worker: worker.worker_id,
            failure,
        };
        match self.life.step(failed, &mut PipelineShell(&frontend)) {
            Step::Route => Ok(()),
            Step::BackOff(backoff) => {
                tokio::time::sleep(backoff).await;
                Ok(())
            }
            Step::GiveUp(give_up) => Err(self.given_up(give_up)),
            step => Err(unexpected(step)),
        }
    }

    /// The error a request gives up with.
    pub(super) fn given_up(&self, give_up: GiveUp) -> ApiError {
        let frontend = &self.frontend;
        given_up(
            give_up,
            frontend.config.admission.retry_after,
            &frontend.metrics,
        )
    }

    /// Picks a worker (or a pair) for the request, away from those that failed it. When
    /// none can take it, a request under way waits for one to join or recover, looking
    /// again at every change of the fleet (and twice a second, for breakers that
    /// half-open), as long as its life allows. None: a pair was chosen while its media are
    /// still being encoded; they are now, and it is to be routed again.
    async fn route(
        &mut self,
        prompt: &Prompt,
        overrides: RoutingOverrides,
        attempt: u32,
    ) -> Result<Option<Routed>, ApiError> {
        let frontend = Arc::clone(&self.frontend);
        let route_span = tracing::info_span!(parent: &self.span, "route", attempt);
        let mut waiting = false;
        loop {
            let changed = frontend.routing.fleet_changed();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let until = loop {
                let decided = std::time::Instant::now();
                // A constrained request goes only to workers that enforce its constraint,
                // one asking for log probabilities only to workers that report them.
                let needs =
                    Needs {
                        constraint: self.sampling.constraint.as_ref().map(|constraint| {
                            (constraint.kind(), frontend.preprocessor.vocabulary())
                        }),
                        logprobs: self.sampling.logprobs.is_some(),
                        prompt_logprobs: self.sampling.prompt_logprobs.is_some(),
                    };
                let unable = (!needs.is_none()).then(|| {
                    let mut exclude = self.life.exclusions().to_vec();
                    exclude.extend(frontend.routing.unable(&needs).unwrap_or_default());
                    exclude
                });
                let exclude = unable.as_deref().unwrap_or(self.life.exclusions());
                let routed = route_span
                    .in_scope(|| frontend.routing.route(self.id, prompt, overrides, exclude));
                let (routed, event) = match routed {
                    Ok(routed) => {
                        let pair = routed.prefill.is_some();
                        let media_pending = overrides.media_pending;
                        (
                            Some(routed),
                            Event::Routed {
                                pair,
                                media_pending,
                            },
                        )
                    }
                    Err(RouteFailure::InvalidPrompt(message)) => {
                        return Err(ApiError::invalid(message));
                    }
                    Err(RouteFailure::Internal(message)) => {
                        return Err(ApiError::internal(message));
                    }
                    Err(RouteFailure::NoWorkers) => {
                        let now = self.arrived.elapsed();
                        (None, Event::NoWorker { now })
                    }
                };
                match (self.life.step(event, &mut PipelineShell(&frontend)), routed) {
                    (Step::Route, _) => {}
                    (Step::Send, Some(routed)) => {
                        let decided = decided.elapsed().as_secs_f64();
                        frontend.metrics.routing_decision.observe(decided);
                        return Ok(Some(routed));
                    }
                    (Step::AwaitMedia, _) => {
                        self.media_settled().await?;
                        return Ok(None);
                    }
                    (Step::Wait { until }, _) => break until,
                    (Step::GiveUp(give_up), _) => return Err(self.given_up(give_up)),
                    (step, _) => return Err(unexpected(step)),
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
}

/// A step its life does not take after the event it was told: a defect, reported as an
/// internal error rather than a panic.
pub(super) fn unexpected(step: Step) -> ApiError {
    ApiError::internal(format!(
        "the request's life took an unexpected step: {step:?}"
    ))
}

/// Counts the request out, however it ends.
struct InFlight {
    frontend: Arc<Frontend>,
    started: Instant,
}

impl InFlight {
    fn new(frontend: Arc<Frontend>, started: Instant) -> Self {
        frontend.metrics.in_flight.inc();
        InFlight { frontend, started }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.frontend.metrics.in_flight.dec();
        self.frontend
            .metrics
            .observe_duration(self.started.elapsed());
    }
}
