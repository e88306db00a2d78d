//! The routing core: registry, cache views, exclusion, draining and admission.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use switchyard_core::{
    HashSeed, KvEvent, KvEventData, Priority, RequestId, StorageTier, StoredBlock, TokenBlocks,
    WorkerId, WorkerKey, WorkerRole,
};
use switchyard_router::routing::health::CanaryAnswer;
use switchyard_router::{
    Admission, AdmissionConfig, CacheViewMode, HealthState, Indexer, IndexerConfig, JoinRefused,
    OverlapScores, PolicyKind, Rejection, RouteQuery, RouterConfig, RoutingConfig, RoutingCore,
    RoutingOverrides, WorkerSpec,
};

const T0: Duration = Duration::ZERO;

fn core(policy: PolicyKind) -> RoutingCore {
    RoutingCore::new(RoutingConfig {
        router: RouterConfig {
            policy,
            block_size: 4,
            ..RouterConfig::default()
        },
        ..RoutingConfig::default()
    })
}

fn spec(id: u64) -> WorkerSpec {
    WorkerSpec {
        capacity_blocks: Some(100),
        max_num_seqs: Some(4),
        ..WorkerSpec::new(WorkerId(id), 4)
    }
}

fn blocks(tokens: &[u32]) -> TokenBlocks {
    TokenBlocks::new(tokens, 4, HashSeed::default()).unwrap()
}

fn route(
    core: &mut RoutingCore,
    id: u64,
    prompt: &TokenBlocks,
    events: &OverlapScores,
    exclude: &[WorkerId],
) -> Option<WorkerId> {
    core.route(
        &RouteQuery {
            id: RequestId(id),
            blocks: prompt,
            overrides: RoutingOverrides::default(),
            exclude,
        },
        events,
        T0,
    )
    .ok()
    .map(|d| d.worker.worker_id)
}

#[test]
fn block_sizes_must_agree_until_every_sized_worker_is_gone() {
    let mut core = core(PolicyKind::Kv);
    assert_eq!(
        core.block_size(),
        4,
        "the configured size until a worker says"
    );
    core.add_worker(WorkerSpec::new(WorkerId(1), 16)).unwrap();
    assert_eq!(core.block_size(), 16);
    assert_eq!(
        core.add_worker(WorkerSpec::new(WorkerId(2), 32)),
        Err(JoinRefused::BlockSize {
            worker: WorkerId(2),
            expected: 16,
            got: 32
        })
    );
    // A worker without blocks fits any fleet.
    let mut unsized_ = WorkerSpec::new(WorkerId(3), 1);
    unsized_.block_size = None;
    core.add_worker(unsized_).unwrap();
    assert!(core.worker_left(WorkerId(1)));
    assert_eq!(core.block_size(), 4);
    core.add_worker(WorkerSpec::new(WorkerId(2), 32)).unwrap();
    assert_eq!(core.block_size(), 32);
}

#[test]
fn excluded_unhealthy_draining_and_non_generating_workers_get_nothing() {
    let mut core = core(PolicyKind::RoundRobin);
    for id in 1..=5 {
        core.add_worker(spec(id)).unwrap();
    }
    core.set_health(WorkerId(2), HealthState::Unhealthy);
    core.set_draining(WorkerId(3), true);
    core.remove_worker(WorkerId(4));
    let mut encoder = spec(4);
    encoder.role = WorkerRole::Encoder;
    core.add_worker(encoder).unwrap();
    let prompt = blocks(&[1, 2, 3, 4, 5]);
    let none = OverlapScores::default();
    let mut chosen = Vec::new();
    for id in 0..6 {
        chosen.push(route(&mut core, id, &prompt, &none, &[WorkerId(5)]).unwrap());
    }
    assert!(chosen.iter().all(|w| *w == WorkerId(1)), "{chosen:?}");
    assert_eq!(
        route(&mut core, 99, &prompt, &none, &[WorkerId(1), WorkerId(5)]),
        None
    );
    // Suspicious workers are still used.
    core.set_health(WorkerId(2), HealthState::Suspicious);
    let picked: Vec<_> = (10..40)
        .map(|id| route(&mut core, id, &prompt, &none, &[]).unwrap())
        .collect();
    assert!(picked.contains(&WorkerId(2)));
}

