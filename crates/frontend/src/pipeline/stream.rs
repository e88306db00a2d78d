//! The response stream: tokens from the current worker, detokenized and cut at stop
//! strings; when the worker fails, the request moves on (see the module above).
//!
//! A stream watches three things at once: the worker's items, a stall deadline (the first
//! token's timeout, then the worker's stall timeout, reset at each token), and the worker's
//! outage signal (it was found unhealthy, by another request or a canary).

use std::collections::VecDeque;
use std::pin::Pin;
use std::time::Duration;

use futures::StreamExt;
use switchyard_core::protocol::{
    EngineError, FinishReason, GenerateOutput, TextLogprob, TokenLogprobs,
};
use switchyard_core::{Token, WorkerId, WorkerKey};
use switchyard_router::routing::health::Failure;
use tokio::time::{Instant, Sleep};

use switchyard_router::flow::{Event, Leave, Step, stall};

use super::dispatch::{Attempt, RequestRun};
use super::scored::Pending;
use super::{Piece, PipelineShell, Scored};
use crate::openai::ApiError;
use crate::openai::response::Usage;
use crate::preprocess::IncrementalDecoder;
use crate::stop::{StopCheck, StopMatcher};

/// Tokens between two refreshes of the worker's stall timeout and its inter-token
/// average (both take the routing core's lock).
const SAMPLE_EVERY: u32 = 8;

/// What ended a wait.
enum Woken {
    Item(Option<Result<GenerateOutput, EngineError>>),
    Stalled,
    Outage,
    OutageClosed,
    /// The request went ahead of its media, and where they stand changed (false: the
    /// encoding ended without a word).
    Media(bool),
}

pub(super) struct Streaming {
    run: RequestRun,
    attempt: Option<Attempt>,
    /// Whether the current worker's outage signal can still fire (it closes when the
    /// worker leaves: a worker that drains finishes its streams).
    outage_open: bool,
    /// Outputs that carried the current attempt's tokens.
    attempt_items: u32,
    stall: Duration,
    deadline: Pin<Box<Sleep>>,
    /// When the current attempt replaced a failed one (for the migration latency).
    moved_at: Option<Instant>,
    decoder: IncrementalDecoder,
    /// Open from the first dispatch to the first token (the trace's time-to-first-token).
    first_token_span: Option<tracing::Span>,
    stop: StopMatcher,
    prompt_tokens: u32,
    cached_tokens: Option<u32>,
    last_token: Option<Instant>,
    out: VecDeque<Result<Piece, ApiError>>,
    ended: bool,
    /// The attempt's first token came from a remote prefill and its second, from the
    /// decode worker, is still to come (after the KV transfer).
    handoff: bool,
    /// The worker of the latest attempt.
    last_worker: Option<WorkerKey>,
    /// Log probabilities whose token's text has not all gone out yet.
    scored: Pending,
}

impl Streaming {
    pub(super) fn new(
        run: RequestRun,
        attempt: Attempt,
        stop: Vec<String>,
        decoder: IncrementalDecoder,
    ) -> Self {
        let first_token = run.frontend.routing.first_token_timeout();
        let prompt_tokens = run.prompt_tokens();
        let mut streaming = Streaming {
            run,
            attempt: None,
            outage_open: true,
            attempt_items: 0,
            stall: first_token,
            deadline: Box::pin(tokio::time::sleep(first_token)),
            moved_at: None,
            decoder,
            first_token_span: None,
            stop: StopMatcher::new(stop),
            prompt_tokens,
            cached_tokens: None,
            last_token: None,
            out: VecDeque::new(),
            ended: false,
            handoff: false,
            last_worker: None,
            scored: Pending::default(),
        };
        streaming.start(attempt);
        streaming
    }

    fn start(&mut self, attempt: Attempt) {
        if self.last_token.is_none() {
            self.first_token_span = Some(tracing::info_span!(
                parent: &self.run.span,
                "first_token",
                worker = %attempt.worker.worker_id,
            ));
        }
        // The first token is late once the timeout has passed beyond when the worker's
        // timing model predicts it (the prefill queued there, this request's included): a
        // slow engine with prompts queued is not a hung one. The extension is at most the
        // timeout again, so a wrong model cannot hide a hang for long.
        let routing = &self.run.frontend.routing;
        let timeout = stall::first_token_wait(
            routing.first_token_timeout(),
            routing.queued_prefill_time(attempt.worker.worker_id),
        );
        self.deadline.as_mut().reset(Instant::now() + timeout);
        self.stall = timeout;
        self.handoff = attempt.handoff;
        self.last_worker = Some(attempt.worker);
        self.attempt = Some(attempt);
        self.outage_open = true;
        self.attempt_items = 0;
    }

