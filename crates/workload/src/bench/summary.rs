//! Statistics over a run's request records.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use super::config::Slo;
use super::record::RequestRecord;
use crate::stats::Summary;
use crate::units::{ms, serialize_ms};

/// What a run measured, as the terminal summary and the JSON report show it.
#[derive(Debug, Clone, Serialize)]
pub struct BenchSummary {
    pub requests: usize,
    pub succeeded: usize,
    pub failed: usize,
    /// Failed requests by kind (`http_500`, `dropped`, `timeout`, …).
    pub errors: BTreeMap<String, usize>,
    /// From the first request sent to the last one ended.
    #[serde(rename = "duration_ms", serialize_with = "serialize_ms")]
    pub duration: Duration,
    /// Successful requests per second.
    pub request_throughput: f64,
    /// Output tokens of successful requests per second.
    pub output_token_throughput: f64,
    /// Input plus output tokens of successful requests per second.
    pub total_token_throughput: f64,
    /// Latency statistics over successful requests, in milliseconds. TTFT, ITL and TPOT
    /// exist only for streamed responses; ITL pools every gap of every request.
    pub ttft_ms: Option<Summary>,
    pub itl_ms: Option<Summary>,
    pub tpot_ms: Option<Summary>,
    pub latency_ms: Option<Summary>,
    pub input_tokens: Option<Summary>,
    pub output_tokens: Option<Summary>,
    /// Successful requests whose token counts came from the server's `usage`.
    pub usage_reported: usize,
    /// Prompt tokens served from the server's prefix cache, summed over the successful
    /// requests whose `usage` says (`None`: none said).
    pub cached_tokens: Option<u64>,
    /// Those tokens' share of the same requests' prompt tokens.
    pub prompt_cache_hit_rate: Option<f64>,
    /// How late open-loop requests were sent against their schedule; a large lag means
    /// the client, not the server, limited the rate.
    pub send_lag_ms: Option<Summary>,
    pub goodput: Option<Goodput>,
}

/// Requests that succeeded within every objective set.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Goodput {
    pub slo_ttft_ms: Option<f64>,
    /// Applied to each request's mean inter-token latency.
    pub slo_itl_ms: Option<f64>,
    pub requests: usize,
    /// Share of all requests sent.
    pub fraction: f64,
    /// Good requests per second.
    pub rate: f64,
}

impl BenchSummary {
    pub fn of(records: &[RequestRecord], slo: &Slo) -> Self {
        let ok: Vec<&RequestRecord> = records.iter().filter(|r| r.succeeded()).collect();
        let mut errors = BTreeMap::new();
        for error in records.iter().filter_map(|r| r.error.as_ref()) {
            *errors.entry(error.kind.to_string()).or_insert(0) += 1;
        }
        let first = records.iter().map(|r| r.start).min().unwrap_or_default();
        let last = records
            .iter()
            .map(|r| r.start + r.latency)
            .max()
            .unwrap_or_default();
        let duration = last.saturating_sub(first);
        let per_second = |count: f64| {
            if duration.is_zero() {
                0.0
            } else {
                count / duration.as_secs_f64()
            }
        };
        let output: u64 = ok.iter().map(|r| r.output_tokens).sum();
        let input: u64 = ok.iter().map(|r| r.input_tokens).sum();
        // Over the requests whose usage says what the cache served.
        let saying: Vec<&&RequestRecord> =
            ok.iter().filter(|r| r.cached_tokens.is_some()).collect();
        let cached = (!saying.is_empty())
            .then(|| saying.iter().filter_map(|r| r.cached_tokens).sum::<u64>());
        let cached_of: u64 = saying.iter().map(|r| r.input_tokens).sum();
        let goodput = slo.is_set().then(|| {
            let good = ok.iter().filter(|r| meets(r, slo)).count();
            Goodput {
                slo_ttft_ms: slo.ttft.map(ms),
                slo_itl_ms: slo.itl.map(ms),
                requests: good,
                fraction: if records.is_empty() {
                    0.0
                } else {
                    good as f64 / records.len() as f64
                },
                rate: per_second(good as f64),
            }
        });
        Self {
            requests: records.len(),
            succeeded: ok.len(),
            failed: records.len() - ok.len(),
            errors,
            duration,
            request_throughput: per_second(ok.len() as f64),
            output_token_throughput: per_second(output as f64),
            total_token_throughput: per_second((input + output) as f64),
            ttft_ms: Summary::of(ok.iter().filter_map(|r| r.ttft).map(ms)),
            itl_ms: Summary::of(ok.iter().flat_map(|r| r.itl.iter().copied().map(ms))),
            tpot_ms: Summary::of(ok.iter().filter_map(|r| r.tpot()).map(ms)),
            latency_ms: Summary::of(ok.iter().map(|r| ms(r.latency))),
            input_tokens: Summary::of(ok.iter().map(|r| r.input_tokens as f64)),
            output_tokens: Summary::of(ok.iter().map(|r| r.output_tokens as f64)),
            usage_reported: ok.iter().filter(|r| r.usage_reported).count(),
            cached_tokens: cached,
            prompt_cache_hit_rate: cached.map(|c| {
                if cached_of == 0 {
                    0.0
                } else {
                    c as f64 / cached_of as f64
                }
            }),
            send_lag_ms: Summary::of(
                records
                    .iter()
                    .filter_map(|r| r.scheduled.map(|at| ms(r.start.saturating_sub(at)))),
            ),
            goodput,
        }
    }
}

