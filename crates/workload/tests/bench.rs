//! `switchyard bench` against a local test server: failures are counted by kind and never
//! fatal, runs stop at their bounds, every load shape and response mode is measured, and
//! reports are written.
#![allow(clippy::unwrap_used)]

mod support;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use support::mock_server::{MockServer, Profile};
use switchyard_core::trace::MooncakeRecord;
use switchyard_workload::bench::{Endpoint, LoadShape, RequestSource, run_blocking};

fn fast_profile() -> Profile {
    Profile {
        ttft: Duration::from_millis(20),
        itl: Duration::from_millis(5),
        ..Profile::default()
    }
}

#[test]
fn failures_are_counted_by_kind_and_the_run_goes_on() {
    let server = MockServer::start(Profile {
        fail_every: Some(5),
        drop_every: Some(7),
        ..fast_profile()
    })
    .unwrap();
    let report = run_blocking(support::config(server.url(), 3, 35, 10)).unwrap();
    let s = &report.summary;
    // Arrivals 5, 10, …, 35 get a 500; 7, 14, 21 and 28 lose their connection mid-stream.
    assert_eq!(s.errors.get("http_500"), Some(&7), "{:?}", s.errors);
    assert_eq!(s.errors.get("dropped"), Some(&4), "{:?}", s.errors);
    assert_eq!((s.requests, s.succeeded, s.failed), (35, 24, 11));
    let failed_500 = report
        .requests
        .iter()
        .filter_map(|r| r.error.as_ref())
        .find(|e| e.kind.to_string() == "http_500")
        .unwrap();
    assert_eq!(failed_500.message, "injected failure");
    // Failed requests stay out of the latency statistics.
    assert_eq!(s.ttft_ms.unwrap().count, 24);
}

#[test]
fn unreachable_server_is_a_connect_error_per_request() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let report =
        run_blocking(support::config(format!("http://127.0.0.1:{port}"), 2, 4, 5)).unwrap();
    assert_eq!(report.summary.errors.get("connect"), Some(&4));
    assert_eq!(report.summary.succeeded, 0);
}

#[test]
fn run_stops_at_its_request_count() {
    let server = MockServer::start(fast_profile()).unwrap();
    let report = run_blocking(support::config(server.url(), 4, 10, 5)).unwrap();
    assert_eq!(report.requests.len(), 10);
    assert_eq!(server.stats.requests.load(Ordering::SeqCst), 10);
    let indices: Vec<usize> = report.requests.iter().map(|r| r.index).collect();
    assert_eq!(indices, (0..10).collect::<Vec<_>>());
}

#[test]
fn run_stops_at_its_duration() {
    let server = MockServer::start(Profile::default()).unwrap();
    let mut config = support::config(server.url(), 2, 1, 10);
    config.max_requests = None;
    let limit = Duration::from_millis(600);
    config.duration = Some(limit);
    let started = Instant::now();
    let report = run_blocking(config).unwrap();
    let elapsed = started.elapsed();
    // Each request takes about 140 ms; requests in flight at the limit finish.
    assert!(
        elapsed < limit + Duration::from_millis(900),
        "ran {elapsed:?}"
    );
    assert!(report.requests.iter().all(|r| r.start < limit));
    let sent = report.requests.len();
    assert!((4..=12).contains(&sent), "{sent} requests");
    assert_eq!(report.summary.failed, 0);
}

#[test]
fn trace_replay_keeps_the_schedule_and_prompt_lengths() {
    let server = MockServer::start(fast_profile()).unwrap();
    let records: Vec<MooncakeRecord> = (0..10u64)
        .map(|i| MooncakeRecord {
            media: Vec::new(),
            timestamp: 1_000 + i * 100,
            input_length: 40 + i,
            output_length: 4,
            // Every prompt shares its first block: 32 tokens of id 7.
            hash_ids: vec![7, 100 + i],
            ..MooncakeRecord::default()
        })
        .collect();
    let mut config = support::config(server.url(), 1, 10, 4);
    config.source = RequestSource::Trace {
        records: records.clone(),
        block_size: 32,
    };
    config.shape = LoadShape::Replay { speedup: 2.0 };
    config.endpoint = Endpoint::Completions;
    config.max_requests = None;
    let report = run_blocking(config).unwrap();
    assert_eq!(report.requests.len(), 10);
    for (record, row) in report.requests.iter().zip(&records) {
        let scheduled = record.scheduled.unwrap();
        assert_eq!(
            scheduled,
            Duration::from_millis((row.timestamp - 1_000) / 2)
        );
        let lag = record.start.saturating_sub(scheduled);
        assert!(
            lag < Duration::from_millis(50),
            "request {} sent {lag:?} late",
            record.index
        );
        // The server counted exactly input_length words (completions: no template).
        assert_eq!(record.input_tokens, row.input_length);
        assert!(record.usage_reported);
    }
}

#[test]
fn poisson_arrivals_stop_at_the_duration() {
    let server = MockServer::start(fast_profile()).unwrap();
    let mut config = support::config(server.url(), 1, 1, 3);
    config.shape = LoadShape::Poisson { rate: 40.0 };
    config.max_requests = None;
    config.duration = Some(Duration::from_secs(1));
    let report = run_blocking(config).unwrap();
    let sent = report.requests.len();
    assert!((15..=80).contains(&sent), "{sent} requests in 1 s at 40/s");
    assert!(
        report
            .requests
            .iter()
            .all(|r| r.scheduled.unwrap() < Duration::from_secs(1))
    );
    assert_eq!(report.summary.failed, 0);
}

