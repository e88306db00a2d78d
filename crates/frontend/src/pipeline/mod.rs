//! The request pipeline: admission, routing, dispatch to a worker, and the response stream
//! (detokenized, cut at stop strings, with usage), moved to another worker when its worker
//! fails.
//!
//! A request's life: the routing core admits it (or queues it, or refuses it); it is routed
//! away from workers that already failed it and sent with a deadline ([`dispatch`]). Before
//! its first token, a worker that cannot take it is left for another after a backoff
//! (exponential, with jitter). Once streaming ([`stream`]), when its worker fails (the
//! connection breaks, the stream stalls, the worker is found unhealthy) the request resumes
//! on another worker: its prompt plus the tokens already delivered, what is left of its
//! token budget, the same sampling seed. The client sees one stream, each token once.
//! Moves are bounded per request and by a fleet-wide budget; a stream that cannot go on
//! ends with an error whose code is `stream_interrupted`.
//!
//! Every request holds an in-flight guard from its first dispatch on. However it ends
//! (finished, stopped, failed, or the client went away and the stream was dropped), the
//! guard frees its slot in the router; dropping an engine stream cancels the request on
//! that worker.

pub mod canary;
mod dispatch;
pub mod encode;
pub use encode::WARNING_HEADER;
mod scored;
mod stream;
mod tries;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures::StreamExt;
use futures::stream::BoxStream;
use switchyard_core::protocol::{Prompt, SamplingParams, TextLogprob, TokenLogprobs};
use switchyard_core::{Priority, RequestId, Token, WorkerKey};
use switchyard_router::flow::{self, GiveUp, Shell};
use switchyard_router::routing::health::Failure;
use switchyard_router::{Rejection, RoutingOverrides};
use switchyard_runtime::RequestPlane;
use tokio::time::Instant;

use crate::auth::KeyTable;
use crate::config::FrontendConfig;
use crate::metrics::Metrics;
use crate::openai::ApiError;
use crate::openai::response::Usage;
use crate::preprocess::Preprocessor;
use crate::routing::RoutingService;
use dispatch::RequestRun;
use stream::Streaming;

/// Everything the HTTP layer shares.
#[derive(Debug)]
pub struct Frontend {
    pub config: FrontendConfig,
    pub preprocessor: Arc<Preprocessor>,
    pub routing: Arc<RoutingService>,
    pub requests: Arc<dyn RequestPlane>,
    pub metrics: Metrics,
    next_id: AtomicU64,
    /// Ids of the work that is not a client's request (media encodes, canaries), apart
    /// from theirs (bit 62 set), so that requests are numbered in the order they come.
    side_ids: AtomicU64,
    /// API keys; empty: the API is open.
    pub keys: KeyTable,
    /// Media in requests: fetched, decoded and prepared off the async threads.
    pub media: crate::media::MediaStage,
    /// Which media items' encoded features exist (see [`crate::feature_store`]).
    pub features: Arc<crate::feature_store::SharedFeatureStore>,
    /// The parsers chat answers are split with (reasoning, tool calls).
    pub parsers: crate::tools::Parsers,
    /// Stored responses of `/v1/responses`.
    pub responses: crate::responses::ResponseStore,
    /// Turns at converting large requests (templates, tokenizer) on the blocking pool: one
    /// per core, so that many long prompts at once queue here (and are dropped with their
    /// clients) rather than share the cores.
    pub tokenizing: tokio::sync::Semaphore,
}

/// A validated request, tokenized.
#[derive(Debug, Clone)]
pub struct Prepared {
    pub prompt: Prompt,
    pub max_tokens: u32,
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    /// The tier asked for; none: standard (or the API key's tier, see [`crate::auth`]).
    pub priority: Option<Priority>,
    pub overrides: RoutingOverrides,
    /// The API key's tenant, for the tenant metrics.
    pub tenant: Option<Arc<str>>,
    /// The request's trace span (`request`); its children: admission, route, dispatch,
    /// first token (and the worker's, through the request plane).
    pub span: tracing::Span,
    /// Its media are still being encoded: it goes ahead of them (see
    /// [`encode::MediaReady::pending`]).
    pub media: Option<tokio::sync::watch::Receiver<encode::MediaStatus>>,
    /// Its media items' embeddings known by now (see [`encode::MediaFeatures`]).
    pub features: encode::MediaFeatures,
    /// Its media items held in the feature store, staged as they go to its workers and
    /// let go when its response ends.
    pub hold: Option<encode::SharedHold>,
    /// Which of its request's choices (OpenAI's `n`) this is: 0 for the first, admitted
    /// for all of them; the others skip admission, so that a request never waits for room
    /// its own earlier choices hold, and their prompt is not counted again for the tenant.
    pub choice: u32,
    /// Its answer's special tokens are decoded as text (for a parser that reads them).
    pub keep_special_tokens: bool,
    /// Its generated token ids come with its end (for a stored response's next turn).
    pub keep_generated: bool,
}

