use switchyard_core::perf::{MAX_CONTEXT_MS, PerfModel};

use super::sweep::context_point;
use super::*;
use crate::bench::RequestRecord;

fn d(context: f64, k: usize, itl: f64) -> DecodePoint {
    DecodePoint {
        context,
        concurrency: k,
        active_kv_tokens: k as f64 * context,
        itl_ms: itl,
    }
}

#[test]
fn measurements_become_a_profile_the_mocker_reads() {
    let prefill = [
        PrefillPoint {
            isl: 2000.0,
            ttft_ms: 90.0,
        },
        PrefillPoint {
            isl: 130.0,
            ttft_ms: 20.0,
        },
    ];
    let decode = [
        d(500.0, 1, 10.0),
        d(500.0, 4, 14.0),
        d(2000.0, 1, 12.0),
        d(2000.0, 4, 20.0),
    ];
    let p = to_profile(&prefill, &decode).unwrap();
    assert_eq!(p.prefill_isl, [130.0, 2000.0]);
    assert_eq!(p.prefill_ttft_ms, [20.0, 90.0]);
    assert_eq!(p.decode_context_length, [500.0, 2000.0]);
    assert_eq!(p.decode_active_kv_tokens, [500.0, 2000.0, 8000.0]);
    // Column 500: measured at 500 (10) and 2000 (14); 8000 extrapolated: 14 + 4·6000/1500.
    // Column 2000: measured at 2000 (12) and 8000 (20); 500 extrapolated back: 10.
    assert_eq!(p.decode_itl[0], [10.0, 10.0]);
    assert_eq!(p.decode_itl[1], [14.0, 12.0]);
    assert_eq!(p.decode_itl[2], [30.0, 20.0]);
    let model = PerfModel::from_profile(p).unwrap();
    assert_eq!(model.prefill_ms(2000), 90.0);
}

#[test]
fn recommendations_read_the_targets_off_the_points() {
    let prefill = [
        PrefillPoint {
            isl: 128.0,
            ttft_ms: 20.0,
        },
        PrefillPoint {
            isl: 4096.0,
            ttft_ms: 900.0,
        },
    ];
    let decode = [d(512.0, 1, 8.0), d(512.0, 16, 40.0), d(512.0, 64, 90.0)];
    let r = recommend(&prefill, &decode, 500.0, 50.0, Some(40_000));
    assert_eq!(r.max_isl_within_ttft, Some(128.0));
    assert_eq!(r.max_concurrency_within_itl, [(512.0, Some(16))]);
    // 500 ms fits 25 prefills of 20 ms (24 waiting ahead), none of 900 ms.
    assert_eq!(r.queue_within_ttft, [(128.0, 24), (4096.0, 0)]);
    // 16 streams at 512 tokens of context hold 50 ms: their KV tokens of the 40,000.
    let kv = d(512.0, 16, 40.0).active_kv_tokens;
    assert_eq!(r.kv_tokens_within_itl, Some(kv));
    let t = r.load_planner;
    // The median of (0, 24), the upper one of two, is 24.
    assert_eq!(
        (t.prefill_queue_up, t.prefill_queue_down),
        (24.0, 24.0 * 0.4)
    );
    assert_eq!(t.kv_usage_up, Some(kv / 40_000.0));
    assert!((t.kv_usage_down.unwrap() - kv / 40_000.0 * 0.5 / 0.9).abs() < 1e-12);
    let none = recommend(&prefill, &decode, 5.0, 5.0, None);
    assert_eq!(none.max_isl_within_ttft, None);
    assert_eq!(none.max_concurrency_within_itl, [(512.0, None)]);
    assert_eq!(none.kv_tokens_within_itl, None);
    assert_eq!(none.queue_within_ttft, [(128.0, 0), (4096.0, 0)]);
    // No queue at all fits: the threshold still means one (half a request a worker).
    assert_eq!(none.load_planner.prefill_queue_up, 0.5);
    assert_eq!(none.load_planner.kv_usage_up, None);
}

/// A point as a server with context cost `k` and a per-token overhead outside the
/// engine would give it (`again` and `fresh again` carry only that overhead).
fn c(prefix: f64, chunk: f64, k: f64, reported: bool) -> ContextPoint {
    let overhead = |tokens: f64| 30.0 + 0.002 * tokens;
    let prefill = |tokens: f64| 5.0 + 0.05 * tokens;
    ContextPoint {
        prefix,
        cached: prefix,
        chunk,
        ttft_ms: overhead(prefix + chunk) + prefill(chunk) + k * prefix * chunk,
        again_ms: overhead(prefix + chunk),
        fresh_ms: overhead(chunk) + prefill(chunk),
        fresh_again_ms: overhead(chunk),
        extra_ms: k * prefix * chunk,
        attended: prefix * chunk,
        recompute_ms: prefill(prefix + chunk) - prefill(chunk),
        cached_reported: reported,
    }
}