#[test]
fn a_departed_worker_keeps_its_load_until_its_requests_end() {
    let mut core = core(PolicyKind::LeastLoaded);
    core.add_worker(spec(1)).unwrap();
    core.add_worker(spec(2)).unwrap();
    let prompt = blocks(&(0..16).collect::<Vec<_>>());
    let none = OverlapScores::default();
    let first = route(&mut core, 1, &prompt, &none, &[]).unwrap();
    let key = WorkerKey::from(first);
    assert!(!core.worker_left(first), "it still runs a request");
    assert_eq!(core.load(key).requests, 1, "its load still counts");
    assert!(!core.accepts_events(first));
    assert_ne!(route(&mut core, 2, &prompt, &none, &[]), Some(first));
    assert_eq!(core.finish(RequestId(1)), Some(key));
    assert!(core.worker(first).is_none(), "gone once drained");
    // An idle worker leaves at once.
    let other = if first == WorkerId(1) {
        WorkerId(2)
    } else {
        WorkerId(1)
    };
    core.finish(RequestId(2));
    assert!(core.worker_left(other));
    assert_eq!(core.routable_workers(), 0);
}

#[test]
fn sync_follows_discovery_and_restarts_drop_the_old_incarnation() {
    let mut core = core(PolicyKind::Kv);
    let changes = core.sync_workers([spec(1), spec(2)]);
    assert_eq!(changes.joined, vec![WorkerId(1), WorkerId(2)]);
    let prompt = blocks(&[1, 2, 3, 4]);
    route(
        &mut core,
        1,
        &prompt,
        &OverlapScores::default(),
        &[WorkerId(2)],
    )
    .unwrap();
    let mut restarted = spec(1);
    restarted.incarnation = 7;
    let changes = core.sync_workers([restarted, spec(2)]);
    assert_eq!(changes.left, vec![WorkerId(1)]);
    assert_eq!(changes.joined, vec![WorkerId(1)]);
    assert_eq!(
        core.load(WorkerKey::from(WorkerId(1))).requests,
        0,
        "the old incarnation's requests died with it"
    );
    let mut odd = spec(3);
    odd.block_size = Some(8);
    let changes = core.sync_workers([spec(2), odd]);
    assert_eq!(changes.left, vec![WorkerId(1)]);
    assert_eq!(changes.refused.len(), 1);
    assert_eq!(core.registry().len(), 1);
}

fn stored(worker: u64, id: u64, prompt: &TokenBlocks) -> KvEvent {
    KvEvent {
        worker_id: WorkerId(worker),
        dp_rank: 0,
        event_id: id,
        tier: StorageTier::Device,
        data: KvEventData::Stored {
            parent: None,
            blocks: prompt
                .local_hashes()
                .iter()
                .zip(prompt.sequence_hashes())
                .map(|(&local_hash, &seq_hash)| StoredBlock {
                    seq_hash,
                    local_hash,
                })
                .collect(),
        },
    }
}

#[test]
fn each_worker_is_seen_through_its_own_cache_view() {
    let mut core = core(PolicyKind::Kv);
    let mut quiet = spec(2);
    quiet.kv_events = false;
    core.add_worker(spec(1)).unwrap();
    core.add_worker(quiet).unwrap();
    assert!(core.accepts_events(WorkerId(1)) && !core.accepts_events(WorkerId(2)));
    let a = blocks(&(0..32).collect::<Vec<_>>());
    let b = blocks(&(100..132).collect::<Vec<_>>());
    // Worker 1 reports caching `a`; worker 2, without events, is assumed to cache what it
    // was sent. An event claiming worker 2 holds `a` is not believed.
    let mut indexer = Indexer::new(IndexerConfig::default());
    indexer.apply(&stored(1, 1, &a));
    indexer.apply(&stored(2, 1, &a));
    let to_two = route(
        &mut core,
        1,
        &b,
        &indexer.find_matches(b.local_hashes()),
        &[WorkerId(1)],
    );
    assert_eq!(to_two, Some(WorkerId(2)));
    core.finish(RequestId(1));
    for (id, prompt, expected) in [(2, &a, WorkerId(1)), (3, &b, WorkerId(2))] {
        let events = indexer.find_matches(prompt.local_hashes());
        assert_eq!(route(&mut core, id, prompt, &events, &[]), Some(expected));
        core.finish(RequestId(id));
    }
    // Forcing the approximate view for everyone (a router without events).
    let mut config = *core.config();
    config.router.cache_view = CacheViewMode::Approximate;
    let mut blind = RoutingCore::new(config);
    blind.add_worker(spec(1)).unwrap();
    assert!(!blind.accepts_events(WorkerId(1)));
}

