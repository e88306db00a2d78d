//! The life's rules, against a shell that records what it is told.

use std::time::Duration;

use switchyard_core::protocol::{EngineError, FinishReason};
use switchyard_core::{RequestId, WorkerId};

use super::*;
use crate::routing::RoutingConfig;
use crate::routing::health::Failure;

#[derive(Debug, Default)]
struct Recorder {
    released: u32,
    prefill_released: u32,
    held: Vec<(u64, u64)>,
    prefill_done: u32,
    failures: Vec<(WorkerId, Failure)>,
    successes: Vec<WorkerId>,
    credits: u32,
    budget: u32,
}

impl Shell for Recorder {
    fn release(&mut self, _: RequestId) {
        self.released += 1;
    }
    fn prefill_released(&mut self, _: RequestId) {
        self.prefill_released += 1;
    }
    fn hold_prefill(&mut self, _: RequestId, prompt_tokens: u64, media_from: u64) {
        self.held.push((prompt_tokens, media_from));
    }
    fn prefill_done(&mut self, _: RequestId) {
        self.prefill_done += 1;
    }
    fn count_failure(&mut self, worker: WorkerId, failure: Failure) {
        self.failures.push((worker, failure));
    }
    fn count_success(&mut self, worker: WorkerId) {
        self.successes.push(worker);
    }
    fn credit_migration(&mut self) {
        self.credits += 1;
    }
    fn spend_migration(&mut self) -> bool {
        let left = self.budget > 0;
        self.budget = self.budget.saturating_sub(1);
        left
    }
    fn unit_random(&mut self) -> f64 {
        0.5
    }
}

fn life(max_dispatch_attempts: u32, max_migrations: u32) -> RequestLife {
    let mut config = RoutingConfig::default();
    config.migration.max_dispatch_attempts = max_dispatch_attempts;
    config.migration.max_migrations = max_migrations;
    config.admission.queue_timeout = Duration::from_secs(30);
    RequestLife::new(RequestId(7), &config, 4, vec![99])
}

fn w(id: u64) -> WorkerId {
    WorkerId(id)
}

fn try_failed(
    life: &mut RequestLife,
    worker: u64,
    failure: TryFailure,
    shell: &mut Recorder,
) -> Step {
    life.step(
        Event::TryFailed {
            worker: w(worker),
            failure,
        },
        shell,
    )
}

fn left(life: &mut RequestLife, worker: u64, why: Leave, shell: &mut Recorder) -> Step {
    life.step(
        Event::Left {
            worker: w(worker),
            why,
        },
        shell,
    )
}

fn no_worker(life: &mut RequestLife, secs: u64, shell: &mut Recorder) -> Step {
    let now = Duration::from_secs(secs);
    life.step(Event::NoWorker { now }, shell)
}

const ROUTED: Event<'static> = Event::Routed {
    pair: false,
    media_pending: false,
};

fn is_give_up(step: &Step) -> bool {
    matches!(step, Step::GiveUp(_))
}

#[test]
fn failed_tries_count_against_at_fault_workers_back_off_and_run_out() {
    let mut shell = Recorder::default();
    let mut life = life(3, 3);
    assert_eq!(life.step(Event::Admitted, &mut shell), Step::Route);
    assert_eq!(shell.credits, 1);
    let refused = TryFailure::Refused(EngineError::Unreachable("closed".into()));
    assert_eq!(
        try_failed(&mut life, 1, refused, &mut shell),
        Step::BackOff(Duration::from_millis(50))
    );
    // Back-pressure is no fault of the worker's: not counted, still excluded.
    let busy = TryFailure::Refused(EngineError::Overloaded("full".into()));
    assert_eq!(
        try_failed(&mut life, 2, busy, &mut shell),
        Step::BackOff(Duration::from_millis(75))
    );
    assert_eq!(shell.failures, [(w(1), Failure::Unreachable)]);
    assert_eq!(life.exclusions(), [w(1), w(2)]);
    let timed_out = TryFailure::TimedOut(Duration::from_secs(3));
    let given_up = try_failed(&mut life, 3, timed_out, &mut shell);
    assert!(matches!(given_up, Step::GiveUp(GiveUp::Exhausted(ref e)) if e.contains("no answer")));
    assert_eq!(shell.failures.last(), Some(&(w(3), Failure::Timeout)));
    assert_eq!(shell.released, 3, "each failed try lets its records go");
}

