//! The health state machine: breaker transitions, the fleet cap, canaries, stall timeouts,
//! jitter and the majority answer.

use super::*;
use rand::SeedableRng;

const S: Duration = Duration::from_secs(1);

fn setup() -> (WorkerHealth, HealthConfig, SmallRng) {
    (
        WorkerHealth::new(Duration::ZERO),
        HealthConfig {
            recovery_jitter: 0.0,
            ..HealthConfig::default()
        },
        SmallRng::seed_from_u64(1),
    )
}

#[test]
fn failures_make_a_worker_suspicious_then_unhealthy_and_a_probe_brings_it_back() {
    let (mut h, config, mut rng) = setup();
    assert_eq!(
        h.fail(Failure::Disconnected, true, &config, S, &mut rng),
        Some(HealthChange {
            from: HealthState::Healthy,
            to: HealthState::Suspicious
        })
    );
    assert_eq!(
        h.fail(Failure::Stalled, true, &config, 2 * S, &mut rng),
        None
    );
    let opened = h.fail(Failure::ServerError, true, &config, 3 * S, &mut rng);
    assert_eq!(opened.map(|c| c.to), Some(HealthState::Unhealthy));
    assert_eq!(h.breaker, Breaker::Open { until: 63 * S });
    // Closed to traffic and to canaries until the recovery timeout.
    assert!(!h.canary_due(&config, 62 * S));
    h.tick(62 * S);
    assert!(matches!(h.breaker, Breaker::Open { .. }));
    h.tick(63 * S);
    assert_eq!(h.breaker, Breaker::HalfOpen);
    assert!(h.canary_due(&config, 63 * S));
    // An ordinary success does not close a half-open breaker; a passing probe does.
    assert_eq!(h.succeed(&config, 63 * S, false), None);
    h.canary_started(63 * S);
    assert!(!h.canary_due(&config, 63 * S), "one probe at a time");
    let back = h.canary_finished(
        Ok(CanaryAnswer::new(vec![1, 2], S / 10)),
        None,
        true,
        &config,
        64 * S,
        &mut rng,
    );
    assert_eq!(back.map(|c| c.to), Some(HealthState::Healthy));
    assert_eq!(h.breaker, Breaker::Closed);
}

#[test]
fn without_room_in_the_fleet_only_hard_failures_open_the_breaker() {
    let (mut h, config, mut rng) = setup();
    let hung = h.fail(Failure::Hung, false, &config, S, &mut rng);
    assert_eq!(hung.map(|c| c.to), Some(HealthState::Suspicious));
    for _ in 0..3 {
        h.fail(Failure::Timeout, false, &config, S, &mut rng);
    }
    assert_eq!(h.breaker, Breaker::Closed);
    assert_eq!(
        (h.kept_in, h.openings),
        (3, 0),
        "the hang and two timeouts past the threshold"
    );
    // Room again: the next soft failure opens it (the failures in a row still count).
    let opened = h.fail(Failure::Stalled, true, &config, 2 * S, &mut rng);
    assert_eq!(opened.map(|c| c.to), Some(HealthState::Unhealthy));
    for failure in Failure::KINDS {
        let (mut h, config, mut rng) = setup();
        for _ in 0..config.failure_threshold {
            h.fail(failure, false, &config, S, &mut rng);
        }
        let out = h.state == HealthState::Unhealthy;
        assert_eq!(out, failure.is_hard(), "{failure:?}");
    }
    let hard: Vec<_> = Failure::KINDS.into_iter().filter(|f| f.is_hard()).collect();
    assert_eq!(
        hard,
        [
            Failure::Unreachable,
            Failure::Disconnected,
            Failure::WrongOutput
        ]
    );
}

#[test]
fn a_failed_probe_reopens_and_successes_heal_a_suspicious_worker() {
    let (mut h, config, mut rng) = setup();
    for _ in 0..3 {
        h.fail(Failure::Unreachable, true, &config, S, &mut rng);
    }
    h.tick(61 * S);
    h.canary_started(61 * S);
    let again = h.canary_finished(
        Err(Failure::CanaryTimeout),
        None,
        true,
        &config,
        64 * S,
        &mut rng,
    );
    assert_eq!(again, None, "still unhealthy");
    assert_eq!(h.breaker, Breaker::Open { until: 124 * S });
    assert_eq!(h.openings, 2);

    let (mut h, config, mut rng) = setup();
    h.fail(Failure::Stalled, true, &config, S, &mut rng);
    assert_eq!(h.state, HealthState::Suspicious);
    assert_eq!(h.succeed(&config, 2 * S, false), None);
    assert_eq!(
        h.succeed(&config, 3 * S, false).map(|c| c.to),
        Some(HealthState::Healthy)
    );
}