#[test]
fn admission_queues_while_busy_and_releases_as_requests_end() {
    let mut core = RoutingCore::new(RoutingConfig {
        router: RouterConfig {
            policy: PolicyKind::LeastLoaded,
            block_size: 4,
            ..RouterConfig::default()
        },
        admission: AdmissionConfig {
            max_queue: 8,
            ..AdmissionConfig::default()
        },
        ..RoutingConfig::default()
    });
    assert_eq!(
        core.admit(RequestId(0), Priority::Premium, T0),
        Admission::Rejected(Rejection::NoWorkers)
    );
    let mut one = spec(1);
    one.max_num_seqs = Some(2);
    core.add_worker(one).unwrap();
    let prompt = blocks(&[1, 2, 3, 4]);
    let none = OverlapScores::default();
    for id in 1..=2 {
        assert_eq!(
            core.admit(RequestId(id), Priority::Standard, T0),
            Admission::Admitted
        );
        route(&mut core, id, &prompt, &none, &[]).unwrap();
    }
    assert!(core.all_busy());
    assert_eq!(
        core.admit(RequestId(3), Priority::BestEffort, T0),
        Admission::Rejected(Rejection::Shed)
    );
    assert_eq!(
        core.admit(RequestId(4), Priority::Standard, T0),
        Admission::Queued
    );
    assert_eq!(
        core.admit(RequestId(5), Priority::Premium, T0),
        Admission::Queued
    );
    assert_eq!(core.next_admitted(Duration::ZERO), None);
    core.finish(RequestId(1));
    assert_eq!(
        core.next_admitted(Duration::ZERO),
        Some(RequestId(5)),
        "premium first"
    );
    assert_eq!(core.next_admitted(Duration::ZERO), None, "one at a time");
    route(&mut core, 5, &prompt, &none, &[]).unwrap();
    assert_eq!(core.next_admitted(Duration::ZERO), None, "busy again");
    core.finish(RequestId(2));
    assert_eq!(core.next_admitted(Duration::ZERO), Some(RequestId(4)));
    assert!(core.withdraw(RequestId(4), Duration::ZERO));
    assert_eq!(core.queued(), 0);
}

