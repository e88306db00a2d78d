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

#[test]
fn failed_tries_count_against_at_fault_workers_back_off_and_run_out() {
    let mut shell = Recorder::default();
    let mut life = life(3, 3);
    life.start(&mut shell);
    assert_eq!(shell.credits, 1);
    let refused = TryFailure::Refused(EngineError::Unreachable("closed".into()));
    assert_eq!(
        life.try_failed(w(1), refused.clone(), &mut shell),
        Ok(Some(Duration::from_millis(50)))
    );
    // Back-pressure is no fault of the worker's: not counted, still excluded.
    let busy = TryFailure::Refused(EngineError::Overloaded("full".into()));
    assert_eq!(
        life.try_failed(w(2), busy, &mut shell),
        Ok(Some(Duration::from_millis(75)))
    );
    assert_eq!(shell.failures, [(w(1), Failure::Unreachable)]);
    assert_eq!(life.exclusions(), [w(1), w(2)]);
    let given_up = life.try_failed(
        w(3),
        TryFailure::TimedOut(Duration::from_secs(3)),
        &mut shell,
    );
    assert!(matches!(given_up, Err(GiveUp::Exhausted(ref e)) if e.contains("no answer")));
    assert_eq!(shell.failures.last(), Some(&(w(3), Failure::Timeout)));
    assert_eq!(shell.released, 3, "each failed try lets its records go");
}

#[test]
fn a_worker_found_unhealthy_on_the_way_is_excluded_but_the_try_is_free() {
    let mut shell = Recorder::default();
    let mut life = life(1, 3);
    assert!(
        life.try_failed(w(1), TryFailure::FoundUnhealthy, &mut shell)
            .is_ok()
    );
    assert!(shell.failures.is_empty(), "whoever found it counted it");
    assert_eq!(life.exclusions(), [w(1)]);
    assert!(matches!(
        life.try_failed(w(2), TryFailure::FoundUnhealthy, &mut shell),
        Ok(Some(_))
    ));
    let refused = TryFailure::Refused(EngineError::Internal("boom".into()));
    assert!(
        life.try_failed(w(3), refused, &mut shell).is_err(),
        "one real try"
    );
}

#[test]
fn every_worker_saying_it_cannot_serve_makes_the_request_unservable() {
    let mut shell = Recorder::default();
    let mut life = life(2, 3);
    let cannot = || TryFailure::Refused(EngineError::Unsupported("too long".into()));
    // No backoff: the next worker may serve it at once.
    assert_eq!(life.try_failed(w(1), cannot(), &mut shell), Ok(None));
    assert_eq!(
        life.try_failed(w(2), cannot(), &mut shell),
        Err(GiveUp::Unservable("too long".into()))
    );
    assert_eq!(
        life.no_worker(false, Duration::ZERO),
        NoWorker::GiveUp(GiveUp::Unservable("too long".into()))
    );
    // A worker that failed otherwise first: not unservable.
    let mut life = self::life(2, 3);
    let refused = TryFailure::Refused(EngineError::Disconnected);
    assert!(life.try_failed(w(1), refused, &mut shell).is_ok());
    assert!(matches!(
        life.try_failed(w(2), cannot(), &mut shell),
        Err(GiveUp::Exhausted(_))
    ));
}

#[test]
fn an_invalid_request_gives_up_at_once() {
    let mut shell = Recorder::default();
    let mut life = life(3, 3);
    let invalid = TryFailure::Refused(EngineError::Invalid("bad".into()));
    assert_eq!(
        life.try_failed(w(1), invalid, &mut shell),
        Err(GiveUp::Invalid("bad".into()))
    );
    assert!(shell.failures.is_empty());
}

#[test]
fn with_no_worker_left_a_request_tries_its_failed_ones_then_waits_its_queue_timeout() {
    let mut shell = Recorder::default();
    let mut fresh = life(3, 3);
    assert_eq!(
        fresh.no_worker(false, Duration::ZERO),
        NoWorker::GiveUp(GiveUp::NoWorkers)
    );
    let mut life = life(3, 3);
    let refused = TryFailure::Refused(EngineError::Disconnected);
    assert!(life.try_failed(w(1), refused, &mut shell).is_ok());
    let t = Duration::from_secs;
    assert_eq!(life.no_worker(false, t(10)), NoWorker::RouteUnexcluded);
    assert_eq!(life.no_worker(true, t(10)), NoWorker::Wait { until: t(40) });
    assert_eq!(life.no_worker(true, t(39)), NoWorker::Wait { until: t(40) });
    assert_eq!(
        life.no_worker(true, t(40)),
        NoWorker::GiveUp(GiveUp::NoOtherWorker)
    );
    // A worker found meanwhile starts the wait afresh next time.
    let routed: Result<_, ()> = life.route(t(45), |_| Ok(Some(())));
    assert_eq!(routed, Ok(Routing::Routed(())));
    assert_eq!(life.no_worker(true, t(50)), NoWorker::Wait { until: t(80) });
}

