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
            store_bytes: 16 << 30,
            after_prefill: Default::default(),
        }),
        workers: 4,
        engine: EngineArgs::default(),
        perf: vec![PerfModel::Polynomial],
        routing: RoutingConfig {
            admission: switchyard_router::AdmissionConfig::queue_only(),
            ..RoutingConfig::default()
        },
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
    // The typical video request gains its text's prefill. Each one's media then waits
    // behind the requests that arrived while it was encoded (as it would have, sent after
    // its encoding), and the worker it went to before its encoding is not always the one
    // routing would choose after it: the mean stays within 2 %.
    assert!(
        video(&b).p50 < 0.95 * video(&a).p50 && video(&b).mean < 1.02 * video(&a).mean,
        "overlapped {:?}, sequential {:?}",
        video(&b),
        video(&a)
    );
}

/// 32 requests at once, 1,024 tokens of text each; with `video`, the first also has a
/// 30-frame video (4,320 tokens) after its text.
fn batch_of_32(video: bool) -> PreparedWorkload {
    let trace: Vec<TraceRequest> = (0..32u64)
        .map(|i| {
            let media = if i == 0 && video {
                vec![switchyard_core::trace::MediaRecord {
                    modality: switchyard_core::protocol::Modality::Video,
                    offset: 1024,
                    tokens: 4320,
                    hash: 77,
                }]
            } else {
                Vec::new()
            };
            let tokens = 1024 + media.iter().map(|m| m.tokens).sum::<u64>();
            TraceRequest {
                arrival: Duration::ZERO,
                input_tokens: tokens as u32,
                output_tokens: 64,
                hash_ids: (0..tokens.div_ceil(512)).map(|j| i * 1000 + j).collect(),
                media,
                turn: None,
            }
        })
        .collect();
    PreparedWorkload::prepare(&trace, 512, 16, 1.0)
}

/// Time to first token of each request, in ms.
fn first_tokens(config: &SimConfig, workload: &PreparedWorkload) -> Vec<f64> {
    let config = SimConfig {
        record_requests: true,
        ..config.clone()
    };
    let report = run(&config, workload);
    report
        .request_records
        .iter()
        .map(|r| (r.first_token.unwrap() - r.arrival).as_secs_f64() * 1e3)
        .collect()
}

/// The median and the longest of `ttft`.
fn median_and_max(ttft: &[f64]) -> (f64, f64) {
    let mut v = ttft.to_vec();
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[v.len() - 1])
}

#[test]
fn a_video_sent_ahead_of_its_encoding_gains_without_delaying_the_text_requests() {
    let fleet = |workers, overlap, defer| SimConfig {
        workers,
        engine: EngineArgs {
            defer_ready_media: defer,
            ..EngineArgs::default()
        },
        encoders: Some(EncoderSim {
            count: 1,
            cost: EncoderCost::default(),
            policy: EncoderPolicy::Soonest,
            joint: false,
            overlap,
            store_bytes: 16 << 30,
            after_prefill: Default::default(),
        }),
        ..config(None)
    };
    for workers in [1, 2, 4, 8] {
        let alone = first_tokens(&fleet(workers, false, true), &batch_of_32(false));
        let sequential = first_tokens(&fleet(workers, false, true), &batch_of_32(true));
        let overlapped = first_tokens(&fleet(workers, true, true), &batch_of_32(true));
        // The video's text is computed while it is encoded.
        assert!(
            overlapped[0] < sequential[0],
            "{workers} workers: video {} overlapped, {} sequential",
            overlapped[0],
            sequential[0]
        );
        // The 31 text requests fare as they do without the video, or with it sent after
        // its encoding: its media's prefill waits behind them.
        let (p50, max) = median_and_max(&overlapped[1..]);
        let (seq_p50, seq_max) = median_and_max(&sequential[1..]);
        let (alone_p50, alone_max) = median_and_max(&alone[1..]);
        assert!(
            p50 <= 1.02 * seq_p50.max(alone_p50) && max <= 1.02 * seq_max.max(alone_max),
            "{workers} workers: text p50 {p50} max {max}, sequential {seq_p50} {seq_max}, without the video {alone_p50} {alone_max}"
        );
    }
    // Resumed at once instead (the video first): on one worker the video gains more, at
    // the text requests' expense.
    let sequential = first_tokens(&fleet(1, false, true), &batch_of_32(true));
    let at_once = first_tokens(&fleet(1, true, false), &batch_of_32(true));
    assert!(
        at_once[0] < 0.6 * sequential[0],
        "{} {}",
        at_once[0],
        sequential[0]
    );
    assert!(median_and_max(&at_once[1..]).1 > 1.05 * median_and_max(&sequential[1..]).1);
}