    pub(super) async fn next(mut self) -> Option<(Result<Piece, ApiError>, Self)> {
        loop {
            if let Some(piece) = self.out.pop_front() {
                return Some((piece, self));
            }
            if self.ended {
                return None;
            }
            if self.attempt.is_none() {
                match self.run.dispatch().await {
                    Ok(attempt) => self.start(attempt),
                    Err(e) => self.fail(e),
                }
                continue;
            }
            let woken = self.wait().await;
            let Some(worker) = self.attempt.as_ref().map(|a| a.worker) else {
                continue;
            };
            match woken {
                Woken::Item(Some(Ok(GenerateOutput::Tokens {
                    token_ids,
                    cached_tokens,
                    logprobs,
                }))) => self.on_tokens(&token_ids, cached_tokens, None, &logprobs),
                // An engine that streams text (an OpenAI-compatible upstream): its tokens
                // are counted (and kept, for a move to another worker) by tokenizing it.
                Woken::Item(Some(Ok(GenerateOutput::Text {
                    text,
                    cached_tokens,
                    logprobs,
                    ..
                }))) => match self.run.frontend.preprocessor.encode(&text) {
                    Ok(token_ids) => {
                        let text = Some((text.as_str(), logprobs));
                        self.on_tokens(&token_ids, cached_tokens, text, &[])
                    }
                    Err(e) => self.fail(ApiError::internal(format!(
                        "Cannot tokenize the worker's output: {e}"
                    ))),
                },
                Woken::Item(Some(Ok(GenerateOutput::Finished {
                    reason,
                    cached_tokens,
                    ..
                }))) => match reason {
                    FinishReason::Length | FinishReason::Stop => {
                        self.learn_cached(cached_tokens);
                        self.succeeded(worker.worker_id);
                        self.complete(reason);
                    }
                    // The engine gave the request up (it is stopping): a truncated answer
                    // is never reported as complete; it goes on elsewhere.
                    FinishReason::Cancelled => self.move_on(Leave::Cancelled),
                },
                Woken::Item(Some(Ok(GenerateOutput::PromptLogprobs { logprobs })))
                    if self.run.sampling.prompt_logprobs.is_some() =>
                {
                    self.on_prompt_logprobs(logprobs)
                }
                Woken::Item(Some(Ok(
                    GenerateOutput::PrefillDone { .. }
                    | GenerateOutput::Features { .. }
                    | GenerateOutput::PromptLogprobs { .. },
                ))) => self.fail(ApiError::internal(
                    "The worker answered with output this frontend does not expect.",
                )),
                Woken::Item(Some(Err(error))) => {
                    let worker_id = worker.worker_id;
                    let event = Event::StreamError {
                        worker: worker_id,
                        error: &error,
                    };
                    self.leave(worker, why_of(&error), event)
                }
                // The stream ended without finishing: the worker was lost.
                Woken::Item(None) => self.move_on(Leave::Failed(Failure::Disconnected)),
                Woken::Stalled => {
                    if self.wait_for_queue(worker.worker_id) {
                        continue;
                    }
                    let waited = match self.last_token {
                        Some(last) if self.run.life.attempt_tokens() > 0 => last.elapsed(),
                        _ => self.stall,
                    };
                    let worker_idle = self.run.frontend.routing.progress(worker.worker_id).idle();
                    let event = Event::Stalled {
                        worker: worker.worker_id,
                        waited,
                        worker_idle,
                    };
                    self.leave(worker, "stalled", event);
                }
                // Already counted against the worker by whoever found it unhealthy.
                Woken::Outage => self.move_on(Leave::Outage),
                Woken::OutageClosed => self.outage_open = false,
                Woken::Media(ok) => self.on_media(ok).await,
            }
        }
    }