#[test]
fn routing_excludes_the_failed_workers_then_tries_them_then_waits() {
    let mut shell = Recorder::default();
    let mut life = life(3, 3);
    let t = Duration::from_secs;
    // A fresh request is routed with nothing excluded; none left: no workers at all.
    let mut asked: Vec<Vec<WorkerId>> = Vec::new();
    let routed: Result<Routing<()>, ()> = life.route(t(0), |exclude| {
        asked.push(exclude.to_vec());
        Ok(None)
    });
    assert_eq!(routed, Ok(Routing::GiveUp(GiveUp::NoWorkers)));
    assert_eq!(asked, vec![Vec::<WorkerId>::new()]);
    // After failing on w(1): routed away from it, then (none other) with it, then waits.
    let refused = TryFailure::Refused(EngineError::Disconnected);
    assert!(life.try_failed(w(1), refused, &mut shell).is_ok());
    asked.clear();
    let routed: Result<Routing<()>, ()> = life.route(t(10), |exclude| {
        asked.push(exclude.to_vec());
        Ok(None)
    });
    assert_eq!(routed, Ok(Routing::Wait { until: t(40) }));
    assert_eq!(asked, vec![vec![w(1)], vec![]]);
    // The worker it failed on takes it when asked with none excluded.
    let routed: Result<Routing<WorkerId>, ()> =
        life.route(t(20), |exclude| Ok((exclude.is_empty()).then_some(w(1))));
    assert_eq!(routed, Ok(Routing::Routed(w(1))));
    // The shell's error ends routing as it is.
    let routed: Result<Routing<()>, &str> = life.route(t(20), |_| Err("invalid prompt"));
    assert_eq!(routed, Err("invalid prompt"));
    // Past its queue timeout it gives up.
    let routed: Result<Routing<()>, ()> = life.route(t(25), |_| Ok(None));
    assert_eq!(routed, Ok(Routing::Wait { until: t(55) }));
    let routed: Result<Routing<()>, ()> = life.route(t(55), |_| Ok(None));
    assert_eq!(routed, Ok(Routing::GiveUp(GiveUp::NoOtherWorker)));
}

#[test]
fn a_reroute_releases_the_routers_records_and_counts_no_try() {
    let mut shell = Recorder::default();
    let mut life = life(1, 3);
    life.reroute(&mut shell);
    life.reroute(&mut shell);
    assert_eq!(shell.released, 2);
    assert!(shell.failures.is_empty());
    assert!(life.exclusions().is_empty());
    // Its one try is still there.
    let refused = TryFailure::Refused(EngineError::Disconnected);
    assert!(matches!(
        life.try_failed(w(1), refused, &mut shell),
        Err(GiveUp::Exhausted(_))
    ));
}

#[test]
fn a_prefill_token_ends_the_request_on_a_stop_token_or_its_last_token() {
    let mut shell = Recorder::default();
    // At most 4 tokens, stopping after 99.
    let mut life = life(3, 3);
    assert_eq!(life.ended_by_prefill_token(99), Some(FinishReason::Stop));
    assert_eq!(life.ended_by_prefill_token(5), None);
    // Moved after 3 tokens: the prefill's token is its last.
    life.tokens(&[1, 2, 3], &mut shell);
    assert_eq!(life.ended_by_prefill_token(5), Some(FinishReason::Length));
    assert_eq!(life.ended_by_prefill_token(99), Some(FinishReason::Stop));
}

