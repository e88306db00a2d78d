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
use std::time::Instant;

use futures::StreamExt;
use futures::stream::BoxStream;
use switchyard_core::protocol::{FinishReason, GenerateOutput, GenerateRequest, SamplingParams};
use switchyard_core::{RequestId, Token, WorkerId};
use switchyard_router::RoutingOverrides;
use switchyard_runtime::{RequestPlane, RequestPlaneError, ResponseStream};

use crate::admission::Admission;
use crate::config::FrontendConfig;
use crate::metrics::Metrics;
use crate::openai::ApiError;
use crate::openai::request::Priority;
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
    pub admission: Admission,
    pub requests: Arc<dyn RequestPlane>,
    pub metrics: Metrics,
    next_id: AtomicU64,
}

/// A validated request, tokenized.
#[derive(Debug, Clone)]
pub struct Prepared {
    pub token_ids: Vec<Token>,
    pub max_tokens: u32,
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    pub priority: Priority,
    pub overrides: RoutingOverrides,
}

/// A piece of a response.
#[derive(Debug, Clone, PartialEq)]
pub enum Piece {
    Text(String),
    Finished { reason: &'static str, usage: Usage },
}

/// A response stream. It always ends with `Finished` or an error.
pub type Generation = BoxStream<'static, Result<Piece, ApiError>>;

impl Frontend {
    pub fn new(
        config: FrontendConfig,
        preprocessor: Arc<Preprocessor>,
        routing: Arc<RoutingService>,
        requests: Arc<dyn RequestPlane>,
    ) -> Self {
        let admission = Admission::new(config.admission);
        Frontend {
            config,
            preprocessor,
            routing,
            admission,
            requests,
            metrics: Metrics::default(),
            // Ids only need to be unique per engine; a random start keeps several frontends
            // sharing workers apart.
            next_id: AtomicU64::new(rand::random::<u64>() >> 1),
        }
    }

    /// Admits, routes and dispatches a request; returns its id and response stream.
    pub async fn generate(
        self: &Arc<Self>,
        prepared: Prepared,
    ) -> Result<(RequestId, Generation), ApiError> {
        // Time to first token and request duration count from here, queueing included.
        let arrived = Instant::now();
        let retry = self.config.admission.retry_after;
        // Nothing to wait for: fail at once rather than queue.
        if self.routing.worker_count() == 0 {
            return Err(ApiError::unavailable(
                "No worker serves this model right now.",
                retry,
            ));
        }
        self.metrics.queued.set(self.admission.queued() as i64 + 1);
        let admitted = self.admission.admit(prepared.priority, &self.routing).await;
        self.metrics.queued.set(self.admission.queued() as i64);
        admitted?;

        let id = RequestId(self.next_id.fetch_add(1, Ordering::Relaxed));
        let prompt_tokens = prepared.token_ids.len() as u32;
        // A worker that cannot be reached has produced nothing yet: try another, a few
        // times, before failing the request.
        let mut failed: Vec<WorkerId> = Vec::new();
        let (engine, guard) = loop {
            let decided = Instant::now();
            let routed = self
                .routing
                .route(id, &prepared.token_ids, prepared.overrides, &failed)
                .map_err(|e| match e {
                    RouteFailure::NoWorkers => {
                        ApiError::unavailable("No worker serves this model right now.", retry)
                    }
                    RouteFailure::Invalid(message) => ApiError::internal(message),
                })?;
            self.metrics
                .routing_decision
                .observe(decided.elapsed().as_secs_f64());
            // From here on the request holds a router slot, released by the guard.
            let guard = InFlight::new(Arc::clone(self), id, arrived);
            let request = GenerateRequest {
                id,
                token_ids: prepared.token_ids.clone(),
                max_tokens: prepared.max_tokens,
                sampling: prepared.sampling.clone(),
                dp_rank: routed.decision.worker.dp_rank,
            };
            let outcome = self.requests.generate(&routed.instance, request).await;
            let reached = !matches!(
                outcome,
                Err(RequestPlaneError::Unavailable(_) | RequestPlaneError::UnknownWorker(_))
            );
            self.metrics.count_dispatch(routed.decision.worker, reached);
            match outcome {
                Ok(engine) => break (engine, guard),
                Err(RequestPlaneError::Rejected(message)) => {
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
                            format!("The worker is unavailable: {other}"),
                            retry,
                        ));
                    }
                }
            }
        };
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
        Ok((id, futures::stream::unfold(state, Streaming::next).boxed()))
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
                Some(Ok(GenerateOutput::Finished { reason, .. })) => {
                    let reason = match reason {
                        FinishReason::Length => "length",
                        FinishReason::Stop | FinishReason::Cancelled => "stop",
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