#[test]
fn a_worker_found_unhealthy_on_the_way_is_excluded_but_the_try_is_free() {
    let mut shell = Recorder::default();
    let mut life = life(1, 3);
    let step = try_failed(&mut life, 1, TryFailure::FoundUnhealthy, &mut shell);
    assert!(matches!(step, Step::BackOff(_)));
    assert!(shell.failures.is_empty(), "whoever found it counted it");
    assert_eq!(life.exclusions(), [w(1)]);
    let step = try_failed(&mut life, 2, TryFailure::FoundUnhealthy, &mut shell);
    assert!(matches!(step, Step::BackOff(_)));
    let refused = TryFailure::Refused(EngineError::Internal("boom".into()));
    let step = try_failed(&mut life, 3, refused, &mut shell);
    assert!(is_give_up(&step), "one real try");
}

#[test]
fn every_worker_saying_it_cannot_serve_makes_the_request_unservable() {
    let mut shell = Recorder::default();
    let mut life = life(2, 3);
    let cannot = || TryFailure::Refused(EngineError::Unsupported("too long".into()));
    // No backoff: the next worker may serve it at once.
    assert_eq!(try_failed(&mut life, 1, cannot(), &mut shell), Step::Route);
    let unservable = Step::GiveUp(GiveUp::Unservable("too long".into()));
    assert_eq!(try_failed(&mut life, 2, cannot(), &mut shell), unservable);
    assert_eq!(no_worker(&mut life, 0, &mut shell), unservable);
    // A worker that failed otherwise first: not unservable.
    let mut life = self::life(2, 3);
    let refused = TryFailure::Refused(EngineError::Disconnected);
    assert!(!is_give_up(&try_failed(&mut life, 1, refused, &mut shell)));
    assert!(matches!(
        try_failed(&mut life, 2, cannot(), &mut shell),
        Step::GiveUp(GiveUp::Exhausted(_))
    ));
}

#[test]
fn an_invalid_request_gives_up_at_once() {
    let mut shell = Recorder::default();
    let mut life = life(3, 3);
    let invalid = TryFailure::Refused(EngineError::Invalid("bad".into()));
    assert_eq!(
        try_failed(&mut life, 1, invalid, &mut shell),
        Step::GiveUp(GiveUp::Invalid("bad".into()))
    );
    assert!(shell.failures.is_empty());
}

#[test]
fn with_no_worker_left_a_request_tries_its_failed_ones_then_waits_its_queue_timeout() {
    let mut shell = Recorder::default();
    let mut fresh = life(3, 3);
    assert_eq!(
        no_worker(&mut fresh, 0, &mut shell),
        Step::GiveUp(GiveUp::NoWorkers)
    );
    let mut life = life(3, 3);
    let refused = TryFailure::Refused(EngineError::Disconnected);
    assert!(!is_give_up(&try_failed(&mut life, 1, refused, &mut shell)));
    let t = Duration::from_secs;
    // None away from w(1): routed again with none excluded; none then either: it waits.
    assert_eq!(life.exclusions(), [w(1)]);
    assert_eq!(no_worker(&mut life, 10, &mut shell), Step::Route);
    assert!(life.exclusions().is_empty());
    assert_eq!(
        no_worker(&mut life, 10, &mut shell),
        Step::Wait { until: t(40) }
    );
    // After the wait it is routed away from w(1) again.
    assert_eq!(life.exclusions(), [w(1)]);
    assert_eq!(no_worker(&mut life, 39, &mut shell), Step::Route);
    assert_eq!(
        no_worker(&mut life, 39, &mut shell),
        Step::Wait { until: t(40) }
    );
    assert_eq!(no_worker(&mut life, 40, &mut shell), Step::Route);
    assert_eq!(
        no_worker(&mut life, 40, &mut shell),
        Step::GiveUp(GiveUp::NoOtherWorker)
    );
    // A worker found meanwhile starts the wait afresh next time.
    assert_eq!(no_worker(&mut life, 45, &mut shell), Step::Route);
    assert_eq!(life.step(ROUTED, &mut shell), Step::Send);
    assert_eq!(
        life.exclusions(),
        [w(1)],
        "routed: the exclusions hold again"
    );
    assert_eq!(no_worker(&mut life, 50, &mut shell), Step::Route);
    assert_eq!(
        no_worker(&mut life, 50, &mut shell),
        Step::Wait { until: t(80) }
    );
}

