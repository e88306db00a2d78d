//! The benchmark client measures a server with a known latency profile (TTFT 50 ms, ITL
//! 10 ms) to within 10 %. Alone in its test binary so no other test competes for the CPU.
#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use support::mock_server::{MockServer, Profile};
use switchyard_workload::bench::{BenchSummary, Slo, run_blocking};

#[test]
fn measured_ttft_and_itl_match_the_server_profile() {
    let server = MockServer::start(Profile::default()).unwrap();
    // 40 requests of 20 tokens: 40 TTFT and 760 ITL samples, about 2.5 s in all.
    let report = run_blocking(support::config(server.url(), 4, 40, 20)).unwrap();
    let s = &report.summary;
    println!("{report}");
    assert_eq!((s.succeeded, s.failed), (40, 0));

    let ttft = s.ttft_ms.unwrap();
    support::assert_within("TTFT mean", ttft.mean, 50.0, 0.10);
    support::assert_within("TTFT p50", ttft.p50, 50.0, 0.10);
    let itl = s.itl_ms.unwrap();
    assert_eq!(itl.count, 40 * 19);
    support::assert_within("ITL mean", itl.mean, 10.0, 0.10);
    support::assert_within("ITL p50", itl.p50, 10.0, 0.10);
    support::assert_within("TPOT mean", s.tpot_ms.unwrap().mean, 10.0, 0.10);
    support::assert_within("latency mean", s.latency_ms.unwrap().mean, 240.0, 0.10);

    // Token counts are the server's: its chat template adds 7 tokens to the 64 words.
    assert_eq!(s.usage_reported, 40);
    assert!(
        report
            .requests
            .iter()
            .all(|r| r.input_tokens == 71 && r.output_tokens == 20)
    );
    assert!(
        server
            .stats
            .max_in_flight
            .load(std::sync::atomic::Ordering::SeqCst)
            <= 4
    );

    // Goodput against objectives either side of the profile.
    let loose = Slo {
        ttft: Some(Duration::from_millis(200)),
        itl: Some(Duration::from_millis(20)),
    };
    let tight = Slo {
        ttft: Some(Duration::from_millis(30)),
        itl: None,
    };
    let loose = BenchSummary::of(&report.requests, &loose).goodput.unwrap();
    let tight = BenchSummary::of(&report.requests, &tight).goodput.unwrap();
    assert_eq!((loose.requests, tight.requests), (40, 0));
    assert!((loose.fraction - 1.0).abs() < 1e-12);
}