/// A fleet of 2 prefill and 4 decode workers, its KV moved over InfiniBand.
fn disaggregated(mut config: SimConfig) -> SimConfig {
    config.workers = 6;
    config.disagg = Some(switchyard_sim::DisaggSim {
        prefill: 2,
        link: "ib".parse().unwrap(),
        kv_bytes_per_token: 131_072,
    });
    config
}

#[test]
fn joint_routing_works_in_a_disaggregated_fleet_prefilling_on_the_holder() {
    // The servers pin a request to the decode worker holding its media; the simulator
    // once skipped joint routing in such fleets. Pinned, the request is prefilled on that
    // worker: no prefill worker has its media.
    let w = workload(600, "image=0.6", 5, 1.0);
    let joint = run(
        &disaggregated(config(Some((1, EncoderPolicy::Soonest, true)))),
        &w,
    );
    assert_eq!(
        joint.completed, 600,
        "{:?} {:?}",
        joint.rejected_by_reason, joint.failed_by_reason
    );
    let (media, disagg) = (joint.media.unwrap(), joint.disagg.unwrap());
    assert!(
        media.skipped > 20,
        "{} of {} skipped",
        media.skipped,
        media.requests
    );
    assert!(
        disagg.local_media > 0 && disagg.local_media <= media.skipped,
        "{disagg:?}"
    );
}

#[test]
fn overlap_sends_requests_ahead_of_their_media_in_a_disaggregated_fleet_too() {
    // As the servers do: a request prefilled on its decode worker goes ahead of its media;
    // one with a remote prefill waits for them. Every prefill local here (a high
    // threshold), so, as in an aggregated fleet, a video's text is prefilled while it is
    // encoded (the simulator once turned overlap off in disaggregated fleets).
    let w = workload(300, "video=1,offset=4096", 100_000, 0.5);
    let with = |overlap: bool, local_prefill_tokens: u64| {
        let mut c = disaggregated(config(Some((1, EncoderPolicy::Soonest, false))));
        if let Some(e) = &mut c.encoders {
            e.overlap = overlap;
        }
        c.routing.disagg.local_prefill_tokens = local_prefill_tokens;
        run(&c, &w)
    };
    let video = |r: &SimReport| r.media.as_ref().unwrap().ttft_ms_by_class["video"];
    let (ahead, after) = (with(true, 1_000_000), with(false, 1_000_000));
    assert!(ahead.completed > 50, "{}", ahead.completed);
    assert_eq!(ahead.completed, after.completed);
    assert!(
        video(&ahead).p50 < 0.95 * video(&after).p50,
        "overlapped {:?}, sequential {:?}",
        video(&ahead),
        video(&after)
    );
    // With remote prefills, overlap changes nothing: they wait for the media.
    let (a, b) = (with(true, 0), with(false, 0));
    assert_eq!(a.ttft_ms, b.ttft_ms);
}

#[test]
fn media_ending_in_the_last_block_are_encoded_not_served_from_a_cache() {
    // A worker computes the prompt's last block (its last token) whatever it holds: media
    // reaching into it need their embeddings, so joint routing leaves them alone. Media
    // at the very end of the prompt (a mix placed after the first 512 tokens, prompts of
    // about 512 + the image): never skipped.
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../testdata/mooncake_conversation_head3000.jsonl"
    ))
    .unwrap();
    let mut records: Vec<MooncakeRecord> = text
        .lines()
        .take(200)
        .map(|l| MooncakeRecord::parse(l).unwrap())
        .collect();
    for r in &mut records {
        // The same 512-token block of text, then one of three images: the image ends the
        // prompt (its last block holds the last token), and recurs behind the same text.
        r.input_length = 512;
        r.hash_ids = vec![1];
    }
    let mix = MediaMix {
        pool: 3,
        ..("image=1".parse::<MediaMix>().unwrap())
    };
    mix.apply(&mut records, 1, 512);
    let trace: Vec<TraceRequest> = records.iter().map(TraceRequest::from_mooncake).collect();
    let w = PreparedWorkload::prepare(&trace, 512, 16, 1.0);
    assert!(
        w.requests.iter().filter(|r| !r.media.is_empty()).all(|r| r
            .media
            .iter()
            .map(|m| m.end())
            .max()
            == Some(r.prompt.total_tokens() as u64)),
        "every image ends its prompt"
    );
    let joint = run(&config(Some((1, EncoderPolicy::Soonest, true))), &w);
    assert_eq!(joint.completed, 200);
    assert!(
        joint.cache_hit_rate > 0.5,
        "the images recur: {}",
        joint.cache_hit_rate
    );
    assert_eq!(joint.media.unwrap().skipped, 0);
}
