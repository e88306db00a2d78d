//! The request pipeline: admission, routing, dispatch to a worker, and the response stream
//! (detokenized, cut at stop strings, with usage).
//!
//! Every request holds an in-flight guard from dispatch on. However the request ends
//! (finished, stopped, failed, or the client went away and the stream was dropped), the
//! guard frees the request's slot in the router; dropping the engine stream cancels the
//! request on the worker.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures::StreamExt;
use futures::stream::BoxStream;
use switchyard_core::protocol::{
    EngineError, FinishReason, GenerateOutput, GenerateRequest, Prompt, SamplingParams,
};
use switchyard_core::{Priority, RequestId, Token, WorkerId, WorkerKey};
use switchyard_router::{Rejection, RoutingOverrides};
use switchyard_runtime::{RequestPlane, ResponseStream};
use tokio::time::Instant;

use crate::config::FrontendConfig;
use crate::metrics::Metrics;
use crate::openai::ApiError;
use crate::openai::response::Usage;
use crate::preprocess::{IncrementalDecoder, Preprocessor};
use crate::routing::{RouteFailure, RoutingService};
use crate::stop::{StopCheck, StopMatcher};

/// Workers tried for one request before it fails as unavailable.
const MAX_DISPATCH_ATTEMPTS: usize = 3;

/// Everything the HTTP layer shares.
#[derive(Debug)]
pub struct Frontend {
    pub config: FrontendConfig,
    pub preprocessor: Arc<Preprocessor>,
    pub routing: Arc<RoutingService>,
    pub requests: Arc<dyn RequestPlane>,
    pub metrics: Metrics,
    next_id: AtomicU64,
}

/// A validated request, tokenized.
#[derive(Debug, Clone)]
pub struct Prepared {
    pub prompt: Prompt,
    pub max_tokens: u32,
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    pub priority: Priority,
    pub overrides: RoutingOverrides,
}

impl Prepared {
    /// A text prompt with default settings (standard priority, no stop strings).
    pub fn text(token_ids: Vec<Token>, max_tokens: u32) -> Self {
        Prepared {
            prompt: Prompt::tokens(token_ids),
            max_tokens,
            sampling: SamplingParams::default(),
            stop: Vec::new(),
            priority: Priority::Standard,
            overrides: RoutingOverrides::default(),
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

/// A request on its way: its id, the worker it was sent to, its response stream.
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
        Frontend {
            config,
            preprocessor,
            routing,
            requests,
            metrics: Metrics::default(),
            // Ids only need to be unique per engine; a random start keeps several frontends
            // sharing workers apart.
            next_id: AtomicU64::new(rand::random::<u64>() >> 1),
        }
    }

    /// Numbers the next requests from `next` on, in arrival order (for runs that must be
    /// reproducible, such as replaying a trace against the simulator).
    pub fn set_next_request_id(&self, next: u64) {
        self.next_id.store(next, Ordering::Relaxed);
    }

    /// Admits, routes and dispatches a request.
    pub async fn generate(self: &Arc<Self>, prepared: Prepared) -> Result<Dispatched, ApiError> {
        // Time to first token and request duration count from here, queueing included.
        let arrived = Instant::now();
        let id = RequestId(self.next_id.fetch_add(1, Ordering::Relaxed));
        let retry = self.config.admission.retry_after;
        let ticket = self
            .routing
            .admit(id, prepared.priority)
            .await
            .map_err(|rejection| {
                self.metrics.count_rejection(rejection);
                refused(rejection, retry)
            })?;
        let prompt_tokens = prepared.prompt.len() as u32;
        // A worker that cannot serve the request has produced nothing yet: try another, a
        // few times, before failing it.
        let mut failed: Vec<WorkerId> = Vec::new();
        let (engine, guard, worker) = loop {
            let decided = std::time::Instant::now();
            let routed = self
                .routing
                .route(id, &prepared.prompt, prepared.overrides, &failed)
                .map_err(|e| match e {
                    RouteFailure::NoWorkers => {
                        ApiError::unavailable(Rejection::NoWorkers.message(), retry)
                    }
                    RouteFailure::InvalidPrompt(message) => ApiError::invalid(message),
                    RouteFailure::Internal(message) => ApiError::internal(message),
                })?;
            self.metrics
                .routing_decision
                .observe(decided.elapsed().as_secs_f64());
            // From here on the request holds a router slot, released by the guard.
            let guard = InFlight::new(Arc::clone(self), id, arrived);
            let request = GenerateRequest {
                id,
                prompt: prepared.prompt.clone(),
                max_tokens: prepared.max_tokens,
                sampling: prepared.sampling.clone(),
                dp_rank: routed.decision.worker.dp_rank,
                resume: None,
                phase: Default::default(),
            };
            let outcome = self.requests.generate(&routed.instance, request).await;
            let reached = !matches!(outcome, Err(ref e) if e.is_worker_fault());
            self.metrics.count_dispatch(routed.decision.worker, reached);
            match outcome {
                Ok(engine) => break (engine, guard, routed.decision.worker),
                Err(EngineError::Invalid(message)) => {
                    return Err(ApiError::invalid(format!(
                        "The engine refused the request: {message}"
                    )));
                }
                Err(other) => {
                    let worker = routed.instance.worker_id;
                    tracing::warn!(%worker, error = %other, "cannot dispatch to the worker");
                    guard.retry();
                    failed.push(worker);
                    if failed.len() >= MAX_DISPATCH_ATTEMPTS {
                        return Err(ApiError::unavailable(
                            format!("No worker could take the request: {other}"),
                            retry,
                        ));
                    }
                }
            }
        };
        drop(ticket);
        self.metrics.input_tokens.inc_by(u64::from(prompt_tokens));

        let state = Streaming {
            engine: Some(engine),
            decoder: self.preprocessor.decoder(),
            stop: StopMatcher::new(prepared.stop),
            guard,
            prompt_tokens,
            completion_tokens: 0,
            cached_tokens: 0,
            last_token: None,
            out: VecDeque::new(),
            ended: false,
        };
        Ok(Dispatched {
            id,
            worker,
            generation: futures::stream::unfold(state, Streaming::next).boxed(),
        })
    }
}

/// Frees the router slot and counts the request out, however it ends.
struct InFlight {
    frontend: Arc<Frontend>,
    id: RequestId,
    started: Instant,
    /// Whether its duration counts: not for a dispatch that failed and is retried.
    observe: bool,
}

impl InFlight {
    fn new(frontend: Arc<Frontend>, id: RequestId, started: Instant) -> Self {
        frontend.metrics.in_flight.inc();
        InFlight {
            frontend,
            id,
            started,
            observe: true,
        }
    }