#[test]
fn failures_take_a_worker_out_of_rotation_and_a_canary_brings_it_back() {
    use switchyard_router::routing::health::Failure;
    let mut core = core(PolicyKind::RoundRobin);
    core.add_worker(spec(1)).unwrap();
    core.add_worker(spec(2)).unwrap();
    let prompt = blocks(&[1, 2, 3, 4]);
    let none = OverlapScores::default();
    let s = Duration::from_secs(1);
    // One failure: suspicious, picked for about half its share.
    core.observe_failure(WorkerId(2), Failure::Disconnected, s);
    let to_two = (0..400)
        .filter(|&id| {
            let w = route(&mut core, id, &prompt, &none, &[]);
            core.finish(RequestId(id));
            w == Some(WorkerId(2))
        })
        .count();
    assert!((60..140).contains(&to_two), "{to_two} of 400");
    // Two more in a row: unhealthy, nothing goes there.
    core.observe_failure(WorkerId(2), Failure::Stalled, 2 * s);
    let change = core.observe_failure(WorkerId(2), Failure::Stalled, 3 * s);
    assert_eq!(change.map(|c| c.to), Some(HealthState::Unhealthy));
    for id in 1000..1020 {
        assert_eq!(route(&mut core, id, &prompt, &none, &[]), Some(WorkerId(1)));
        core.finish(RequestId(id));
    }
    // Canaries: both workers are due at first; afterwards only the half-open one after
    // its recovery timeout (with jitter, 48 to 72 s).
    let mut due = core.due_canaries(4 * s);
    due.sort();
    assert_eq!(due, vec![WorkerId(1)], "an open breaker gets no canary");
    core.canary_finished(
        WorkerId(1),
        Ok(CanaryAnswer::new(vec![7, 8], s / 100)),
        4 * s,
    );
    assert!(core.due_canaries(10 * s).is_empty());
    // Worker 1, idle for 10 s, gets one; worker 2 still waits for its breaker.
    assert_eq!(core.due_canaries(14 * s), vec![WorkerId(1)]);
    core.canary_finished(
        WorkerId(1),
        Ok(CanaryAnswer::new(vec![7, 8], s / 100)),
        14 * s,
    );
    assert_eq!(core.due_canaries(80 * s), vec![WorkerId(1), WorkerId(2)]);
    core.canary_finished(
        WorkerId(1),
        Ok(CanaryAnswer::new(vec![7, 8], s / 100)),
        80 * s,
    );
    // Worker 2's probe answers what the fleet answers: it is healthy and routed to again.
    let back = core.canary_finished(
        WorkerId(2),
        Ok(CanaryAnswer::new(vec![7, 8], s / 100)),
        80 * s,
    );
    assert_eq!(back.map(|c| c.to), Some(HealthState::Healthy));
    let picked: Vec<_> = (2000..2004)
        .map(|id| route(&mut core, id, &prompt, &none, &[]))
        .collect();
    assert!(picked.contains(&Some(WorkerId(2))));
}

#[test]
fn soft_failures_take_out_half_the_fleet_at_most_and_hard_ones_any_worker() {
    use switchyard_router::routing::health::Failure;
    let mut core = core(PolicyKind::RoundRobin);
    for id in 1..=4 {
        core.add_worker(spec(id)).unwrap();
    }
    // Encoders are a pool of their own: they make no room among the LLM workers.
    for id in 5..=6 {
        core.add_worker(role_spec(id, WorkerRole::Encoder)).unwrap();
    }
    let s = Duration::from_secs(1);
    let state = |core: &RoutingCore, id| core.worker(WorkerId(id)).unwrap().health.state;
    // Hangs: two of four workers go out at once; the third stays in, suspicious, however
    // often it fails softly (the fleet looks overloaded rather than broken).
    core.observe_failure(WorkerId(1), Failure::Hung, s);
    core.observe_failure(WorkerId(2), Failure::Hung, s);
    for _ in 0..5 {
        core.observe_failure(WorkerId(3), Failure::Hung, 2 * s);
        core.observe_failure(WorkerId(3), Failure::Timeout, 2 * s);
    }
    assert_eq!(state(&core, 1), HealthState::Unhealthy);
    assert_eq!(state(&core, 2), HealthState::Unhealthy);
    assert_eq!(state(&core, 3), HealthState::Suspicious);
    // Every hang, and every timeout but the first (the second failure in a row, below the
    // threshold of three), would have opened its breaker.
    assert_eq!(core.worker(WorkerId(3)).unwrap().health.kept_in, 9);
    assert_eq!(core.routable_workers(), 2);
    // Refused connections are evidence of a broken worker: out regardless of the cap, and
    // the last worker still cannot be taken out by stalls or slow canaries.
    for _ in 0..3 {
        core.observe_failure(WorkerId(3), Failure::Unreachable, 3 * s);
    }
    assert_eq!(state(&core, 3), HealthState::Unhealthy);
    for _ in 0..3 {
        core.observe_failure(WorkerId(4), Failure::Stalled, 3 * s);
    }
    core.canary_finished(WorkerId(4), Err(Failure::CanaryTimeout), 3 * s);
    assert_eq!(state(&core, 4), HealthState::Suspicious);
    // Workers that left do not count: with 1, 2 and 3 gone, the pool is worker 4 alone,
    // and one worker may always go out.
    for id in 1..=3 {
        core.worker_left(WorkerId(id));
    }
    let change = core.observe_failure(WorkerId(4), Failure::Stalled, 4 * s);
    assert_eq!(change.map(|c| c.to), Some(HealthState::Unhealthy));

    // A cap of 1 turns it off: all four can go out on hangs.
    let mut core = RoutingCore::new(RoutingConfig {
        health: switchyard_router::routing::health::HealthConfig {
            max_unhealthy_fraction: 1.0,
            ..Default::default()
        },
        ..RoutingConfig::default()
    });
    for id in 1..=4 {
        core.add_worker(spec(id)).unwrap();
        core.observe_failure(WorkerId(id), Failure::Hung, s);
    }
    assert_eq!(core.routable_workers(), 0);
}