impl Prepared {
    /// A text prompt with default settings (standard priority, no stop strings).
    pub fn text(token_ids: Vec<Token>, max_tokens: u32) -> Self {
        Prepared {
            prompt: Prompt::tokens(token_ids),
            max_tokens,
            sampling: SamplingParams::default(),
            stop: Vec::new(),
            priority: None,
            tenant: None,
            span: tracing::Span::none(),
            overrides: RoutingOverrides::default(),
            media: None,
            features: encode::MediaFeatures::default(),
            hold: None,
            choice: 0,
            keep_special_tokens: false,
            keep_generated: false,
        }
    }

    /// Takes its media as the encode stage left them
    /// ([`Frontend::encode_or_fall_back`]): media not encoded because a worker holds their
    /// KV go to that worker; media still being encoded follow the request; their features
    /// stay held until the response ends.
    pub fn add_media(&mut self, ready: &encode::MediaReady) {
        self.overrides.worker = ready.worker;
        self.overrides.held_media = ready.worker.is_some();
        self.media = ready.pending.clone();
        self.features = ready.features.clone();
        self.hold = Some(ready.hold.clone());
    }

    /// Choice `index` of a request asking for several (OpenAI's `n`): the same request, with
    /// the seed moved on by `index` (as vLLM seeds its samples) so that seeded choices differ
    /// and still repeat from one identical request to the next, traced under a `choice`
    /// span of the request's.
    pub fn choice(&self, index: u32) -> Self {
        let mut sampling = self.sampling.clone();
        sampling.seed = sampling
            .seed
            .map(|seed| seed.wrapping_add(u64::from(index)));
        Prepared {
            prompt: self.prompt.clone(),
            max_tokens: self.max_tokens,
            sampling,
            stop: self.stop.clone(),
            priority: self.priority,
            overrides: self.overrides,
            tenant: self.tenant.clone(),
            span: tracing::info_span!(
                parent: &self.span,
                "choice",
                index,
                request_id = tracing::field::Empty,
                prompt_tokens = tracing::field::Empty,
                ttft_ms = tracing::field::Empty,
                completion_tokens = tracing::field::Empty,
            ),
            media: self.media.clone(),
            features: self.features.clone(),
            hold: self.hold.clone(),
            choice: index,
            keep_special_tokens: self.keep_special_tokens,
            keep_generated: self.keep_generated,
        }
    }
}

/// A token as a response names it: by id (spelled by the tokenizer's vocabulary), or by
/// the text an engine that streams text gave it.
#[derive(Debug, Clone, PartialEq)]
pub enum Spelled {
    Id(Token),
    Text(String),
}

/// A generated token's log probabilities, as a response reports them.
#[derive(Debug, Clone, PartialEq)]
pub struct Scored {
    pub token: Spelled,
    /// Where its text starts in the answer, in characters.
    pub offset: u32,
    pub logprob: f32,
    /// The likeliest tokens, likeliest first.
    pub top: Vec<(Spelled, f32)>,
}

impl Scored {
    /// A token's entry from an engine's ids (its offset set when its text is placed).
    pub fn of_ids(token: Token, logprobs: TokenLogprobs) -> Self {
        Scored {
            token: Spelled::Id(token),
            offset: 0,
            logprob: logprobs.logprob,
            top: logprobs
                .top
                .into_iter()
                .map(|(id, l)| (Spelled::Id(id), l))
                .collect(),
        }
    }

    /// A token's entry from an engine's text.
    pub fn of_text(logprob: TextLogprob) -> Self {
        Scored {
            token: Spelled::Text(logprob.token),
            offset: 0,
            logprob: logprob.logprob,
            top: logprob
                .top
                .into_iter()
                .map(|(text, l)| (Spelled::Text(text), l))
                .collect(),
        }
    }
}