#[test]
fn moves_are_bounded_by_the_requests_limit_and_the_fleets_budget() {
    let mut shell = Recorder {
        budget: 1,
        ..Recorder::default()
    };
    let mut life = life(3, 2);
    life.sent(None, &mut shell);
    assert!(life.tokens(&[5], &mut shell), "the attempt's first token");
    assert!(!life.tokens(&[6], &mut shell));
    assert_eq!(shell.prefill_done, 1);
    assert_eq!(
        life.left(w(1), Leave::Failed(Failure::Disconnected), &mut shell),
        Leaving::Move
    );
    assert_eq!(shell.failures, [(w(1), Failure::Disconnected)]);
    assert_eq!((life.moves(), life.generated()), (1, 2));
    life.sent(None, &mut shell);
    // The budget is spent: the next move is refused, whatever the request's own limit.
    assert_eq!(
        life.left(w(2), Leave::Outage, &mut shell),
        Leaving::GiveUp(GiveUp::MoveBudget)
    );
    let mut shell = Recorder {
        budget: 10,
        ..Recorder::default()
    };
    let mut life = self::life(3, 1);
    assert_eq!(life.left(w(1), Leave::Cancelled, &mut shell), Leaving::Move);
    assert_eq!(
        life.left(w(2), Leave::Cancelled, &mut shell),
        Leaving::GiveUp(GiveUp::MoveLimit { workers: 2 })
    );
}

#[test]
fn lost_kv_moves_without_excluding_the_worker() {
    let mut shell = Recorder {
        budget: 1,
        ..Recorder::default()
    };
    let mut life = life(3, 3);
    assert_eq!(life.left(w(1), Leave::KvLost, &mut shell), Leaving::Move);
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
    life.tokens(&[1, 2, 3, 4], &mut shell);
    assert_eq!(life.ended_by_tokens(), Some(FinishReason::Length));
    assert_eq!(
        life.left(w(1), Leave::Failed(Failure::Disconnected), &mut shell),
        Leaving::Complete(FinishReason::Length)
    );
    assert_eq!(shell.budget, 1, "no move spent");
    assert_eq!(shell.failures.len(), 1, "the worker still failed");
    let mut life = self::life(3, 3);
    life.tokens(&[1, 99], &mut shell);
    assert_eq!(life.ended_by_tokens(), Some(FinishReason::Stop));
}

#[test]
fn stream_errors_leave_by_kind_and_a_refusal_gives_up() {
    let mut shell = Recorder {
        budget: 5,
        ..Recorder::default()
    };
    let mut life = life(3, 5);
    assert_eq!(
        life.stream_error(w(1), &EngineError::Internal("x".into()), &mut shell),
        Leaving::Move
    );
    assert_eq!(shell.failures, [(w(1), Failure::ServerError)]);
    assert_eq!(
        life.stream_error(w(2), &EngineError::Stopping, &mut shell),
        Leaving::Move
    );
    assert_eq!(shell.failures.len(), 1, "a stopping worker is not at fault");
    assert!(matches!(
        life.stream_error(w(3), &EngineError::Invalid("no".into()), &mut shell),
        Leaving::GiveUp(GiveUp::Refused(_))
    ));
}

#[test]
fn a_silent_stream_on_an_idle_worker_counts_as_a_hang() {
    let mut shell = Recorder {
        budget: 5,
        ..Recorder::default()
    };
    let mut life = life(3, 5);
    let s = Duration::from_secs;
    life.stalled(w(1), s(2), s(2), &mut shell);
    life.stalled(w(2), s(2), Duration::from_millis(10), &mut shell);
    assert_eq!(
        shell.failures,
        [(w(1), Failure::Hung), (w(2), Failure::Stalled)]
    );
}

#[test]
fn success_counts_for_the_worker_and_releases_the_request() {
    let mut shell = Recorder::default();
    let mut life = life(3, 3);
    life.finished(w(4), &mut shell);
    assert_eq!(shell.successes, [w(4)]);
    assert_eq!(shell.released, 1);
}

#[test]
fn a_prompt_sent_ahead_of_its_media_has_the_rest_held_and_each_send_ends_a_round() {
    let mut shell = Recorder::default();
    let mut life = life(2, 3);
    let refused = || TryFailure::Refused(EngineError::Disconnected);
    assert!(life.try_failed(w(1), refused(), &mut shell).is_ok());
    // Sent with its media from position 40 of 100 still encoding.
    life.sent(Some((100, 40)), &mut shell);
    assert_eq!(shell.held, [(100, 40)]);
    // A new round: one failed try does not exhaust it.
    assert!(life.try_failed(w(2), refused(), &mut shell).is_ok());
    // A remote prefill's handover releases the prefill worker and ends the round too.
    life.handed_over(&mut shell);
    assert_eq!(shell.prefill_released, 1);
    assert!(life.try_failed(w(3), refused(), &mut shell).is_ok());
    assert!(matches!(
        life.try_failed(w(4), refused(), &mut shell),
        Err(GiveUp::Exhausted(_))
    ));
    assert_eq!(shell.held.len(), 1, "only a send ahead of media holds");
}