    /// Releases the slot of an attempt that will be retried.
    fn retry(mut self) {
        self.observe = false;
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.frontend.routing.finish(self.id);
        self.frontend.metrics.in_flight.dec();
        if self.observe {
            self.frontend
                .metrics
                .duration
                .observe(self.started.elapsed().as_secs_f64());
        }
    }
}

struct Streaming {
    engine: Option<ResponseStream>,
    decoder: IncrementalDecoder,
    stop: StopMatcher,
    guard: InFlight,
    prompt_tokens: u32,
    completion_tokens: u32,
    cached_tokens: u32,
    last_token: Option<Instant>,
    out: VecDeque<Result<Piece, ApiError>>,
    ended: bool,
}

impl Streaming {
    async fn next(mut self) -> Option<(Result<Piece, ApiError>, Self)> {
        loop {
            if let Some(piece) = self.out.pop_front() {
                return Some((piece, self));
            }
            if self.ended {
                return None;
            }
            let item = match self.engine.as_mut() {
                Some(engine) => engine.next().await,
                None => None,
            };
            match item {
                Some(Ok(GenerateOutput::Tokens {
                    token_ids,
                    cached_tokens,
                })) => self.on_tokens(&token_ids, cached_tokens),
                Some(Ok(GenerateOutput::Text { .. } | GenerateOutput::PrefillDone { .. })) => self
                    .fail("The worker answered with output this frontend does not expect.".into()),
                Some(Ok(GenerateOutput::Finished { reason, .. })) => {
                    let reason = match reason {
                        FinishReason::Length => "length",
                        FinishReason::Stop => "stop",
                        // A truncated answer is never reported as complete.
                        FinishReason::Cancelled => {
                            self.fail("The worker gave the request up before finishing it.".into());
                            continue;
                        }
                    };
                    let tail = self.decoder.finish();
                    self.emit(&tail);
                    if !self.ended {
                        let rest = self.stop.flush();
                        self.push_text(rest);
                        self.finish(reason);
                    }
                }
                Some(Err(e)) => self.fail(format!("The worker failed mid-request: {e}")),
                None => self.fail("The worker stream ended without finishing the request.".into()),
            }
        }
    }

    fn on_tokens(&mut self, tokens: &[Token], cached: Option<u32>) {
        let metrics = &self.guard.frontend.metrics;
        let now = Instant::now();
        match self.last_token {
            None => {
                metrics.observe_ttft(now - self.guard.started);
                self.guard.frontend.routing.prefill_done(self.guard.id);
                self.cached_tokens = cached.unwrap_or(0);
                metrics.cached_tokens.inc_by(u64::from(self.cached_tokens));
            }
            Some(last) => metrics.itl.observe((now - last).as_secs_f64()),
        }
        self.last_token = Some(now);
        self.completion_tokens += tokens.len() as u32;
        metrics.output_tokens.inc_by(tokens.len() as u64);
        let mut text = String::new();
        for &token in tokens {
            match self.decoder.push(token) {
                Ok(piece) => text.push_str(&piece),
                Err(e) => return self.fail(format!("Cannot decode the output: {e}")),
            }
        }
        self.emit(&text);
    }

    /// Passes text through the stop strings; a stop ends the response.
    fn emit(&mut self, text: &str) {
        match self.stop.push(text) {
            StopCheck::Emit(out) => self.push_text(out),
            StopCheck::Stopped(out) => {
                self.push_text(out);
                // Dropping the engine stream cancels the request on the worker.
                self.engine = None;
                self.finish("stop");
            }
        }
    }

    fn push_text(&mut self, text: String) {
        if !text.is_empty() {
            self.out.push_back(Ok(Piece::Text(text)));
        }
    }

    fn finish(&mut self, reason: &'static str) {
        let usage = Usage::new(
            self.prompt_tokens,
            self.completion_tokens,
            self.cached_tokens,
        );
        self.out.push_back(Ok(Piece::Finished { reason, usage }));
        self.ended = true;
        self.engine = None;
    }

    fn fail(&mut self, message: String) {
        tracing::warn!(request = %self.guard.id, %message, "request failed");
        self.out.push_back(Err(ApiError::internal(message)));
        self.ended = true;
        self.engine = None;
    }
}