#[test]
fn a_pair_waits_for_its_media_and_its_records_are_released() {
    let mut shell = Recorder::default();
    let mut life = life(1, 3);
    let pending_pair = Event::Routed {
        pair: true,
        media_pending: true,
    };
    assert_eq!(life.step(pending_pair, &mut shell), Step::AwaitMedia);
    assert_eq!(shell.released, 1);
    // A single worker takes the prompt ahead of its media; a pair once they are ready.
    let pending_one = Event::Routed {
        pair: false,
        media_pending: true,
    };
    assert_eq!(life.step(pending_one, &mut shell), Step::Send);
    let ready_pair = Event::Routed {
        pair: true,
        media_pending: false,
    };
    assert_eq!(life.step(ready_pair, &mut shell), Step::Send);
    assert_eq!(shell.released, 1);
}

#[test]
fn a_changed_prompt_releases_the_routers_records_and_counts_no_try() {
    let mut shell = Recorder::default();
    let mut life = life(1, 3);
    assert_eq!(life.step(Event::PromptChanged, &mut shell), Step::Route);
    assert_eq!(life.step(Event::PromptChanged, &mut shell), Step::Route);
    assert_eq!(shell.released, 2);
    assert!(shell.failures.is_empty());
    assert!(life.exclusions().is_empty());
    // Its one try is still there.
    let refused = TryFailure::Refused(EngineError::Disconnected);
    assert!(matches!(
        try_failed(&mut life, 1, refused, &mut shell),
        Step::GiveUp(GiveUp::Exhausted(_))
    ));
}

#[test]
fn a_prefill_token_ends_the_request_on_a_stop_token_or_its_last_token() {
    let mut shell = Recorder::default();
    // At most 4 tokens, stopping after 99.
    let handed = |life: &mut RequestLife, token, shell: &mut Recorder| {
        life.step(Event::HandedOver { token }, shell)
    };
    let mut life = life(3, 3);
    assert_eq!(
        handed(&mut life, 99, &mut shell),
        Step::Finish(FinishReason::Stop)
    );
    assert_eq!(handed(&mut life, 5, &mut shell), Step::Stream);
    assert_eq!(shell.prefill_released, 2);
    // Moved after 3 tokens: the prefill's token is its last.
    life.step(Event::Tokens(&[1, 2, 3]), &mut shell);
    assert_eq!(
        handed(&mut life, 5, &mut shell),
        Step::Finish(FinishReason::Length)
    );
    assert_eq!(
        handed(&mut life, 99, &mut shell),
        Step::Finish(FinishReason::Stop)
    );
}

#[test]
fn moves_are_bounded_by_the_requests_limit_and_the_fleets_budget() {
    let mut shell = Recorder {
        budget: 1,
        ..Recorder::default()
    };
    let sent = Event::Sent {
        ahead_of_media: None,
    };
    let mut life = life(3, 2);
    assert_eq!(life.step(sent.clone(), &mut shell), Step::Stream);
    let first = life.step(Event::Tokens(&[5]), &mut shell);
    assert_eq!(first, Step::Prefilled, "the attempt's first token");
    assert_eq!(life.step(Event::Tokens(&[6]), &mut shell), Step::Stream);
    assert_eq!(shell.prefill_done, 1);
    let lost = Leave::Failed(Failure::Disconnected);
    assert_eq!(left(&mut life, 1, lost, &mut shell), Step::Move);
    assert_eq!(shell.failures, [(w(1), Failure::Disconnected)]);
    assert_eq!((life.moves(), life.generated()), (1, 2));
    life.step(sent, &mut shell);
    // The budget is spent: the next move is refused, whatever the request's own limit.
    assert_eq!(
        left(&mut life, 2, Leave::Outage, &mut shell),
        Step::GiveUp(GiveUp::MoveBudget)
    );
    let mut shell = Recorder {
        budget: 10,
        ..Recorder::default()
    };
    let mut life = self::life(3, 1);
    assert_eq!(left(&mut life, 1, Leave::Cancelled, &mut shell), Step::Move);
    assert_eq!(
        left(&mut life, 2, Leave::Cancelled, &mut shell),
        Step::GiveUp(GiveUp::MoveLimit { workers: 2 })
    );
}

#[test]
fn lost_kv_moves_without_excluding_the_worker() {
    let mut shell = Recorder {
        budget: 1,
        ..Recorder::default()
    };
    let mut life = life(3, 3);
    assert_eq!(left(&mut life, 1, Leave::KvLost, &mut shell), Step::Move);
    assert!(life.exclusions().is_empty());
    assert!(shell.failures.is_empty());
}

