//! Canary checks: a short fixed prompt sent straight to each worker, greedy, with a fixed
//! seed and a few tokens, when the routing core says one is due (on a timer, sooner for an
//! idle worker, and to probe a half-open breaker). The answer, its log probabilities (from
//! a worker that reports them) and its latency go back to the core, which judges them (see
//! `switchyard_router::routing::health`).
//!
//! Canaries bypass routing and admission: they must reach the worker they check, whatever
//! its load or state, and they are too small to matter to either.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use switchyard_core::protocol::{
    EngineError, FinishReason, GenerateOutput, GenerateRequest, SamplingParams,
};
use switchyard_router::routing::health::{CanaryAnswer, Failure};
use switchyard_runtime::WorkerInstance;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{Frontend, failure_of};

/// The canary's text, tokenized by the frontend's tokenizer (a real engine must see a
/// prompt of its own vocabulary).
const CANARY_TEXT: &str = "Health check. Repeat after me: the quick brown fox";
/// The sampling seed of every canary: a deterministic engine answers the same everywhere.
const CANARY_SEED: u64 = 0x6361_6e61_7279;

/// What a canary came back with, before it is judged.
enum Answer {
    /// Its tokens (with their log probabilities, from a worker that reports them) and how
    /// long they took.
    Tokens(CanaryAnswer),
    Failed(Failure),
    /// Nothing to judge: the worker is draining, overloaded (back-pressure is not a
    /// failure), or refused the canary itself.
    Skipped(&'static str),
}

/// Sends canaries as they fall due until cancelled.
pub async fn run(frontend: Arc<Frontend>, cancel: CancellationToken) {
    let health = frontend.config.health;
    if health.canary_interval.is_zero() {
        return;
    }
    let tick = (health.canary_interval.min(health.canary_idle) / 10)
        .clamp(Duration::from_millis(10), Duration::from_secs(1));
    let mut timer = tokio::time::interval(tick);
    timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            _ = timer.tick() => {}
        }
        for instance in frontend.routing.due_canaries() {
            let frontend = Arc::clone(&frontend);
            tokio::spawn(async move { check(&frontend, instance).await });
        }
    }
}

/// Sends one canary to `instance` and reports what came back.
async fn check(frontend: &Frontend, instance: WorkerInstance) {
    let worker = instance.worker_id;
    let answer = ask(frontend, &instance).await;
    let outcome = match answer {
        Answer::Tokens(answer) => match frontend.routing.canary_finished(worker, Ok(answer)) {
            Some(failure) => {
                frontend.metrics.count_failure(worker, failure.name());
                failure.name()
            }
            None => "passed",
        },
        Answer::Failed(failure) => {
            frontend.metrics.count_failure(worker, failure.name());
            frontend.routing.canary_finished(worker, Err(failure));
            failure.name()
        }
        Answer::Skipped(why) => {
            frontend.routing.canary_skipped(worker);
            why
        }
    };
    tracing::debug!(%worker, outcome, "canary");
    frontend.metrics.count_canary(outcome);
}

async fn ask(frontend: &Frontend, instance: &WorkerInstance) -> Answer {
    let health = frontend.config.health;
    let prompt = match frontend.preprocessor.encode(CANARY_TEXT) {
        Ok(tokens) => tokens,
        Err(_) => return Answer::Skipped("skipped"),
    };
    let request = GenerateRequest {
        sampling: SamplingParams {
            temperature: Some(0.0),
            seed: Some(CANARY_SEED),
            stop_token_ids: frontend.preprocessor.eos_token_ids().to_vec(),
            // The generated tokens' own: logits that drift show there before they change
            // a greedy token.
            logprobs: instance.logprobs.then_some(0),
            ..SamplingParams::default()
        },
        ..GenerateRequest::text(frontend.side_id(), prompt, health.canary_max_tokens)
    };
    let started = Instant::now();
    let run = async {
        let mut stream = match frontend.requests.generate(instance, request).await {
            Ok(stream) => stream,
            Err(e) => return judge_error(&e),
        };
        let mut tokens = Vec::new();
        let mut logprobs = Vec::new();
        let progress = frontend.routing.progress(instance.worker_id);
        while let Some(item) = stream.next().await {
            match item {
                Ok(GenerateOutput::Tokens {
                    token_ids,
                    logprobs: reported,
                    ..
                }) => {
                    progress.mark(Instant::now());
                    tokens.extend(token_ids);
                    logprobs.extend(reported.iter().map(|l| l.logprob));
                }
                Ok(GenerateOutput::Finished { reason, .. }) => {
                    return match reason {
                        FinishReason::Length | FinishReason::Stop => Answer::Tokens(CanaryAnswer {
                            tokens,
                            logprobs,
                            latency: started.elapsed(),
                        }),
                        FinishReason::Cancelled => Answer::Skipped("cancelled"),
                    };
                }
                Ok(_) => return Answer::Failed(Failure::ServerError),
                Err(e) => return judge_error(&e),
            }
        }
        Answer::Failed(Failure::Disconnected)
    };
    // A canary queues behind the prompts routed to the worker, those sent before it and
    // those that overtake it: while the worker's timing model predicts prefill still queued
    // there, the wait goes on by that much and its timeout again, up to the first-token
    // timeout beyond its own (as a stream's first token waits). Without this, an engine busy
    // with a burst of long prompts (the CPU engine holds a queue for seconds) failed its
    // canaries and was taken out for being busy. (Its latency is then not judged either:
    // see `canary_under_load`.)
    let routing = &frontend.routing;
    let limit = health.canary_timeout + routing.first_token_timeout();
    let deadline = tokio::time::sleep(health.canary_timeout);
    tokio::pin!(deadline);
    tokio::pin!(run);
    loop {
        tokio::select! {
            answer = &mut run => return answer,
            () = &mut deadline => {
                let queued = routing.queued_prefill_time(instance.worker_id);
                let waited = started.elapsed();
                if queued.is_zero() || waited >= limit {
                    return Answer::Failed(Failure::CanaryTimeout);
                }
                // The queue's predicted end, then its own timeout again.
                let more = (queued + health.canary_timeout).min(limit - waited);
                deadline.as_mut().reset(tokio::time::Instant::now() + more);
            }
        }
    }
}

fn judge_error(error: &EngineError) -> Answer {
    match (failure_of(error), error) {
        (Some(failure), _) => Answer::Failed(failure),
        (None, EngineError::Stopping) => Answer::Skipped("draining"),
        (None, EngineError::Overloaded(_)) => Answer::Skipped("overloaded"),
        (None, _) => Answer::Skipped("refused"),
    }
}