#[test]
fn requests_queue_while_every_worker_is_out_and_start_when_one_joins() {
    use switchyard_router::routing::health::Failure;
    let mut core = core(PolicyKind::RoundRobin);
    core.add_worker(spec(1)).unwrap();
    let s = Duration::from_secs(1);
    for n in 1..=3 {
        core.observe_failure(WorkerId(1), Failure::Disconnected, n * s);
    }
    assert_eq!(core.routable_workers(), 0);
    // The worker is registered but out of rotation: a new request waits, it is not refused.
    assert_eq!(
        core.admit(RequestId(1), Priority::Standard, 4 * s),
        Admission::Queued
    );
    assert_eq!(core.next_admitted(4 * s), None, "nobody to take it yet");
    // A replacement joins: the request starts.
    core.add_worker(spec(2)).unwrap();
    assert_eq!(core.next_admitted(5 * s), Some(RequestId(1)));
    // A fleet that has gone altogether refuses at once.
    core.worker_left(WorkerId(1));
    core.worker_left(WorkerId(2));
    assert_eq!(
        core.admit(RequestId(2), Priority::Premium, 6 * s),
        Admission::Rejected(Rejection::NoWorkers)
    );
}

#[test]
fn a_worker_answering_canaries_unlike_the_fleet_is_taken_out_at_once() {
    let mut core = core(PolicyKind::RoundRobin);
    for id in 1..=3 {
        core.add_worker(spec(id)).unwrap();
    }
    let s = Duration::from_secs(1);
    assert_eq!(core.due_canaries(s).len(), 3);
    core.canary_finished(WorkerId(1), Ok(CanaryAnswer::new(vec![7, 8], s / 100)), s);
    core.canary_finished(WorkerId(2), Ok(CanaryAnswer::new(vec![7, 8], s / 100)), s);
    let odd = core.canary_finished(WorkerId(3), Ok(CanaryAnswer::new(vec![7, 9], s / 100)), s);
    assert_eq!(odd.map(|c| c.to), Some(HealthState::Unhealthy));
    assert_eq!(core.routable_workers(), 2);
}

#[test]
fn losing_most_of_the_fleet_sheds_the_lower_tiers_first() {
    use switchyard_router::routing::health::Failure;
    let mut core = core(PolicyKind::RoundRobin);
    for id in 1..=4 {
        core.add_worker(spec(id)).unwrap();
    }
    let s = Duration::from_secs(1);
    assert_eq!(core.degradation_level(s), 0);
    // Three of four crash: their streams fail (unhealthy), then their leases expire.
    for id in 2..=4 {
        for _ in 0..3 {
            core.observe_failure(WorkerId(id), Failure::Disconnected, s);
        }
        core.worker_left(WorkerId(id));
    }
    // Level 2 (best-effort shed) while the escalation hold runs, then 3.
    assert_eq!(core.degradation_level(2 * s), 2);
    assert_eq!(core.degradation_level(4 * s), 3);
    assert_eq!(
        core.admit(RequestId(1), Priority::BestEffort, 4 * s),
        Admission::Rejected(Rejection::Shed)
    );
    assert_eq!(
        core.admit(RequestId(2), Priority::Premium, 4 * s),
        Admission::Admitted
    );
    assert_eq!(
        core.admit(RequestId(3), Priority::Standard, 4 * s),
        Admission::Admitted
    );
    assert_eq!(
        core.queue_timeout(Priority::Premium),
        2 * AdmissionConfig::default().queue_timeout
    );
    // They come back under their ids: normal again.
    for id in 2..=4 {
        core.add_worker(spec(id)).unwrap();
    }
    assert_eq!(core.degradation_level(5 * s), 0);
}

