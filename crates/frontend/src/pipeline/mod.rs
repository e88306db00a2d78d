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
mod stream;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures::StreamExt;
use futures::stream::BoxStream;
use parking_lot::Mutex;
use switchyard_core::protocol::{EngineError, Prompt, SamplingParams};
use switchyard_core::{Priority, RequestId, Token, WorkerKey};
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
    /// Migrations the fleet may still spend (see `MigrationConfig`).
    migration_budget: Mutex<f64>,
    /// API keys; empty: the API is open.
    pub keys: KeyTable,
    /// Media in requests: fetched, decoded and prepared off the async threads.
    pub media: crate::media::MediaStage,
    /// Which media items' encoded features exist (see [`crate::features`]).
    pub features: Arc<crate::features::SharedFeatureStore>,
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
        }
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
        }
    }
}

/// A piece of a response.
#[derive(Debug, Clone, PartialEq)]
pub enum Piece {
    Text(String),
    Finished { reason: &'static str, usage: Usage },
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

/// How an error from a worker counts against it, if at all: back-pressure and invalid
/// requests never do.
pub(crate) fn failure_of(error: &EngineError) -> Option<Failure> {
    match error {
        EngineError::Unreachable(_) => Some(Failure::Unreachable),
        EngineError::Disconnected => Some(Failure::Disconnected),
        EngineError::Internal(_) => Some(Failure::ServerError),
        EngineError::Stopping
        | EngineError::Overloaded(_)
        | EngineError::Unsupported(_)
        | EngineError::KvLost(_)
        | EngineError::OutOfMemory(_)
        | EngineError::Invalid(_) => None,
    }
}

/// A worker's error with how it counts against the worker ([`failure_of`]).
pub(crate) fn counted(error: EngineError) -> (EngineError, Option<Failure>) {
    let failure = failure_of(&error);
    (error, failure)
}

/// The API error an admission refusal becomes.
fn refused(rejection: Rejection, retry_after: std::time::Duration) -> ApiError {
    match rejection.status() {
        429 => ApiError::overloaded(rejection.message(), retry_after),
        _ => ApiError::unavailable(rejection.message(), retry_after),
    }
}

impl Frontend {
    pub fn new(
        config: FrontendConfig,
        preprocessor: Arc<Preprocessor>,
        routing: Arc<RoutingService>,
        requests: Arc<dyn RequestPlane>,
    ) -> Self {
        let budget = config.migration.budget_max;
        let metrics = Metrics::new(routing.model());
        let media = crate::media::MediaStage::new(config.multimodal.clone());
        let features =
            crate::features::SharedFeatureStore::new(&config.multimodal.feature_store, &metrics);
        Frontend {
            media,
            features,
            config,
            preprocessor,
            routing,
            requests,
            metrics,
            // Ids only need to be unique per engine; a random start keeps several frontends
            // sharing workers apart.
            next_id: AtomicU64::new(rand::random::<u64>() >> 1),
            migration_budget: Mutex::new(budget),
            keys: KeyTable::default(),
        }
    }

    /// Requires API keys from the public API (see [`crate::auth`]).
    pub fn with_keys(mut self, keys: KeyTable) -> Self {
        self.keys = keys;
        self
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

    /// A stream on `worker` got no token for `waited` (see
    /// [`RoutingService::report_stall`]).
    pub fn report_stall(
        &self,
        worker: switchyard_core::WorkerId,
        waited: std::time::Duration,
    ) -> Failure {
        let failure = self.routing.report_stall(worker, waited);
        self.metrics.count_failure(worker, failure.name());
        failure
    }

    /// Takes one migration from the fleet-wide budget, if any is left.
    fn spend_migration(&self) -> bool {
        let mut budget = self.migration_budget.lock();
        if *budget >= 1.0 {
            *budget -= 1.0;
            true
        } else {
            false
        }
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
        {
            let m = &self.config.migration;
            let cap = m.budget_max.max(self.metrics.in_flight.get() as f64);
            let mut budget = self.migration_budget.lock();
            *budget = (*budget + m.budget_ratio).min(cap);
        }
        let prompt_tokens = prepared.prompt.len() as u32;
        prepared.span.record("prompt_tokens", prompt_tokens);
        let mut run = RequestRun::new(Arc::clone(self), id, &prepared, arrived);
        let attempt = run.dispatch().await?;
        drop(ticket);
        self.metrics.input_tokens.inc_by(u64::from(prompt_tokens));
        if let Some(tenant) = prepared.tenant.as_ref().filter(|_| prepared.choice == 0) {
            self.metrics
                .count_tenant_tokens(tenant, "prompt", u64::from(prompt_tokens));
        }
        let worker = attempt.worker;
        let state = Streaming::new(run, attempt, prepared.stop, self.preprocessor.decoder());
        Ok(Dispatched {
            id,
            worker,
            generation: futures::stream::unfold(state, Streaming::next).boxed(),
        })
    }
}