#[test]
fn the_context_cost_is_fitted_through_the_points() {
    let k = 2e-5;
    let fit = fit_context(&[c(1024.0, 512.0, k, true), c(4096.0, 512.0, k, true)]);
    assert_eq!(fit.not_measured, None);
    assert!((fit.prefill_context_ms - k).abs() < 1e-12, "{fit:?}");
    // Least squares through the origin: the larger product weighs more.
    let mut low = c(1024.0, 512.0, k, false);
    low.extra_ms = 0.0;
    let high = c(4096.0, 512.0, k, false);
    let fit = fit_context(&[low, high]);
    let (x1, x2) = (low.attended, high.attended);
    let expected = (x2 * high.extra_ms) / (x1 * x1 + x2 * x2);
    assert!((fit.prefill_context_ms - expected).abs() < 1e-15);
    assert!(fit.prefill_context_ms < k);
    // Noise below zero is no negative cost; an absurd one is held to what a profile
    // may say.
    let mut negative = c(1024.0, 512.0, 0.0, true);
    negative.extra_ms = -3.0;
    assert_eq!(fit_context(&[negative]).prefill_context_ms, 0.0);
    let huge = c(1024.0, 512.0, 1.0, true);
    assert_eq!(fit_context(&[huge]).prefill_context_ms, MAX_CONTEXT_MS);
    // Nothing asked for.
    let none = fit_context(&[]);
    assert_eq!(none.prefill_context_ms, 0.0);
    assert!(none.not_measured.is_some());
}

fn record(index: usize, ttft_ms: u64, input: u64, cached: Option<u64>) -> RequestRecord {
    RequestRecord {
        index,
        scheduled: None,
        start: Duration::ZERO,
        ttft: Some(Duration::from_millis(ttft_ms)),
        itl: Vec::new(),
        latency: Duration::from_millis(ttft_ms),
        input_tokens: input,
        output_tokens: 1,
        usage_reported: true,
        cached_tokens: cached,
        error: None,
    }
}

#[test]
fn a_point_reads_its_records_in_the_order_they_were_sent() {
    // The prefix (1,024 tokens), then per sample: 512 alone, again (496 of them cached),
    // 1,024 + 512 (1,024 cached), again (1,520 cached). Sent in this order, recorded in
    // any.
    let curve = |tokens: f64| tokens / 10.0;
    let mut records = vec![record(0, 110, 1_024, Some(0))];
    for (s, extra) in [(0, 30), (1, 50), (2, 40)] {
        let i = 1 + 4 * s;
        records.extend([
            record(i, 60, 512, Some(0)),
            record(i + 1, 20, 512, Some(496)),
            record(i + 2, 70 + extra, 1_536, Some(1_024)),
            record(i + 3, 25, 1_536, Some(1_520)),
        ]);
    }
    records.reverse();
    let p = context_point("x", records.clone(), &curve).unwrap();
    assert_eq!((p.prefix, p.cached, p.chunk), (1_024.0, 1_024.0, 512.0));
    assert!(p.cached_reported);
    assert_eq!((p.ttft_ms, p.again_ms), (110.0, 25.0));
    assert_eq!((p.fresh_ms, p.fresh_again_ms), (60.0, 20.0));
    // Per sample (70 + extra − 25) − (60 − 20): 35, 55, 45; their median.
    assert_eq!(p.extra_ms, 45.0);
    // Cached × computed: 1,024 · 512 − 1,520 · 16 − (0 − 496 · 16).
    assert_eq!(p.attended, 1_024.0 * 512.0 - 1_520.0 * 16.0 + 496.0 * 16.0);
    assert_eq!(p.recompute_ms, 1_536.0 / 10.0 - 512.0 / 10.0);

    // A server that gives no cached count: the prefix is taken as cached, and the
    // product is cached × chunk.
    let silent: Vec<RequestRecord> = records
        .into_iter()
        .map(|r| RequestRecord {
            cached_tokens: None,
            ..r
        })
        .collect();
    let p = context_point("x", silent.clone(), &curve).unwrap();
    assert!(!p.cached_reported);
    assert_eq!((p.cached, p.chunk), (1_024.0, 512.0));
    assert_eq!(p.attended, 1_024.0 * 512.0);
    // A failed request fails the point, naming it.
    let mut failed = silent;
    failed[3].error = Some(crate::bench::RequestError::new(
        crate::bench::ErrorKind::Http(400),
        "too long",
    ));
    let e = context_point("the 1024 point", failed, &curve).unwrap_err();
    assert!(e.to_string().contains("the 1024 point"), "{e}");
}

#[test]
fn a_server_that_recomputes_the_prefix_gets_no_context_cost() {
    // It says it cached nothing.
    let mut said = c(4096.0, 512.0, 0.0, true);
    said.cached = 0.0;
    let fit = fit_context(&[c(1024.0, 512.0, 1e-5, true), said]);
    assert_eq!(fit.prefill_context_ms, 0.0);
    assert!(
        fit.not_measured
            .as_deref()
            .unwrap()
            .contains("served 0 tokens"),
        "{fit:?}"
    );
    // It says nothing, and the prompt took what recomputing its prefix takes (the
    // again-differences cancel: every prompt is computed whole).
    let mut silent = c(4096.0, 512.0, 0.0, false);
    silent.ttft_ms = silent.fresh_ms + silent.recompute_ms;
    silent.again_ms = silent.ttft_ms;
    silent.extra_ms = 0.0;
    let fit = fit_context(&[silent]);
    assert_eq!(fit.prefill_context_ms, 0.0);
    assert!(
        fit.not_measured
            .as_deref()
            .unwrap()
            .contains("does not cache prefixes"),
        "{fit:?}"
    );
    // Saying nothing is not enough to be doubted: a cached prefix fits.
    let fit = fit_context(&[c(4096.0, 512.0, 1e-5, false)]);
    assert_eq!(fit.not_measured, None);
    assert!((fit.prefill_context_ms - 1e-5).abs() < 1e-15);
}

#[test]
fn one_point_on_an_axis_is_no_profile() {
    let e = to_profile(
        &[PrefillPoint {
            isl: 100.0,
            ttft_ms: 10.0,
        }],
        &[d(100.0, 1, 5.0), d(100.0, 2, 6.0)],
    )
    .unwrap_err();
    assert!(e.to_string().contains("at least 2 points"), "{e}");
}