/// Whether a successful request met every objective set. A request with too few tokens to
/// have an inter-token latency meets the ITL objective.
fn meets(record: &RequestRecord, slo: &Slo) -> bool {
    let ttft_ok = slo
        .ttft
        .is_none_or(|limit| record.ttft.is_some_and(|t| t <= limit));
    let itl_ok = slo
        .itl
        .is_none_or(|limit| record.mean_itl().is_none_or(|t| t <= limit));
    ttft_ok && itl_ok
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::record::{ErrorKind, RequestError};

    fn ok(start_ms: u64, ttft_ms: u64, itl_ms: &[u64], tokens: u64) -> RequestRecord {
        let ttft = Duration::from_millis(ttft_ms);
        let itl: Vec<Duration> = itl_ms.iter().map(|&m| Duration::from_millis(m)).collect();
        RequestRecord {
            index: 0,
            scheduled: Some(Duration::from_millis(start_ms)),
            start: Duration::from_millis(start_ms),
            ttft: Some(ttft),
            latency: ttft + itl.iter().sum::<Duration>(),
            itl,
            input_tokens: 100,
            output_tokens: tokens,
            usage_reported: true,
            cached_tokens: None,
            error: None,
        }
    }

    fn failed(kind: ErrorKind) -> RequestRecord {
        RequestRecord {
            error: Some(RequestError::new(kind, "x")),
            ttft: None,
            itl: Vec::new(),
            output_tokens: 0,
            usage_reported: false,
            cached_tokens: None,
            ..ok(0, 0, &[], 0)
        }
    }

    #[test]
    fn throughput_goodput_and_errors() {
        let records = vec![
            ok(0, 100, &[10, 10, 10], 4),
            ok(500, 300, &[10, 10, 10], 4),
            ok(1000, 100, &[50, 50], 3),
            failed(ErrorKind::Http(500)),
            failed(ErrorKind::Http(500)),
            failed(ErrorKind::Dropped),
        ];
        let slo = Slo {
            ttft: Some(Duration::from_millis(200)),
            itl: Some(Duration::from_millis(20)),
        };
        let summary = BenchSummary::of(&records, &slo);
        assert_eq!(
            (summary.requests, summary.succeeded, summary.failed),
            (6, 3, 3)
        );
        assert_eq!(summary.errors.get("http_500"), Some(&2));
        assert_eq!(summary.errors.get("dropped"), Some(&1));
        // First send at 0, last end at 1000 + 100 + 100 ms.
        assert_eq!(summary.duration, Duration::from_millis(1200));
        assert!((summary.request_throughput - 2.5).abs() < 1e-9);
        assert!((summary.output_token_throughput - 11.0 / 1.2).abs() < 1e-9);
        let goodput = summary.goodput.unwrap();
        // Only the first request meets both: the second is slow to start, the third slow
        // between tokens.
        assert_eq!(goodput.requests, 1);
        assert!((goodput.fraction - 1.0 / 6.0).abs() < 1e-9);
        let itl = summary.itl_ms.unwrap();
        assert_eq!(itl.count, 8);
        assert_eq!(summary.ttft_ms.unwrap().p50, 100.0);
        assert_eq!(summary.send_lag_ms.unwrap().max, 0.0);
    }

    #[test]
    fn the_prefix_cache_share_counts_only_requests_whose_usage_says() {
        let with = |input: u64, cached: Option<u64>| RequestRecord {
            input_tokens: input,
            cached_tokens: cached,
            ..ok(0, 10, &[], 1)
        };
        let records = vec![
            with(100, Some(60)),
            with(300, Some(0)),
            // Says nothing: neither its cached nor its prompt tokens count.
            with(1_000, None),
            // Failed: left out like every other figure.
            RequestRecord {
                cached_tokens: Some(500),
                ..failed(ErrorKind::Dropped)
            },
        ];
        let summary = BenchSummary::of(&records, &Slo::default());
        assert_eq!(summary.cached_tokens, Some(60));
        assert!((summary.prompt_cache_hit_rate.unwrap() - 60.0 / 400.0).abs() < 1e-12);
        let silent = BenchSummary::of(&[with(100, None)], &Slo::default());
        assert_eq!(
            (silent.cached_tokens, silent.prompt_cache_hit_rate),
            (None, None)
        );
    }

    #[test]
    fn no_objectives_no_goodput() {
        let summary = BenchSummary::of(&[ok(0, 10, &[], 1)], &Slo::default());
        assert!(summary.goodput.is_none());
        assert!(summary.itl_ms.is_none());
    }
}
