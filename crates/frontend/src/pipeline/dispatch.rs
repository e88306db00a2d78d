//! One request's attempts: routing it away from workers that failed it, sending it with a
//! deadline, and trying another worker (after a backoff while nothing was generated) when
//! one cannot take it.

use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use switchyard_core::protocol::{
    EngineError, GenerateRequest, Phase, Prompt, Resume, SamplingParams,
};
use switchyard_core::{RequestId, Token, WorkerId, WorkerKey};
use switchyard_router::routing::health::Failure;
use switchyard_router::{Rejection, RoutingOverrides};
use switchyard_runtime::ResponseStream;
use tokio::sync::watch;
use tokio::time::Instant;

use super::{Frontend, Prepared, failure_of};
use crate::openai::ApiError;
use crate::routing::{Progress, RouteFailure};

/// One worker's stream of a request.
pub(super) struct Attempt {
    pub(super) worker: WorkerKey,
    pub(super) stream: ResponseStream,
    /// Changes when the worker is found unhealthy.
    pub(super) outage: watch::Receiver<u64>,
    /// Where its tokens mark the worker's progress.
    pub(super) progress: Progress,
}

/// Why a request leaves a worker.
#[derive(Debug, Clone, Copy)]
pub(super) enum Leave {
    /// A failure of the worker's, to count against it.
    Failed(Failure),
    /// A failure already counted.
    Counted(Failure),
    /// The worker was found unhealthy (by another request or a canary).
    Outage,
    /// The worker gave the request up (it is stopping).
    Cancelled,
}

impl Leave {
    pub(super) fn name(self) -> &'static str {
        match self {
            Leave::Failed(f) | Leave::Counted(f) => f.name(),
            Leave::Outage => "outage",
            Leave::Cancelled => "cancelled",
        }
    }
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
    /// Workers that failed this request: not tried again.
    pub(super) failed: Vec<WorkerId>,
    /// Moves to another worker after the first dispatch (before or after its first token).
    pub(super) moves: u32,
    /// Frees the request's router slot and counts it out, however it ends.
    guard: Option<InFlight>,
    tenant: Option<Arc<str>>,
    /// The request's trace span.
    pub(super) span: tracing::Span,
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