#[test]
fn a_worker_computing_routed_prompts_is_predicted_busy_until_it_is_through() {
    let mut core = core(PolicyKind::RoundRobin);
    core.add_worker(spec(1)).unwrap();
    let none = OverlapScores::default();
    let ms = Duration::from_millis;
    assert_eq!(core.queued_prefill_time(WorkerId(1), T0), Duration::ZERO);
    // Two long prompts routed to it at 0 s: it is busy with both for a while.
    let long: Vec<u32> = (0..4000).collect();
    let other: Vec<u32> = (10_000..14_000).collect();
    assert_eq!(
        route(&mut core, 1, &blocks(&long), &none, &[]),
        Some(WorkerId(1))
    );
    let one = core.queued_prefill_time(WorkerId(1), T0);
    assert_eq!(
        route(&mut core, 2, &blocks(&other), &none, &[]),
        Some(WorkerId(1))
    );
    let two = core.queued_prefill_time(WorkerId(1), T0);
    assert!(one > Duration::ZERO && two > one, "{one:?} {two:?}");
    // Time spent on them counts off; past the prediction it is not busy any more.
    let later = core.queued_prefill_time(WorkerId(1), one / 2);
    assert!(later < two && later > Duration::ZERO, "{later:?}");
    assert_eq!(
        core.queued_prefill_time(WorkerId(1), two + ms(1)),
        Duration::ZERO
    );
    // Both prompts computed: nothing queued whatever the clock.
    core.prefill_done(RequestId(1), ms(1));
    core.prefill_done(RequestId(2), ms(1));
    assert_eq!(core.queued_prefill_time(WorkerId(1), ms(1)), Duration::ZERO);
    // Unknown workers are never busy.
    assert_eq!(core.queued_prefill_time(WorkerId(9), T0), Duration::ZERO);
}

fn role_spec(id: u64, role: WorkerRole) -> WorkerSpec {
    WorkerSpec {
        role,
        capacity_blocks: Some(1000),
        max_num_seqs: Some(64),
        ..WorkerSpec::new(WorkerId(id), 4)
    }
}

fn pair(
    core: &mut RoutingCore,
    id: u64,
    prompt: &TokenBlocks,
    events: &OverlapScores,
    exclude: &[WorkerId],
) -> (
    switchyard_router::PairDecision,
    Option<switchyard_router::LocalReason>,
) {
    core.route_pair(
        &RouteQuery {
            id: RequestId(id),
            blocks: prompt,
            overrides: RoutingOverrides::default(),
            exclude,
        },
        events,
        T0,
    )
    .unwrap()
}