    /// Where the request's media stand changed while its worker waits for them (`ok`
    /// false: their encoding ended without a word). Ready: the worker is told, and the
    /// first token's deadline starts (once their staging memory is found). Dropped (text
    /// only): the request is sent again without them. Failed: so is the request.
    async fn on_media(&mut self, ok: bool) {
        let outcome = if ok {
            self.run.media_pending()
        } else {
            self.run
                .media_failed(super::dispatch::MEDIA_LOST.to_owned())
                .map(|()| Some(false))
        };
        match outcome {
            Ok(Some(true)) => {}
            Ok(_)
                if self.attempt.as_ref().is_some_and(|a| {
                    a.prompt_version != self.run.prompt_version()
                        || a.media_on.as_ref().is_some_and(|i| i.media_embeddings)
                }) =>
            {
                // Its worker has the prompt as it was (the media encoded smaller since, or
                // dropped), or it merges the media's embeddings, which go with the request:
                // it goes again with the new one (dropping the attempt cancels it there;
                // the text computed meanwhile is in its prefix cache).
                self.attempt = None;
                let frontend = std::sync::Arc::clone(&self.run.frontend);
                self.run
                    .life
                    .step(Event::PromptChanged, &mut PipelineShell(&frontend));
                self.prompt_tokens = self.run.prompt_tokens();
            }
            Ok(_) => {
                if self.attempt.as_ref().is_none_or(|a| a.media_on.is_none()) {
                    return;
                }
                // The worker waits for them meanwhile: no first token is due.
                if let Err(e) = self.run.stage_media().await {
                    return self.fail(e);
                }
                let Some(instance) = self.attempt.as_mut().and_then(|a| a.media_on.take()) else {
                    return;
                };
                let frontend = std::sync::Arc::clone(&self.run.frontend);
                let id = self.run.id;
                frontend.routing.media_ready(id);
                tokio::spawn(async move {
                    match frontend.requests.media_ready(&instance, id).await {
                        Ok(held) => {
                            tracing::debug!(request = %id, worker = %instance.worker_id, held, "media ready")
                        }
                        // The worker is gone or failing: its stream says so.
                        Err(error) => {
                            tracing::warn!(request = %id, worker = %instance.worker_id, %error, "cannot tell the worker the media are ready")
                        }
                    }
                });
                self.deadline.as_mut().reset(Instant::now() + self.stall);
            }
            Err(e) => self.fail(e),
        }
    }

