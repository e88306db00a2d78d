//! The upstream's load: read from its Prometheus `/metrics` when it serves understood ones,
//! else counted from the requests in flight here.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use switchyard_core::LoadSnapshot;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::OpenAiConfig;

/// Load names of the engines whose `/metrics` are understood: (running, waiting, KV cache
/// usage as a fraction).
const METRIC_NAMES: [(&str, &str, &[&str]); 3] = [
    (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        &["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"],
    ),
    (
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
        &["sglang:token_usage"],
    ),
    (
        "llamacpp:requests_processing",
        "llamacpp:requests_deferred",
        &["llamacpp:kv_cache_usage_ratio"],
    ),
];

/// The scale cache usage is reported on when the engine's capacity is unknown.
const USAGE_SCALE: u64 = 10_000;

/// What an engine's metrics say of its load: (running, waiting, cache usage).
pub fn load_from_metrics(text: &str) -> Option<(f64, f64, Option<f64>)> {
    use openmetrics_parser::PrometheusValue;
    let scrape = openmetrics_parser::prometheus::parse_prometheus(text).ok()?;
    // A gauge's samples summed over its labels (engines, data-parallel ranks).
    let sum = |name: &str| -> Option<f64> {
        let family = scrape.families.get(name)?;
        Some(
            family
                .iter_samples()
                .filter_map(|sample| match &sample.value {
                    PrometheusValue::Gauge(v) | PrometheusValue::Unknown(v) => Some(v.as_f64()),
                    PrometheusValue::Counter(c) => Some(c.value.as_f64()),
                    _ => None,
                })
                .sum(),
        )
    };
    METRIC_NAMES.iter().find_map(|(running, waiting, usage)| {
        let running = sum(running)?;
        let waiting = sum(waiting).unwrap_or(0.0);
        let usage = usage.iter().find_map(|name| sum(name));
        Some((running, waiting, usage))
    })
}

/// Reports the load: from the upstream's metrics while it serves them, else from the
/// requests in flight here.
pub(super) async fn watch_load(
    client: reqwest::Client,
    metrics_url: String,
    config: OpenAiConfig,
    in_flight: Arc<AtomicU32>,
    load: watch::Sender<LoadSnapshot>,
    cancel: CancellationToken,
) {
    let mut tick = tokio::time::interval(config.metrics_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Whether the upstream has understood metrics (checked again now and then when not).
    let mut scrape = true;
    let mut ticks = 0u64;
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        ticks += 1;
        let mut snapshot = None;
        if scrape || ticks.is_multiple_of(30) {
            let answer = client
                .get(&metrics_url)
                .timeout(config.metrics_interval.max(Duration::from_millis(500)))
                .send()
                .await;
            let text = match answer {
                Ok(r) if r.status().is_success() => r.text().await.ok(),
                _ => None,
            };
            snapshot =
                text.as_deref()
                    .and_then(load_from_metrics)
                    .map(|(running, waiting, usage)| {
                        let capacity = config.capacity_blocks.unwrap_or(USAGE_SCALE);
                        LoadSnapshot {
                            running: running.max(0.0) as u32,
                            waiting: waiting.max(0.0) as u32,
                            active_blocks: (usage.unwrap_or(0.0).clamp(0.0, 1.0) * capacity as f64)
                                as u64,
                            capacity_blocks: capacity,
                            ..LoadSnapshot::default()
                        }
                    });
            scrape = snapshot.is_some();
        }
        let snapshot = snapshot.unwrap_or_else(|| {
            let n = in_flight.load(Ordering::Relaxed);
            let running = config.max_num_seqs.map_or(n, |max| n.min(max));
            LoadSnapshot {
                running,
                waiting: n - running,
                capacity_blocks: config.capacity_blocks.unwrap_or(0),
                ..LoadSnapshot::default()
            }
        });
        // Sent every time, changed or not: a frontend that missed a report (it started, or
        // saw the worker register, after it went out) gets the next one.
        load.send_replace(snapshot);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vllm_sglang_and_llamacpp_metrics() {
        let vllm = "# TYPE vllm:num_requests_running gauge\n\
            vllm:num_requests_running{model_name=\"m\",engine=\"0\"} 3\n\
            vllm:num_requests_running{model_name=\"m\",engine=\"1\"} 2\n\
            # TYPE vllm:num_requests_waiting gauge\n\
            vllm:num_requests_waiting{model_name=\"m\"} 4\n\
            # TYPE vllm:kv_cache_usage_perc gauge\n\
            vllm:kv_cache_usage_perc{model_name=\"m\"} 0.25\n";
        assert_eq!(load_from_metrics(vllm), Some((5.0, 4.0, Some(0.25))));
        // As prometheus_client writes them (every family typed).
        let sglang = "# HELP sglang:num_running_reqs The number of running requests.\n\
            # TYPE sglang:num_running_reqs gauge\n\
            sglang:num_running_reqs{model_name=\"m\"} 7.0\n\
            # TYPE sglang:num_queue_reqs gauge\n\
            sglang:num_queue_reqs{model_name=\"m\"} 1.0\n\
            # TYPE sglang:token_usage gauge\n\
            sglang:token_usage{model_name=\"m\"} 0.5\n";
        assert_eq!(load_from_metrics(sglang), Some((7.0, 1.0, Some(0.5))));
        let llamacpp = "# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing 1\n# TYPE llamacpp:requests_deferred gauge\nllamacpp:requests_deferred 0\n";
        assert_eq!(load_from_metrics(llamacpp), Some((1.0, 0.0, None)));
        assert_eq!(load_from_metrics("process_cpu_seconds_total 3\n"), None);
        assert_eq!(load_from_metrics("<html>not found</html>"), None);
    }
}