#[test]
fn a_long_prompt_for_a_decode_worker_is_prefilled_on_a_prefill_worker() {
    let mut core = RoutingCore::new(RoutingConfig {
        router: RouterConfig {
            policy: PolicyKind::Kv,
            block_size: 4,
            ..RouterConfig::default()
        },
        disagg: switchyard_router::DisaggConfig {
            local_prefill_tokens: 16,
            max_prefill_queue_tokens: 100,
        },
        ..RoutingConfig::default()
    });
    for (id, role) in [
        (1, WorkerRole::Prefill),
        (2, WorkerRole::Prefill),
        (3, WorkerRole::Decode),
    ] {
        core.add_worker(role_spec(id, role)).unwrap();
    }
    assert_eq!(core.prefill_workers(), 2);
    assert_eq!(
        core.routable_workers(),
        1,
        "prefill workers generate nothing"
    );
    // Worker 2 holds the prompt's first 8 blocks: it computes the rest.
    let long = blocks(&(0..40).collect::<Vec<_>>());
    let mut indexer = Indexer::new(IndexerConfig::default());
    indexer.apply(&stored(2, 1, &blocks(&(0..32).collect::<Vec<_>>())));
    let (decision, local) = pair(
        &mut core,
        1,
        &long,
        &indexer.find_matches(long.local_hashes()),
        &[],
    );
    assert_eq!(local, None);
    assert_eq!(decision.decode.worker.worker_id, WorkerId(3));
    let prefill = decision.prefill.expect("a remote prefill");
    assert_eq!(prefill.worker.worker_id, WorkerId(2), "by its KV overlap");
    assert_eq!(prefill.prefill_tokens, 8);
    // The prefill worker counts it (as a prefill) until its first token; the decode
    // worker holds its blocks with nothing to compute.
    let p = core.load(prefill.worker);
    let d = core.load(decision.decode.worker);
    assert_eq!((p.requests, p.prefill_tokens), (1, 8));
    assert_eq!((d.requests, d.prefill_tokens), (1, 0));
    assert_eq!(core.prefill_finished(RequestId(1)), Some(prefill.worker));
    assert_eq!(core.load(prefill.worker).requests, 0);
    assert_eq!(core.load(decision.decode.worker).requests, 1);
    assert_eq!(core.finish(RequestId(1)), Some(decision.decode.worker));
    assert_eq!(core.prefill_finished(RequestId(1)), None, "only once");

    // A short prompt stays on the decode worker.
    let short = blocks(&(500..512).collect::<Vec<_>>());
    let (decision, local) = pair(&mut core, 2, &short, &OverlapScores::default(), &[]);
    assert_eq!(local, Some(switchyard_router::LocalReason::Short));
    assert!(decision.prefill.is_none());
    assert_eq!(core.load(decision.decode.worker).prefill_tokens, 12);
    core.finish(RequestId(2));

    // Excluded prefill workers are not chosen; with none left, the prefill is local.
    let (decision, _) = pair(
        &mut core,
        3,
        &long,
        &OverlapScores::default(),
        &[WorkerId(2)],
    );
    assert_eq!(decision.prefill.unwrap().worker.worker_id, WorkerId(1));
    let (decision, local) = pair(
        &mut core,
        4,
        &long,
        &OverlapScores::default(),
        &[WorkerId(1), WorkerId(2)],
    );
    assert_eq!(local, Some(switchyard_router::LocalReason::Unavailable));
    assert!(decision.prefill.is_none());
    core.finish(RequestId(4));

    // Saturation: 40-token prompts go remote while the chosen (least busy) prefill
    // worker has under 100 tokens queued: three each (0, 40, 80 queued), request 3
    // included; then the prefill is local.
    let mut remote = 1;
    let mut id = 5;
    loop {
        let (decision, local) = pair(&mut core, id, &long, &OverlapScores::default(), &[]);
        id += 1;
        match local {
            None => remote += 1,
            Some(reason) => {
                assert_eq!(reason, switchyard_router::LocalReason::Saturated);
                assert!(decision.prefill.is_none());
                break;
            }
        }
        assert!(remote <= 6, "past the queue limit");
    }
    assert_eq!(remote, 6);
    for w in [1, 2] {
        assert_eq!(core.load(WorkerKey::new(w, 0)).prefill_tokens, 120);
    }
}

#[test]
fn an_aggregated_fleet_routes_pairs_as_single_workers() {
    let mut core = core(PolicyKind::Kv);
    core.add_worker(spec(1)).unwrap();
    core.add_worker(role_spec(2, WorkerRole::Prefill)).unwrap();
    let long = blocks(&(0..400).collect::<Vec<_>>());
    let (decision, local) = pair(&mut core, 1, &long, &OverlapScores::default(), &[]);
    assert_eq!(decision.decode.worker.worker_id, WorkerId(1));
    assert!(decision.prefill.is_none() && local.is_none());
    assert_eq!(core.load(decision.decode.worker).prefill_tokens, 400);
}