/// A piece of a response.
#[derive(Debug, Clone, PartialEq)]
pub enum Piece {
    /// Answer text, with the log probabilities of the tokens whose text it completes (when
    /// the request asked; they may come with no text, such as an end-of-sequence token's).
    Text { text: String, scored: Vec<Scored> },
    /// The prompt's log probabilities, before any text, when the request asked (a
    /// completion's `echo`): its first token (which has none), then an entry for each
    /// other token, offsets in the prompt's text.
    Prompt { first: Token, scored: Vec<Scored> },
    /// A chat answer's text, parsed (reasoning, content, tool calls): the pipeline sends
    /// `Text`, the chat endpoint's parsers turn it into this ([`crate::tools::output`]).
    Parts {
        parts: Vec<crate::tools::output::Part>,
        scored: Vec<Scored>,
    },
    Finished {
        reason: &'static str,
        usage: Usage,
        /// The worker it ended on (the last one, after moves).
        worker: Option<WorkerKey>,
        /// The generated token ids, when the request asked to keep them
        /// ([`Prepared::keep_generated`]); else empty.
        generated: Vec<Token>,
    },
}

/// A response stream. It always ends with `Finished` or an error.
pub type Generation = BoxStream<'static, Result<Piece, ApiError>>;

/// A request on its way: its id, the worker it was first sent to, its response stream.
pub struct Dispatched {
    pub id: RequestId,
    pub worker: WorkerKey,
    pub generation: Generation,
}

impl std::fmt::Debug for Dispatched {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dispatched")
            .field("id", &self.id)
            .field("worker", &self.worker)
            .finish_non_exhaustive()
    }
}

/// How an error from a worker counts against it, if at all (see
/// [`switchyard_router::flow::failure_of`]).
pub(crate) use switchyard_router::flow::failure_of;

/// The API error an admission refusal becomes.
fn refused(rejection: Rejection, retry_after: std::time::Duration) -> ApiError {
    match rejection.status() {
        429 => ApiError::overloaded(rejection.message(), retry_after),
        _ => ApiError::unavailable(rejection.message(), retry_after),
    }
}

/// The API error a request's life that gave up becomes.
pub(crate) fn given_up(
    give_up: GiveUp,
    retry_after: std::time::Duration,
    metrics: &Metrics,
) -> ApiError {
    match give_up {
        GiveUp::NoWorkers => ApiError::unavailable(Rejection::NoWorkers.message(), retry_after),
        GiveUp::NoOtherWorker => {
            ApiError::unavailable("No other worker can take the request now.", retry_after)
        }
        GiveUp::Unservable(message) => {
            ApiError::unservable(format!("No worker can serve this request: {message}"))
        }
        GiveUp::Exhausted(error) => ApiError::unavailable(
            format!("No worker could take the request: {error}"),
            retry_after,
        ),
        GiveUp::Invalid(message) => {
            ApiError::invalid(format!("The engine refused the request: {message}"))
        }
        GiveUp::Refused(error) => {
            ApiError::interrupted(format!("The worker refused to go on: {error}"))
        }
        GiveUp::MoveLimit { workers } => {
            metrics.count_migration("limit");
            ApiError::interrupted(format!(
                "The request failed on {workers} workers; it cannot be moved again."
            ))
        }
        GiveUp::MoveBudget => {
            metrics.count_migration("budget");
            ApiError::interrupted(
                "Too many requests are being moved between workers; this one cannot be.",
            )
        }
    }
}

/// The pipeline as a request's life sees it ([`switchyard_router::flow::Shell`]): the
/// routing service's records (and what it tells other frontends), the workers' health
/// with the metrics, the fleet's migration budget.
pub(crate) struct PipelineShell<'a>(pub(crate) &'a Frontend);

impl Shell for PipelineShell<'_> {
    fn release(&mut self, id: RequestId) {
        self.0.routing.finish(id);
    }

    fn prefill_released(&mut self, id: RequestId) {
        self.0.routing.prefill_finished(id);
    }

    fn hold_prefill(&mut self, id: RequestId, prompt_tokens: u64, media_from: u64) {
        self.0.routing.media_pending(id, prompt_tokens, media_from);
    }

    fn prefill_done(&mut self, id: RequestId) {
        self.0.routing.prefill_done(id);
    }

    fn count_failure(&mut self, worker: switchyard_core::WorkerId, failure: Failure) {
        self.0.report_failure(worker, failure);
    }

    fn count_success(&mut self, worker: switchyard_core::WorkerId) {
        self.0.routing.report_success(worker);
    }

    fn credit_migration(&mut self) {
        self.0.routing.credit_migration();
    }

    fn spend_migration(&mut self) -> bool {
        self.0.routing.spend_migration()
    }

    fn unit_random(&mut self) -> f64 {
        rand::random::<f64>()
    }
}