#[test]
fn a_request_whose_tokens_all_arrived_is_complete_not_moved() {
    let mut shell = Recorder {
        budget: 1,
        ..Recorder::default()
    };
    let mut life = life(3, 3);
    life.step(Event::Tokens(&[1, 2, 3, 4]), &mut shell);
    assert_eq!(life.ended_by_tokens(), Some(FinishReason::Length));
    assert_eq!(
        left(
            &mut life,
            1,
            Leave::Failed(Failure::Disconnected),
            &mut shell
        ),
        Step::Finish(FinishReason::Length)
    );
    assert_eq!(shell.budget, 1, "no move spent");
    assert_eq!(shell.failures.len(), 1, "the worker still failed");
    let mut life = self::life(3, 3);
    life.step(Event::Tokens(&[1, 99]), &mut shell);
    assert_eq!(life.ended_by_tokens(), Some(FinishReason::Stop));
}

#[test]
fn stream_errors_leave_by_kind_and_a_refusal_gives_up() {
    let mut shell = Recorder {
        budget: 5,
        ..Recorder::default()
    };
    let mut life = life(3, 5);
    let mut error = |worker, error: EngineError, shell: &mut Recorder| {
        let worker = w(worker);
        life.step(
            Event::StreamError {
                worker,
                error: &error,
            },
            shell,
        )
    };
    let internal = EngineError::Internal("x".into());
    assert_eq!(error(1, internal, &mut shell), Step::Move);
    assert_eq!(shell.failures, [(w(1), Failure::ServerError)]);
    assert_eq!(error(2, EngineError::Stopping, &mut shell), Step::Move);
    assert_eq!(shell.failures.len(), 1, "a stopping worker is not at fault");
    let invalid = EngineError::Invalid("no".into());
    assert!(matches!(
        error(3, invalid, &mut shell),
        Step::GiveUp(GiveUp::Refused(_))
    ));
    assert_eq!(shell.released, 3);
}

#[test]
fn a_silent_stream_on_an_idle_worker_counts_as_a_hang() {
    let mut shell = Recorder {
        budget: 5,
        ..Recorder::default()
    };
    let mut life = life(3, 5);
    let s = Duration::from_secs;
    let mut stalled = |worker, worker_idle, shell: &mut Recorder| {
        let (worker, waited) = (w(worker), s(2));
        let event = Event::Stalled {
            worker,
            waited,
            worker_idle,
        };
        life.step(event, shell)
    };
    assert_eq!(stalled(1, s(2), &mut shell), Step::Move);
    assert_eq!(
        stalled(2, Duration::from_millis(10), &mut shell),
        Step::Move
    );
    assert_eq!(
        shell.failures,
        [(w(1), Failure::Hung), (w(2), Failure::Stalled)]
    );
}

#[test]
fn success_and_abandonment_release_the_request() {
    let mut shell = Recorder::default();
    let mut life = life(3, 3);
    let finished = Event::Finished { worker: w(4) };
    assert_eq!(life.step(finished, &mut shell), Step::Done);
    assert_eq!(shell.successes, [w(4)]);
    assert_eq!(shell.released, 1);
    assert_eq!(life.step(Event::Abandoned, &mut shell), Step::Done);
    assert_eq!(shell.successes.len(), 1);
    assert_eq!(shell.released, 2);
}

#[test]
fn a_prompt_sent_ahead_of_its_media_has_the_rest_held_and_each_send_ends_a_round() {
    let mut shell = Recorder::default();
    let mut life = life(2, 3);
    let refused = || TryFailure::Refused(EngineError::Disconnected);
    assert!(!is_give_up(&try_failed(
        &mut life,
        1,
        refused(),
        &mut shell
    )));
    // Sent with its media from position 40 of 100 still encoding.
    let ahead_of_media = Some((100, 40));
    life.step(Event::Sent { ahead_of_media }, &mut shell);
    assert_eq!(shell.held, [(100, 40)]);
    // A new round: one failed try does not exhaust it.
    assert!(!is_give_up(&try_failed(
        &mut life,
        2,
        refused(),
        &mut shell
    )));
    // A remote prefill's handover releases the prefill worker and ends the round too.
    life.step(Event::HandedOver { token: 5 }, &mut shell);
    assert_eq!(shell.prefill_released, 1);
    assert!(!is_give_up(&try_failed(
        &mut life,
        3,
        refused(),
        &mut shell
    )));
    assert!(matches!(
        try_failed(&mut life, 4, refused(), &mut shell),
        Step::GiveUp(GiveUp::Exhausted(_))
    ));
    assert_eq!(shell.held.len(), 1, "only a send ahead of media holds");
}