#[test]
fn with_a_wait_target_a_worker_with_long_queued_prefill_is_busy() {
    let core_with = |wait_target: Option<Duration>| {
        let mut core = RoutingCore::new(RoutingConfig {
            router: RouterConfig {
                policy: PolicyKind::Latency,
                block_size: 4,
                ..RouterConfig::default()
            },
            admission: AdmissionConfig {
                wait_target,
                ..AdmissionConfig::default()
            },
            ..RoutingConfig::default()
        });
        core.add_worker(WorkerSpec {
            capacity_blocks: Some(1_000_000),
            max_num_seqs: Some(1000),
            ..WorkerSpec::new(WorkerId(1), 4)
        })
        .unwrap();
        core
    };
    // A prompt of 100,000 tokens: seconds of prefill by the default timing model.
    let long: Vec<u32> = (0..100_000).collect();
    let prompt = blocks(&long);
    let none = OverlapScores::default();
    let target = Duration::from_secs(2);
    let mut core = core_with(Some(target));
    assert!(!core.all_busy());
    route(&mut core, 1, &prompt, &none, &[]).unwrap();
    let queued = core.queued_prefill_time(WorkerId(1), T0);
    assert!(queued > target, "{queued:?}");
    // Far from full by blocks or sequences, but a new request would wait past half the
    // target behind that prefill: busy, so requests queue where their wait is predicted.
    assert!(core.all_busy());
    assert_eq!(
        core.admit(RequestId(2), Priority::Standard, T0),
        Admission::Queued
    );
    assert_eq!(core.next_admitted(T0), None);
    // Once the prompt is computed the worker is free again.
    core.prefill_done(RequestId(1), queued / 2);
    assert_eq!(core.next_admitted(queued / 2), Some(RequestId(2)));
    // Without a wait target only blocks and sequences count.
    let mut core = core_with(None);
    route(&mut core, 1, &prompt, &none, &[]).unwrap();
    assert!(!core.all_busy());
}

#[test]
fn a_pinned_request_goes_to_its_worker_while_that_may_take_it() {
    use switchyard_router::routing::health::Failure;
    let mut core = core(PolicyKind::RoundRobin);
    for id in 1..=3 {
        core.add_worker(spec(id)).unwrap();
    }
    let prompt = blocks(&[1, 2, 3, 4]);
    let none = OverlapScores::default();
    let pinned = |core: &mut RoutingCore, id: u64, worker: u64, exclude: &[WorkerId]| {
        core.route(
            &RouteQuery {
                id: RequestId(id),
                blocks: &prompt,
                overrides: RoutingOverrides {
                    worker: Some(WorkerId(worker)),
                    ..RoutingOverrides::default()
                },
                exclude,
            },
            &none,
            T0,
        )
        .ok()
        .map(|d| d.worker.worker_id)
    };
    // Round robin would spread them; the pin keeps every one on worker 2.
    for id in 0..6 {
        assert_eq!(pinned(&mut core, id, 2, &[]), Some(WorkerId(2)));
    }
    // A suspicious worker still takes what is pinned to it (it holds the request's KV).
    core.observe_failure(WorkerId(3), Failure::Disconnected, T0);
    for id in 10..30 {
        assert_eq!(pinned(&mut core, id, 3, &[]), Some(WorkerId(3)));
        core.finish(RequestId(id));
    }
    // Excluded (it failed the request), unknown or out of rotation: routed as usual.
    let other = pinned(&mut core, 40, 2, &[WorkerId(2)]);
    assert!(other.is_some() && other != Some(WorkerId(2)), "{other:?}");
    assert!(pinned(&mut core, 42, 9, &[]).is_some());
    core.observe_failure(WorkerId(3), Failure::Stalled, T0);
    core.observe_failure(WorkerId(3), Failure::Stalled, T0);
    for id in 50..60 {
        assert_ne!(pinned(&mut core, id, 3, &[]), Some(WorkerId(3)));
    }
}