impl Frontend {
    pub fn new(
        config: FrontendConfig,
        preprocessor: Arc<Preprocessor>,
        routing: Arc<RoutingService>,
        requests: Arc<dyn RequestPlane>,
    ) -> Self {
        let metrics = Metrics::new(routing.model());
        let media = crate::media::MediaStage::new(config.multimodal.clone());
        let features = crate::feature_store::SharedFeatureStore::new(
            &config.multimodal.feature_store,
            &metrics,
        );
        let parsers =
            crate::tools::Parsers::new(&config.chat, &config.model, preprocessor.template_source());
        Frontend {
            parsers,
            responses: crate::responses::ResponseStore::new(config.responses),
            tokenizing: tokio::sync::Semaphore::new(
                std::thread::available_parallelism().map_or(2, usize::from),
            ),
            media,
            features,
            config,
            preprocessor,
            routing,
            requests,
            metrics,
            // Ids only need to be unique per engine; a random start keeps several frontends
            // sharing workers apart.
            next_id: AtomicU64::new(rand::random::<u64>() >> 2),
            side_ids: AtomicU64::new((1 << 62) | (rand::random::<u64>() >> 2)),
            keys: KeyTable::default(),
        }
    }

    /// Requires API keys from the public API (see [`crate::auth`]).
    pub fn with_keys(mut self, keys: KeyTable) -> Self {
        self.keys = keys;
        self
    }

    /// An id for work that is not a client's request (media encodes, canaries).
    pub(crate) fn side_id(&self) -> RequestId {
        RequestId(self.side_ids.fetch_add(1, Ordering::Relaxed))
    }

    /// Numbers the next requests from `next` on, in arrival order (for runs that must be
    /// reproducible, such as replaying a trace against the simulator).
    pub fn set_next_request_id(&self, next: u64) {
        self.next_id.store(next, Ordering::Relaxed);
    }

    /// Counts a failure against `worker` (its health, the metrics).
    pub fn report_failure(&self, worker: switchyard_core::WorkerId, failure: Failure) {
        self.metrics.count_failure(worker, failure.name());
        self.routing.report_failure(worker, failure);
    }

    /// Admits, routes and dispatches a request.
    pub async fn generate(self: &Arc<Self>, prepared: Prepared) -> Result<Dispatched, ApiError> {
        // Time to first token and request duration count from here, queueing included.
        let arrived = Instant::now();
        let id = RequestId(self.next_id.fetch_add(1, Ordering::Relaxed));
        let retry = self.config.admission.retry_after;
        prepared.span.record("request_id", id.0);
        self.metrics
            .offered_tokens
            .inc_by(prepared.prompt.len() as u64);
        // A request's later choices go in under its first's admission.
        let ticket = if prepared.choice == 0 {
            let admission = tracing::info_span!(parent: &prepared.span, "admission");
            let ticket = tracing::Instrument::instrument(
                self.routing
                    .admit(id, prepared.priority.unwrap_or_default()),
                admission,
            )
            .await
            .map_err(|(rejection, hint)| {
                self.metrics.count_rejection(rejection);
                refused(rejection, hint.map_or(retry, |wait| wait.max(retry)))
            })?;
            self.metrics
                .queue_time
                .observe(arrived.elapsed().as_secs_f64());
            Some(ticket)
        } else {
            None
        };
        let prompt_tokens = prepared.prompt.len() as u32;
        prepared.span.record("prompt_tokens", prompt_tokens);
        let mut run = RequestRun::new(Arc::clone(self), id, &prepared, arrived);
        run.life
            .step(flow::Event::Admitted, &mut PipelineShell(self));
        let attempt = run.dispatch().await?;
        drop(ticket);
        self.metrics.input_tokens.inc_by(u64::from(prompt_tokens));
        if let Some(tenant) = prepared.tenant.as_ref().filter(|_| prepared.choice == 0) {
            self.metrics
                .count_tenant_tokens(tenant, "prompt", u64::from(prompt_tokens));
        }
        let worker = attempt.worker;
        // The tokens that end the answer are never its text.
        let keep = (prepared.keep_special_tokens).then(|| prepared.sampling.stop_token_ids.clone());
        let decoder = self.preprocessor.decoder_keeping_special(keep);
        let state = Streaming::new(run, attempt, prepared.stop, decoder);
        Ok(Dispatched {
            id,
            worker,
            generation: futures::stream::unfold(state, Streaming::next).boxed(),
        })
    }
}