impl RequestRun {
    pub(super) fn new(
        frontend: Arc<Frontend>,
        id: RequestId,
        prepared: &Prepared,
        arrived: Instant,
    ) -> Self {
        RequestRun {
            frontend,
            id,
            prompt: prepared.prompt.clone(),
            max_tokens: prepared.max_tokens,
            sampling: prepared.sampling.clone(),
            overrides: prepared.overrides,
            arrived,
            generated: Vec::new(),
            failed: Vec::new(),
            moves: 0,
            guard: None,
            tenant: prepared.tenant.clone(),
            span: prepared.span.clone(),
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

    /// The wait before the `retry`-th retry of a request that produced nothing yet.
    fn backoff(&self, retry: u32) -> Duration {
        let m = &self.frontend.config.migration;
        let base = m
            .backoff_initial
            .mul_f64(m.backoff_factor.powi(retry.saturating_sub(1) as i32))
            .min(m.backoff_max);
        let jitter = if m.backoff_jitter > 0.0 {
            rand::rng().random_range(-m.backoff_jitter..=m.backoff_jitter)
        } else {
            0.0
        };
        base.mul_f64(1.0 + jitter)
    }

    /// Routes and sends the request (resumed after what was generated, if anything),
    /// trying other workers when one cannot take it.
    pub(super) async fn dispatch(&mut self) -> Result<Attempt, ApiError> {
        let frontend = Arc::clone(&self.frontend);
        let config = frontend.config.migration;
        let retry_after = frontend.config.admission.retry_after;
        let mut tries = 0u32;
        // While every worker tried said it cannot serve this request (too large for its
        // cache, a feature it lacks): what the last one said.
        let mut unservable: Option<String> = None;
        let give_up = |unservable: &Option<String>, otherwise: ApiError| match unservable {
            Some(message) => {
                ApiError::unservable(format!("No worker can serve this request: {message}"))
            }
            None => otherwise,
        };
        loop {
            if tries > 0 && self.generated.is_empty() && unservable.is_none() {
                tokio::time::sleep(self.backoff(tries)).await;
            }
            tries += 1;
            let prompt = self.current_prompt();
            let decided = std::time::Instant::now();
            let route_span = tracing::info_span!(parent: &self.span, "route", attempt = tries);
            let routed = route_span
                .in_scope(|| {
                    frontend
                        .routing
                        .route(self.id, &prompt, self.overrides, &self.failed)
                })
                .map_err(|e| match e {
                    RouteFailure::NoWorkers if self.failed.is_empty() => {
                        ApiError::unavailable(Rejection::NoWorkers.message(), retry_after)
                    }
                    RouteFailure::NoWorkers => give_up(
                        &unservable,
                        ApiError::unavailable(
                            "No other worker can take the request now.",
                            retry_after,
                        ),
                    ),
                    RouteFailure::InvalidPrompt(message) => ApiError::invalid(message),
                    RouteFailure::Internal(message) => ApiError::internal(message),
                })?;
            frontend
                .metrics
                .routing_decision
                .observe(decided.elapsed().as_secs_f64());
            // From here on the request holds a router slot, released by the guard.
            if self.guard.is_none() {
                self.guard = Some(InFlight::new(Arc::clone(&frontend), self.id, self.arrived));
            }
            let worker = routed.decision.worker;
            let generated = self.generated.len() as u32;
            let request = GenerateRequest {
                id: self.id,
                prompt,
                max_tokens: self.max_tokens.saturating_sub(generated).max(1),
                sampling: self.sampling.clone(),
                dp_rank: worker.dp_rank,
                resume: (generated > 0).then_some(Resume { generated }),
                phase: Phase::Aggregated,
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
                ) => sent,
                // The worker was found unhealthy meanwhile: do not wait on it.
                Ok(()) = outage.changed() => Ok(Err(EngineError::Unreachable(
                    "the worker was found unhealthy".into(),
                ))),
            };
            let error = match sent {
                Ok(Ok(stream)) => {
                    frontend.metrics.count_dispatch(worker, true);
                    return Ok(Attempt {
                        worker,
                        stream,
                        outage,
                        progress: frontend.routing.progress(worker.worker_id),
                    });
                }
                Ok(Err(EngineError::Invalid(message))) => {
                    frontend.routing.finish(self.id);
                    return Err(ApiError::invalid(format!(
                        "The engine refused the request: {message}"
                    )));
                }
                Ok(Err(error)) => error,
                Err(_) => EngineError::Unreachable(format!(
                    "no answer within {:?}",
                    config.dispatch_timeout
                )),
            };
            frontend.routing.finish(self.id);
            frontend.metrics.count_dispatch(worker, false);
            tracing::warn!(worker = %worker.worker_id, %error, "cannot dispatch to the worker");
            if let Some(failure) = failure_of(&error) {
                frontend.report_failure(worker.worker_id, failure);
            }
            unservable = match (&error, tries) {
                (EngineError::Unsupported(message), 1) => Some(message.clone()),
                (EngineError::Unsupported(message), _) if unservable.is_some() => {
                    Some(message.clone())
                }
                _ => None,
            };
            self.failed.push(worker.worker_id);
            if tries >= config.max_dispatch_attempts {
                return Err(give_up(
                    &unservable,
                    ApiError::unavailable(
                        format!("No worker could take the request: {error}"),
                        retry_after,
                    ),
                ));
            }
        }
    }

    /// Gives the request up on `worker` and counts the move (or refuses it: the request's
    /// own limit, or the fleet's budget). The caller dispatches again.
    pub(super) fn leave(&mut self, worker: WorkerKey, why: Leave) -> Result<(), ApiError> {
        let frontend = &self.frontend;
        frontend.routing.finish(self.id);
        if let Leave::Failed(failure) = why {
            frontend.report_failure(worker.worker_id, failure);
        }
        self.failed.push(worker.worker_id);
        if self.moves >= frontend.config.migration.max_migrations {
            frontend.metrics.count_migration("limit");
            return Err(ApiError::interrupted(format!(
                "The request failed on {} workers; it cannot be moved again.",
                self.moves + 1
            )));
        }
        if !frontend.spend_migration() {
            frontend.metrics.count_migration("budget");
            return Err(ApiError::interrupted(
                "Too many requests are being moved between workers; this one cannot be.",
            ));
        }
        self.moves += 1;
        frontend.metrics.count_migration(why.name());
        Ok(())
    }

    /// The request completed on `worker`.
    pub(super) fn succeeded(&self, worker: WorkerKey) {
        self.frontend.routing.report_success(worker.worker_id);
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
            .duration
            .observe(self.started.elapsed().as_secs_f64());
    }
}
