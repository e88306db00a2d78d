//! Requests with media in the simulator: encoders in front of the LLM workers, their time
//! in the time to first token, and joint routing that skips them for cached media.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use switchyard_core::trace::MooncakeRecord;
use switchyard_mocker::{EngineArgs, PerfModel};
use switchyard_router::routing::encoders::{EncoderCost, EncoderPolicy};
use switchyard_router::{PolicyKind, RoutingConfig};
use switchyard_sim::{EncoderSim, PreparedWorkload, SimConfig, SimReport, TraceRequest, simulate};
use switchyard_workload::synth::MediaMix;

/// The head of the conversation trace with media from `mix` (pool of `pool` items).
fn workload(rows: usize, mix: &str, pool: u64, speedup: f64) -> PreparedWorkload {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../testdata/mooncake_conversation_head3000.jsonl"
    ))
    .unwrap();
    let mut records: Vec<MooncakeRecord> = text
        .lines()
        .take(rows)
        .map(|l| MooncakeRecord::parse(l).unwrap())
        .collect();
    let mix = MediaMix {
        pool,
        ..mix.parse::<MediaMix>().unwrap()
    };
    mix.apply(&mut records, 1, 512);
    let trace: Vec<TraceRequest> = records.iter().map(TraceRequest::from_mooncake).collect();
    PreparedWorkload::prepare(&trace, 512, 16, speedup)
}

fn config(encoders: Option<(usize, EncoderPolicy, bool)>) -> SimConfig {
    SimConfig {
        encoders: encoders.map(|(count, policy, joint)| EncoderSim {
            count,
            cost: EncoderCost::default(),
            policy,
            joint,
            overlap: false,
        }),
        workers: 4,
        engine: EngineArgs::default(),
        perf: vec![PerfModel::Polynomial],
        routing: RoutingConfig::default(),
        event_delay: Duration::ZERO,
        eos_token_ids: Vec::new(),
        seed: 1,
        record_requests: false,
        lazy_engines: true,
        faults: Default::default(),
        planner: None,
        sla_targets: None,
        disagg: None,
    }
}

fn run(config: &SimConfig, workload: &PreparedWorkload) -> SimReport {
    simulate(config, workload, PolicyKind::Latency, &mut |_| {}).unwrap()
}

#[test]
fn encoding_time_counts_in_the_ttft_of_requests_with_media_only() {
    let w = workload(300, "image=0.3,video=0.2", 100_000, 1.0);
    let plain = run(&config(None), &w);
    let encoded = run(&config(Some((1, EncoderPolicy::Soonest, false))), &w);
    assert_eq!(plain.completed, 300);
    assert_eq!(encoded.completed, 300);
    let m = encoded.media.as_ref().unwrap();
    assert!(m.requests > 100, "{} requests with media", m.requests);
    assert_eq!(m.items, m.requests);
    assert_eq!(m.encoders, 1);
    assert!(m.encoder_utilisation > 0.0 && m.encoder_utilisation < 1.0);
    // A video is 30 frames at 1.6 ms: no request with media is encoded in under 4.8 ms.
    assert!(m.encode_wait_ms.p50 >= 4.8, "{:?}", m.encode_wait_ms);
    let class = |r: &SimReport, c: &str| r.media.as_ref().unwrap().ttft_ms_by_class[c];
    assert!(class(&encoded, "video").mean > class(&plain, "video").mean);
    assert!(class(&encoded, "image").mean > class(&plain, "image").mean);
    assert!(plain.media.as_ref().unwrap().encoders == 0);
    // Lazy engines (on their own between routing points) and strict global order agree
    // with encoders' events in the queue.
    let strict = SimConfig {
        lazy_engines: false,
        ..config(Some((1, EncoderPolicy::Soonest, false)))
    };
    let exact = run(&strict, &w);
    assert_eq!(exact.ttft_ms, encoded.ttft_ms);
    assert_eq!(exact.media, encoded.media);
}

#[test]
fn more_encoders_and_the_soonest_choice_cut_the_wait_under_load() {
    // Video-heavy and fast: one encoder is a bottleneck (the LLM workers are overloaded
    // too, and refuse some; the encoders see every request admitted).
    let w = workload(400, "video=0.8", 100_000, 8.0);
    let wait = |count, policy| {
        run(&config(Some((count, policy, false))), &w)
            .media
            .unwrap()
            .encode_wait_ms
    };
    let one = wait(1, EncoderPolicy::Soonest);
    let four = wait(4, EncoderPolicy::Soonest);
    assert!(
        four.p90 < one.p90,
        "p90 {} with 4 encoders, {} with 1",
        four.p90,
        one.p90
    );
    let turns = wait(4, EncoderPolicy::RoundRobin);
    assert!(
        four.mean <= turns.mean,
        "soonest {} vs round robin {}",
        four.mean,
        turns.mean
    );
}

#[test]
fn joint_routing_skips_the_encoders_for_media_a_worker_holds() {
    // Five images after the trace's shared first blocks: the same image behind the same
    // system prompt recurs, and is found cached.
    let w = workload(600, "image=0.6", 5, 1.0);
    let alone = run(&config(Some((1, EncoderPolicy::Soonest, false))), &w);
    let joint = run(&config(Some((1, EncoderPolicy::Soonest, true))), &w);
    assert_eq!(alone.completed, 600);
    assert_eq!(joint.completed, 600);
    let (a, j) = (alone.media.unwrap(), joint.media.unwrap());
    assert_eq!(a.skipped, 0);
    assert!(j.skipped > 20, "{} of {} skipped", j.skipped, j.requests);
    assert!(
        j.ttft_ms_by_class["image"].mean < a.ttft_ms_by_class["image"].mean,
        "image TTFT {} joint vs {} alone",
        j.ttft_ms_by_class["image"].mean,
        a.ttft_ms_by_class["image"].mean
    );
}

#[test]
fn overlapping_text_prefill_with_encoding_cuts_video_ttft_behind_a_long_prefix() {
    // Every request has a 30-frame video after 4,096 tokens of text (or at the end of a
    // shorter prompt).
    let w = workload(300, "video=1,offset=4096", 100_000, 0.5);
    let sequential = config(Some((1, EncoderPolicy::Soonest, false)));
    let mut overlapped = sequential.clone();
    if let Some(e) = overlapped.encoders.as_mut() {
        e.overlap = true;
    }
    let a = run(&sequential, &w);
    let b = run(&overlapped, &w);
    assert!(a.completed > 50, "{}", a.completed);
    assert_eq!(a.completed, b.completed);
    let video = |r: &SimReport| r.media.as_ref().unwrap().ttft_ms_by_class["video"];
    assert!(
        video(&b).mean < video(&a).mean,
        "overlapped {:?}, sequential {:?}",
        video(&b),
        video(&a)
    );
}