#[test]
fn wrong_canary_output_opens_the_breaker_at_once() {
    let (mut h, config, mut rng) = setup();
    h.canary_started(S);
    assert_eq!(
        h.canary_finished(
            Ok(CanaryAnswer::new(vec![5, 6], S / 10)),
            None,
            true,
            &config,
            S,
            &mut rng
        ),
        None
    );
    // The same worker now answers differently.
    h.canary_started(40 * S);
    let changed = h.canary_finished(
        Ok(CanaryAnswer::new(vec![5, 7], S / 10)),
        None,
        true,
        &config,
        40 * S,
        &mut rng,
    );
    assert_eq!(changed.map(|c| c.to), Some(HealthState::Unhealthy));
    // A worker whose very first answer differs from what the fleet answers.
    let (mut h, config, mut rng) = setup();
    h.canary_started(S);
    let odd = h.canary_finished(
        Ok(CanaryAnswer::new(vec![9], S)),
        Some(&[5, 6]),
        true,
        &config,
        S,
        &mut rng,
    );
    assert_eq!(odd.map(|c| c.to), Some(HealthState::Unhealthy));
    assert_eq!(h.last_failure, Some(Failure::WrongOutput));
}

/// A canary answering tokens 5, 6 with these log probabilities, at `at`.
fn drifting(
    (h, config, rng): &mut (WorkerHealth, HealthConfig, SmallRng),
    logprobs: Vec<f32>,
    at: Duration,
) -> Option<HealthChange> {
    h.canary_started(at);
    let answer = CanaryAnswer {
        tokens: vec![5, 6],
        logprobs,
        latency: S / 10,
    };
    h.canary_finished(Ok(answer), None, true, config, at, rng)
}

#[test]
fn canary_log_probabilities_that_drift_open_the_breaker_at_once() {
    let mut worker = setup();
    assert_eq!(drifting(&mut worker, vec![-0.5, -1.0], S), None);
    // Within the tolerance (0.5 by default): the same answer.
    assert_eq!(drifting(&mut worker, vec![-0.7, -0.8], 40 * S), None);
    assert_eq!(worker.0.state, HealthState::Healthy);
    // A worker that stops reporting them is judged on its tokens alone.
    assert_eq!(drifting(&mut worker, Vec::new(), 80 * S), None);
    // The same tokens, one value moved past it: silent corruption.
    let drifted = drifting(&mut worker, vec![-0.5, -1.6], 120 * S);
    assert_eq!(drifted.map(|c| c.to), Some(HealthState::Unhealthy));
    assert_eq!(worker.0.last_failure, Some(Failure::WrongOutput));
    // Not a number is never within it.
    let mut worker = setup();
    assert_eq!(drifting(&mut worker, vec![-0.5, -1.0], S), None);
    let nan = drifting(&mut worker, vec![-0.5, f32::NAN], 40 * S);
    assert_eq!(nan.map(|c| c.to), Some(HealthState::Unhealthy));
}

#[test]
fn slow_canaries_count_once_the_average_is_known() {
    let (mut h, config, mut rng) = setup();
    for i in 0..3 {
        h.canary_started(S * i);
        h.canary_finished(
            Ok(CanaryAnswer::new(vec![1], Duration::from_millis(10))),
            None,
            true,
            &config,
            S * i,
            &mut rng,
        );
    }
    assert_eq!(h.state, HealthState::Healthy);
    h.canary_started(10 * S);
    h.canary_finished(
        Ok(CanaryAnswer::new(vec![1], Duration::from_millis(100))),
        None,
        true,
        &config,
        10 * S,
        &mut rng,
    );
    assert_eq!(h.last_failure, Some(Failure::LatencySpike));
    assert_eq!(h.state, HealthState::Suspicious);
}