#[test]
fn non_streaming_and_usage_free_responses_are_counted() {
    let server = MockServer::start(Profile {
        send_usage: false,
        ..fast_profile()
    })
    .unwrap();
    let mut config = support::config(server.url(), 2, 4, 6);
    config.stream = false;
    let whole = run_blocking(config.clone()).unwrap();
    for record in &whole.requests {
        assert!(record.ttft.is_none() && record.itl.is_empty());
        // Words of the answer, and the client's own prompt count.
        assert_eq!((record.output_tokens, record.input_tokens), (6, 64));
        assert!(!record.usage_reported);
        assert!(record.latency >= Duration::from_millis(45));
    }
    assert!(whole.summary.ttft_ms.is_none());

    config.stream = true;
    let streamed = run_blocking(config).unwrap();
    for record in &streamed.requests {
        // One chunk per token without usage.
        assert_eq!(record.output_tokens, 6);
        assert_eq!(record.itl.len(), 5);
        assert!(!record.usage_reported);
    }
}

#[test]
fn json_report_and_plots_are_written() {
    let server = MockServer::start(fast_profile()).unwrap();
    let report = run_blocking(support::config(server.url(), 2, 6, 5)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let json_path = dir.path().join("report.json");
    report.write_json(&json_path).unwrap();
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json_path).unwrap()).unwrap();
    assert_eq!(json["summary"]["requests"], 6);
    assert_eq!(json["requests"].as_array().unwrap().len(), 6);
    assert_eq!(json["requests"][0]["itl_ms"].as_array().unwrap().len(), 4);
    assert!(json["requests"][0]["ttft_ms"].as_f64().unwrap() > 15.0);

    let plots = report.write_plots(&dir.path().join("plots")).unwrap();
    let names: Vec<String> = plots
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    for stem in [
        "ttft_cdf",
        "itl_cdf",
        "latency_over_time",
        "throughput_over_time",
    ] {
        assert!(names.contains(&format!("{stem}.png")), "{names:?}");
        assert!(names.contains(&format!("{stem}.svg")), "{names:?}");
    }
    for path in &plots {
        let bytes = std::fs::read(path).unwrap();
        if path.extension().unwrap() == "png" {
            assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        } else {
            assert!(String::from_utf8(bytes).unwrap().contains("<svg"));
        }
    }
}

#[test]
fn a_session_trace_is_replayed_closed_loop_growing_by_the_real_answers() {
    let server = MockServer::start(fast_profile()).unwrap();
    // Two sessions of three turns, turn-major in the file. Each turn's prompt is the last
    // one's, its 4-token answer, and new text (20, then 10 words).
    let lengths = [40u64, 64, 78];
    let mut records = Vec::new();
    for (turn, &input_length) in lengths.iter().enumerate() {
        for s in 0..2u64 {
            records.push(MooncakeRecord {
                timestamp: if turn == 0 { s * 50 } else { 0 },
                input_length,
                output_length: 4,
                hash_ids: (0..input_length.div_ceil(32))
                    .map(|b| s * 100 + b)
                    .collect(),
                session_id: Some(format!("s{s}")),
                delay: (turn > 0).then_some(100.0),
                tool_wait_ms: (turn > 0).then_some(50.0),
                ..MooncakeRecord::default()
            });
        }
    }
    let mut config = support::config(server.url(), 1, 6, 4);
    config.source = RequestSource::Trace {
        records: records.clone(),
        block_size: 32,
    };
    config.shape = LoadShape::Replay { speedup: 1.0 };
    config.max_requests = None;
    let report = run_blocking(config.clone()).unwrap();
    assert_eq!(report.requests.len(), 6);
    assert_eq!(report.summary.failed, 0);
    for (record, row) in report.requests.iter().zip(&records) {
        // The server counted the whole conversation: earlier prompts, the answers it gave
        // and the new text (plus its 7-token chat template), which is what the trace says.
        assert_eq!(
            record.input_tokens,
            row.input_length + 7,
            "row {}",
            record.index
        );
    }
    for index in 2..6 {
        let (before, this) = (&report.requests[index - 2], &report.requests[index]);
        let ended = before.start + before.latency;
        let waited = this.start.saturating_sub(ended);
        assert!(
            this.start >= ended && waited < Duration::from_millis(150 + 60),
            "row {index} sent {waited:?} after the turn before it ended"
        );
        assert!(
            waited >= Duration::from_millis(145),
            "row {index}: {waited:?}"
        );
    }
    let sessions = report.sessions.as_ref().unwrap();
    assert_eq!(
        (sessions.sessions, &sessions.requests_by_turn[..]),
        (2, &[2, 2, 2][..])
    );
    assert!(report.to_string().contains("Sessions     2 (closed loop)"));
    // Sessions set their own pace: a rate or a concurrency is refused.
    config.shape = LoadShape::Concurrency { clients: 2 };
    let error = run_blocking(config).unwrap_err().to_string();
    assert!(error.contains("drop --rate and --concurrency"), "{error}");
}