    /// Waits for the worker's next item, the stall deadline, or the worker's outage.
    async fn wait(&mut self) -> Woken {
        let Streaming {
            run,
            attempt,
            deadline,
            outage_open,
            ..
        } = self;
        let Some(attempt) = attempt.as_mut() else {
            return Woken::Item(None);
        };
        // While the worker waits for the request's media, its first token is not late.
        let waiting_on_media = attempt.media_on.is_some();
        let media_changed = async {
            match &mut run.media {
                Some(media) if waiting_on_media => media.changed().await.is_ok(),
                _ => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            item = attempt.stream.next() => Woken::Item(item),
            changed = attempt.outage.changed(), if *outage_open => match changed {
                Ok(()) => Woken::Outage,
                Err(_) => Woken::OutageClosed,
            },
            ok = media_changed => Woken::Media(ok),
            () = deadline.as_mut(), if !waiting_on_media => Woken::Stalled,
        }
    }

    /// The stall deadline passed with tokens already streamed: if the worker still has
    /// prefill queued (a burst of prompts, such as requests moved to it from a failed
    /// worker, holds its decodes back), waits as long as it is predicted to take, up to the
    /// first-token timeout since the last token. Returns whether the wait goes on.
    fn wait_for_queue(&mut self, worker: WorkerId) -> bool {
        let Some(last) = self
            .last_token
            .filter(|_| self.run.life.attempt_tokens() > 0)
        else {
            return false;
        };
        let routing = &self.run.frontend.routing;
        let extra = stall::extra_wait(
            last.elapsed(),
            routing.queued_prefill_time(worker),
            routing.first_token_timeout(),
        );
        match extra {
            Some(wait) => {
                self.deadline.as_mut().reset(Instant::now() + wait);
                true
            }
            None => false,
        }
    }

    /// The generation ended (`Length` or `Stop`): the rest of the text goes out, then the
    /// last chunk.
    fn complete(&mut self, reason: FinishReason) {
        let tail = self.decoder.finish();
        self.emit(&tail);
        if !self.ended {
            let rest = self.stop.flush();
            self.push_text(rest);
            // What is left decoded to nothing (an end-of-sequence token).
            let scored = self.scored.rest();
            if !scored.is_empty() {
                self.out.push_back(Ok(Piece::Text {
                    text: String::new(),
                    scored,
                }));
            }
            self.finish(if reason == FinishReason::Length {
                "length"
            } else {
                "stop"
            });
        }
    }

    /// Leaves the current worker for `why`; the next round dispatches elsewhere.
    fn move_on(&mut self, why: Leave) {
        let Some(worker) = self.attempt.as_ref().map(|a| a.worker) else {
            return;
        };
        let left = Event::Left {
            worker: worker.worker_id,
            why,
        };
        self.leave(worker, why.name(), left);
    }

    /// Leaves the current worker as its life decides (told `event`, for a reason named `why`):
    /// the request moves on (the next round dispatches elsewhere), or fails if it may not
    /// move again. A request whose tokens all arrived (the worker was lost between its
    /// last token and its `Finished`) is complete instead: moved, it would be asked for a
    /// token past its end.
    fn leave(&mut self, worker: WorkerKey, why: &'static str, event: Event<'_>) {
        // Dropping its stream cancels the request on that worker, if it is still there.
        self.attempt = None;
        let frontend = std::sync::Arc::clone(&self.run.frontend);
        match self.run.life.step(event, &mut PipelineShell(&frontend)) {
            Step::Finish(reason) => {
                tracing::info!(
                    request = %self.run.id,
                    worker = %worker.worker_id,
                    why,
                    "the worker was lost after the request's last token: it is complete"
                );
                self.complete(reason);
            }
            Step::Move => {
                tracing::warn!(
                    request = %self.run.id,
                    worker = %worker.worker_id,
                    why,
                    delivered = self.run.generated.len(),
                    "moving a request to another worker"
                );
                frontend.metrics.count_migration(why);
                self.moved_at = Some(Instant::now());
            }
            Step::GiveUp(give_up) => self.fail(self.run.given_up(give_up)),
            step => self.fail(super::dispatch::unexpected(step)),
        }
    }

    /// The request completed on `worker`.
    fn succeeded(&mut self, worker: WorkerId) {
        let frontend = std::sync::Arc::clone(&self.run.frontend);
        self.run
            .life
            .step(Event::Finished { worker }, &mut PipelineShell(&frontend));
    }

    /// New output: its tokens, and its text when the engine sent text (else it is decoded
    /// from the tokens), and their log probabilities when the engine sent them.
    fn on_tokens(
        &mut self,
        tokens: &[Token],
        cached: Option<u32>,
        text: Option<(&str, Vec<TextLogprob>)>,
        logprobs: &[TokenLogprobs],
    ) {
        let frontend = std::sync::Arc::clone(&self.run.frontend);
        let metrics = &frontend.metrics;
        let now = Instant::now();
        let Some(attempt) = self.attempt.as_ref() else {
            return;
        };
        let worker = attempt.worker;
        attempt.progress.mark(now);
        let step = self
            .run
            .life
            .step(Event::Tokens(tokens), &mut PipelineShell(&frontend));
        if step == Step::Prefilled {
            // This worker has computed the (possibly resumed) prompt, media included.
            self.run.media_prefilled();
            if let Some(moved) = self.moved_at.take() {
                metrics
                    .migration_latency
                    .observe((now - moved).as_secs_f64());
            }
        } else if let Some(last) = self.last_token
            && self.attempt_items.is_multiple_of(SAMPLE_EVERY)
        {
            frontend.routing.report_gap(worker.worker_id, now - last);
        }
        match self.last_token {
            None => {
                let ttft = now - self.run.arrived;
                // Closing it ends the first-token wait in the trace.
                self.first_token_span = None;
                self.run.span.record("ttft_ms", ttft.as_secs_f64() * 1e3);
                metrics.observe_ttft(ttft);
                frontend.routing.report_ttft(ttft);
                self.learn_cached(cached);
            }
            Some(last) => metrics.observe_itl(now - last),
        }
        if self.attempt_items.is_multiple_of(SAMPLE_EVERY) {
            self.stall = frontend.routing.stall_timeout(worker.worker_id);
        }
        self.attempt_items += 1;
        if std::mem::take(&mut self.handoff) {
            // The decode worker pulls the KV before its first token: a first token's wait.
            let first = frontend.routing.first_token_timeout();
            self.deadline.as_mut().reset(now + first);
        } else {
            self.deadline.as_mut().reset(now + self.stall);
        }
        self.last_token = Some(now);
        self.run.generated.extend_from_slice(tokens);
        metrics.output_tokens.inc_by(tokens.len() as u64);
        if let Some((text, logprobs)) = text {
            // The engine's own tokens, by their text.
            let mut before = 0;
            for logprob in logprobs {
                let piece = logprob.token.clone();
                before += self.scored.token(before, &piece, Scored::of_text(logprob));
            }
            return self.emit(text);
        }
        let mut text = String::new();
        let mut before = 0;
        for (i, &token) in tokens.iter().enumerate() {
            match self.decoder.push(token) {
                Ok(piece) => {
                    match logprobs.get(i) {
                        Some(logprobs) => {
                            let scored = Scored::of_ids(token, logprobs.clone());
                            before += self.scored.token(before, &piece, scored);
                        }
                        None => before += piece.chars().count(),
                    }
                    text.push_str(&piece);
                }
                Err(e) => {
                    return self.fail(ApiError::internal(format!("Cannot decode the output: {e}")));
                }
            }
        }
        self.emit(&text);
    }

    /// The prompt's log probabilities, one per token after the first: out before any text,
    /// with offsets in the prompt's text; a worker the request moves to is not asked again.
    fn on_prompt_logprobs(&mut self, logprobs: Vec<switchyard_core::protocol::TokenLogprobs>) {
        self.run.sampling.prompt_logprobs = None;
        let ids = self.run.prompt_ids();
        let Some(&first) = ids.first() else {
            return;
        };
        let mut decoder = self.run.frontend.preprocessor.decoder();
        let mut at = 0;
        let mut scored = Vec::with_capacity(logprobs.len());
        for (i, &token) in ids.iter().enumerate() {
            let start = at;
            at += decoder.push(token).map_or(0, |piece| piece.chars().count());
            if i > 0
                && let Some(logprobs) = logprobs.get(i - 1)
            {
                let mut entry = Scored::of_ids(token, logprobs.clone());
                entry.offset = start as u32;
                scored.push(entry);
            }
        }
        self.out.push_back(Ok(Piece::Prompt { first, scored }));
    }

    /// The prompt tokens the engine found in its prefix cache, from the first item that
    /// says (the first token's, or an OpenAI-compatible upstream's usage at the end: after
    /// a move to another worker, that worker's count, whose prompt had the tokens generated
    /// before the move too; never more than the client's prompt).
    fn learn_cached(&mut self, cached: Option<u32>) {
        if let (None, Some(cached)) = (self.cached_tokens, cached) {
            let cached = cached.min(self.prompt_tokens);
            self.cached_tokens = Some(cached);
            self.run
                .frontend
                .metrics
                .cached_tokens
                .inc_by(u64::from(cached));
        }
    }

    /// Passes text through the stop strings; a stop ends the response (the log
    /// probabilities of the tokens it cut are dropped with them).
    fn emit(&mut self, text: &str) {
        self.scored.decoded(text);
        match self.stop.push(text) {
            StopCheck::Emit(out) => self.push_text(out),
            StopCheck::Stopped(out) => {
                self.push_text(out);
                if let Some(worker) = self.attempt.as_ref().map(|a| a.worker) {
                    self.succeeded(worker.worker_id);
                }
                self.finish("stop");
            }
        }
    }

    /// Sends text on, with the log probabilities of the tokens whose text it completes.
    fn push_text(&mut self, text: String) {
        let scored = self.scored.emitted(&text);
        if !text.is_empty() || !scored.is_empty() {
            self.out.push_back(Ok(Piece::Text { text, scored }));
        }
    }

    fn finish(&mut self, reason: &'static str) {
        let usage = Usage::new(
            self.prompt_tokens,
            self.run.generated.len() as u32,
            self.cached_tokens,
        );
        let worker = self.last_worker;
        let generated = if self.run.keep_generated {
            self.run.generated.clone()
        } else {
            Vec::new()
        };
        self.out.push_back(Ok(Piece::Finished {
            reason,
            usage,
            worker,
            generated,
        }));
        self.ended = true;
        // Dropping the engine stream cancels the request on the worker (a stop string).
        self.attempt = None;
    }

    fn fail(&mut self, error: ApiError) {
        tracing::warn!(request = %self.run.id, message = %error.message, "request failed");
        self.out.push_back(Err(error));
        self.ended = true;
        self.attempt = None;
    }
}

/// The name of the reason a stream's error makes the request leave its worker.
fn why_of(error: &EngineError) -> &'static str {
    Leave::of_error(error).map_or("refused", Leave::name)
}