#[test]
fn a_slow_canary_that_met_requests_on_the_worker_is_not_a_spike() {
    let (mut h, config, mut rng) = setup();
    let fast = Duration::from_millis(10);
    for i in 0..3 {
        h.canary_started(S * i);
        h.canary_finished(
            Ok(CanaryAnswer::new(vec![1], fast)),
            None,
            true,
            &config,
            S * i,
            &mut rng,
        );
    }
    let average = h.canary_latency;
    // Ten times slower, behind the worker's own requests: passed, average unchanged.
    h.canary_started(10 * S);
    h.canary_under_load = true;
    let slow = Ok(CanaryAnswer::new(vec![1], 10 * fast));
    assert_eq!(
        h.canary_finished(slow, None, true, &config, 10 * S, &mut rng),
        None
    );
    assert_eq!(h.state, HealthState::Healthy);
    assert_eq!(h.canary_latency, average);
    // Its answer is still judged.
    h.canary_started(20 * S);
    h.canary_under_load = true;
    let wrong = h.canary_finished(
        Ok(CanaryAnswer::new(vec![2], fast)),
        None,
        true,
        &config,
        20 * S,
        &mut rng,
    );
    assert_eq!(wrong.map(|c| c.to), Some(HealthState::Unhealthy));
    // The same latency on an idle worker is a spike.
    let (mut h, config, mut rng) = setup();
    for i in 0..3 {
        h.canary_started(S * i);
        h.canary_finished(
            Ok(CanaryAnswer::new(vec![1], fast)),
            None,
            true,
            &config,
            S * i,
            &mut rng,
        );
    }
    h.canary_started(10 * S);
    h.canary_finished(
        Ok(CanaryAnswer::new(vec![1], 10 * fast)),
        None,
        true,
        &config,
        10 * S,
        &mut rng,
    );
    assert_eq!(h.last_failure, Some(Failure::LatencySpike));
}

#[test]
fn canaries_on_a_timer_and_when_idle() {
    let (mut h, config, _) = setup();
    assert!(
        h.canary_due(&config, Duration::ZERO),
        "the first one at once"
    );
    h.canary_started(Duration::ZERO);
    let mut rng = SmallRng::seed_from_u64(0);
    h.canary_finished(
        Ok(CanaryAnswer::new(vec![1], S / 100)),
        None,
        true,
        &config,
        Duration::ZERO,
        &mut rng,
    );
    // Busy (activity every second): only the 30 s timer.
    for t in 1..30 {
        h.succeed(&config, t * S, false);
        assert!(!h.canary_due(&config, t * S), "at {t} s");
    }
    assert!(h.canary_due(&config, 30 * S));
    // Idle for 10 s: a canary before the timer.
    h.canary_started(30 * S);
    h.canary_finished(
        Ok(CanaryAnswer::new(vec![1], S / 100)),
        None,
        true,
        &config,
        30 * S,
        &mut rng,
    );
    assert!(!h.canary_due(&config, 39 * S));
    assert!(h.canary_due(&config, 40 * S));
}

#[test]
fn stall_timeouts_follow_the_workers_own_pace_above_a_floor() {
    let (mut h, config, _) = setup();
    assert_eq!(h.stall_timeout(&config), config.stall_floor);
    for _ in 0..50 {
        h.observe_gap(Duration::from_millis(300), &config, S);
    }
    let timeout = h.stall_timeout(&config);
    assert!(
        timeout > Duration::from_millis(2900) && timeout < Duration::from_millis(3100),
        "{timeout:?}"
    );
}

#[test]
fn jitter_spreads_recovery_within_its_bounds() {
    let config = HealthConfig::default();
    let mut rng = SmallRng::seed_from_u64(3);
    let mut untils = Vec::new();
    for _ in 0..50 {
        let mut h = WorkerHealth::new(Duration::ZERO);
        h.fail(
            Failure::WrongOutput,
            true,
            &config,
            Duration::ZERO,
            &mut rng,
        );
        if let Breaker::Open { until } = h.breaker {
            untils.push(until);
        }
    }
    assert!(untils.iter().all(|u| *u >= 48 * S && *u <= 72 * S));
    assert!(untils.iter().any(|u| *u != untils[0]), "not all the same");
}

#[test]
fn the_majority_answer_counts_each_worker_once() {
    let a: &[Token] = &[1, 2];
    let b: &[Token] = &[3];
    assert_eq!(majority([a, b, a].into_iter()), Some((a, 2)));
    assert_eq!(majority([b, a, a, a].into_iter()), Some((a, 3)));
    assert_eq!(
        majority([b, a].into_iter()),
        None,
        "a split is no reference"
    );
    assert_eq!(majority([a, a, b, b].into_iter()), None, "nor a tie");
    assert_eq!(majority([a].into_iter()), None, "nor one worker alone");
    assert_eq!(majority(std::iter::empty()), None);
}
