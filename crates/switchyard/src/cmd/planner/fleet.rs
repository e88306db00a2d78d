//! The fleet as the planner reads it: through a frontend's admin listener ([`FleetView`])
//! or through the planes ([`PlaneView`]), each pull an [`Observation`].

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde::Deserialize;
use switchyard_core::load::LoadSnapshot;
use switchyard_core::{WorkerKey, WorkerRole};
use switchyard_planner::{Observation, TrafficSample, WorkerSample};
use switchyard_runtime::TrafficCounters;

/// Reads the fleet from a frontend.
pub(super) struct FleetView<'a> {
    client: &'a reqwest::Client,
    frontend: &'a str,
    /// The traffic counters at the last pull.
    last: Option<Counters>,
}

/// Cumulative traffic counters from `/metrics`.
#[derive(Debug, Clone, Copy, Default)]
struct Counters {
    requests: f64,
    input_tokens: f64,
    cached_tokens: f64,
    output_tokens: f64,
    finished: f64,
    ttft_sum: f64,
    ttft_count: f64,
    itl_sum: f64,
    itl_count: f64,
    /// Requests waiting in the frontend's admission queue (a gauge).
    queued: f64,
}

/// What `/v1/internal/workers` says of a worker (the fields the planner reads).
#[derive(Debug, Deserialize)]
struct ListedWorker {
    status: String,
    role: WorkerRole,
    loads: Vec<(serde_json::Value, serde_json::Value, Option<LoadSnapshot>)>,
}

impl<'a> FleetView<'a> {
    pub(super) fn new(client: &'a reqwest::Client, frontend: &'a str) -> Self {
        FleetView {
            client,
            frontend,
            last: None,
        }
    }

    /// GET `path` from the frontend, a success or an error naming the URL.
    async fn get(&self, path: &str) -> Result<reqwest::Response> {
        let url = format!("{}{path}", self.frontend);
        self.client
            .get(&url)
            .send()
            .await
            .and_then(reqwest::Response::error_for_status)
            .with_context(|| format!("GET {url}"))
    }

    async fn observe(&mut self) -> Result<Observation> {
        let path = switchyard_frontend::http::WORKERS_PATH;
        let listed: Vec<ListedWorker> = self
            .get(path)
            .await?
            .json()
            .await
            .with_context(|| format!("GET {path}: not a worker listing"))?;
        let workers: Vec<WorkerSample> = listed
            .iter()
            .filter(|w| !matches!(w.status.as_str(), "draining" | "dead"))
            .map(|w| {
                let engines: Vec<LoadSnapshot> = w.loads.iter().filter_map(|l| l.2).collect();
                sample(w.role, &engines)
            })
            .collect();
        let text = self.get("/metrics").await?.text().await?;
        let now = counters(&text)?;
        let queued = now.queued.round().max(0.0) as u32;
        let traffic = match self.last.replace(now) {
            None => TrafficSample::default(),
            Some(before) => {
                let d = |a: f64, b: f64| (a - b).max(0.0);
                TrafficSample {
                    requests: d(now.requests, before.requests) as u64,
                    input_tokens: d(now.input_tokens, before.input_tokens) as u64,
                    cached_tokens: d(now.cached_tokens, before.cached_tokens) as u64,
                    output_tokens: d(now.output_tokens, before.output_tokens) as u64,
                    finished: d(now.finished, before.finished) as u64,
                    ttft_ms_sum: d(now.ttft_sum, before.ttft_sum) * 1e3,
                    ttft_count: d(now.ttft_count, before.ttft_count) as u64,
                    itl_ms_sum: d(now.itl_sum, before.itl_sum) * 1e3,
                    itl_count: d(now.itl_count, before.itl_count) as u64,
                }
            }
        };
        let mut observation = Observation { workers, traffic };
        // Requests the frontend holds back for want of a free engine.
        observation.add_queued(queued);
        Ok(observation)
    }
}

/// A worker as the planner sees it, from its engines' (data-parallel ranks') loads: the
/// mean KV usage, and the requests waiting and running summed.
fn sample(role: WorkerRole, engines: &[LoadSnapshot]) -> WorkerSample {
    let n = engines.len().max(1) as f64;
    WorkerSample {
        role,
        kv_usage: engines.iter().map(LoadSnapshot::kv_usage).sum::<f64>() / n,
        waiting: engines.iter().map(|e| e.waiting).sum(),
        running: engines.iter().map(|e| e.running).sum(),
    }
}

/// Where the planner reads the fleet.
pub(super) enum Fleet<'a> {
    Frontend(FleetView<'a>),
    Planes(PlaneView),
}

impl Fleet<'_> {
    pub(super) async fn observe(&mut self) -> Result<Observation> {
        match self {
            Fleet::Frontend(view) => view.observe().await,
            Fleet::Planes(view) => Ok(view.observe()),
        }
    }
}

/// A frontend not heard from for this long has stopped: its queue no longer counts.
const FRONTEND_SILENCE: Duration = Duration::from_secs(10);

/// Reads the fleet from the planes: the model's workers as discovery lists them (a
/// draining worker deregisters first), the load each engine last reported on the event
/// plane (none yet: idle, as an engine reports only changes), and the traffic counters
/// every frontend of the model publishes, summed.
pub(super) struct PlaneView {
    model: String,
    /// Kept for its watch (etcd's lease and watch tasks run while it lives).
    _discovery: switchyard_runtime::net::etcd::EtcdDiscovery,
    instances: tokio::sync::watch::Receiver<switchyard_runtime::Instances>,
    loads: std::sync::Arc<parking_lot::Mutex<BTreeMap<WorkerKey, LoadSnapshot>>>,
    traffic: std::sync::Arc<parking_lot::Mutex<BTreeMap<u64, (TrafficCounters, Instant)>>>,
    /// Each frontend's counters at the previous observation.
    last: BTreeMap<u64, TrafficCounters>,
    first: bool,
}

impl PlaneView {
    pub(super) async fn start(
        tree: &switchyard::config::Config,
        tracker: &tokio_util::task::TaskTracker,
        cancel: &tokio_util::sync::CancellationToken,
    ) -> Result<PlaneView> {
        use switchyard_runtime::{Discovery, EventPlane, ReplicaEvent, ReplicaPlane, WorkerEvent};
        let model = tree.frontend.model.clone();
        let (discovery, events) = switchyard::deploy::connect(tree, tracker, cancel).await?;
        let loads = std::sync::Arc::new(parking_lot::Mutex::new(BTreeMap::new()));
        let traffic = std::sync::Arc::new(parking_lot::Mutex::new(BTreeMap::new()));
        let mut reports = events.subscribe(&model).await?;
        let into = std::sync::Arc::clone(&loads);
        tracker.spawn(async move {
            while let Some(event) = reports.recv().await {
                if let WorkerEvent::Load { worker, load } = event {
                    into.lock().insert(worker, load);
                }
            }
        });
        let mut messages = events.subscribe_replicas(&model).await?;
        let into = std::sync::Arc::clone(&traffic);
        tracker.spawn(async move {
            while let Some(message) = messages.recv().await {
                for event in message.events {
                    if let ReplicaEvent::Traffic(counters) = event {
                        into.lock()
                            .insert(message.frontend, (counters, Instant::now()));
                    }
                }
            }
        });
        Ok(PlaneView {
            model,
            instances: discovery.watch(),
            _discovery: discovery,
            loads,
            traffic,
            last: BTreeMap::new(),
            first: true,
        })
    }

    fn observe(&mut self) -> Observation {
        let instances = self.instances.borrow().clone();
        let mut loads = self.loads.lock();
        // Workers gone from discovery are forgotten (a new one reuses no id).
        loads.retain(|key, _| instances.contains_key(&key.worker_id));
        let workers: Vec<WorkerSample> = instances
            .values()
            .filter(|w| w.model == self.model)
            .map(|w| {
                let engines: Vec<LoadSnapshot> = (0..w.dp_size.max(1))
                    .map(|rank| {
                        loads
                            .get(&WorkerKey {
                                worker_id: w.worker_id,
                                dp_rank: rank,
                            })
                            .copied()
                            .unwrap_or_default()
                    })
                    .collect();
                sample(w.role, &engines)
            })
            .collect();
        drop(loads);
        let mut traffic = self.traffic.lock();
        traffic.retain(|_, (_, seen)| seen.elapsed() <= FRONTEND_SILENCE);
        let mut sample = TrafficSample::default();
        let mut queued = 0;
        for (frontend, (now, _)) in traffic.iter() {
            queued += now.queued;
            // A frontend first heard of now is the baseline for the next interval.
            if let Some(before) = self.last.get(frontend) {
                let d = |a: u64, b: u64| a.saturating_sub(b);
                sample.requests += d(now.requests, before.requests);
                sample.input_tokens += d(now.input_tokens, before.input_tokens);
                sample.cached_tokens += d(now.cached_tokens, before.cached_tokens);
                sample.output_tokens += d(now.output_tokens, before.output_tokens);
                sample.finished += d(now.finished, before.finished);
                sample.ttft_ms_sum += d(now.ttft_us_sum, before.ttft_us_sum) as f64 / 1e3;
                sample.ttft_count += d(now.ttft_count, before.ttft_count);
                sample.itl_ms_sum += d(now.itl_us_sum, before.itl_us_sum) as f64 / 1e3;
                sample.itl_count += d(now.itl_count, before.itl_count);
            }
        }
        self.last = traffic.iter().map(|(&f, &(c, _))| (f, c)).collect();
        drop(traffic);
        // The first observation has no interval behind it (as a frontend's first pull).
        if std::mem::take(&mut self.first) {
            sample = TrafficSample::default();
        }
        let mut observation = Observation {
            workers,
            traffic: sample,
        };
        observation.add_queued(u32::try_from(queued).unwrap_or(u32::MAX));
        observation
    }
}

/// The counters the planner reads, from a Prometheus text exposition.
fn counters(text: &str) -> Result<Counters> {
    let lines = text.lines().map(|l| Ok(l.to_string()));
    let scrape = prometheus_parse::Scrape::parse(lines).context("the frontend's /metrics")?;
    let sum = |name: &str, label: Option<(&str, &[&str])>| -> f64 {
        scrape
            .samples
            .iter()
            .filter(|s| s.metric == name)
            .filter(|s| {
                label.is_none_or(|(key, values)| {
                    s.labels.get(key).is_some_and(|v| values.contains(&v))
                })
            })
            .map(|s| match &s.value {
                prometheus_parse::Value::Counter(v)
                | prometheus_parse::Value::Gauge(v)
                | prometheus_parse::Value::Untyped(v) => *v,
                _ => 0.0,
            })
            .sum()
    };
    let histogram = |name: &str| -> (f64, f64) {
        scrape
            .samples
            .iter()
            .filter(|s| s.metric == name)
            .find_map(|s| match &s.value {
                prometheus_parse::Value::Histogram(h) => {
                    let count = h.iter().map(|b| b.count).fold(0.0, f64::max);
                    Some((count, 0.0))
                }
                _ => None,
            })
            .map_or_else(
                || {
                    (
                        sum(&format!("{name}_count"), None),
                        sum(&format!("{name}_sum"), None),
                    )
                },
                |(count, _)| (count, sum(&format!("{name}_sum"), None)),
            )
    };
    let generation: &[&str] = &["/v1/completions", "/v1/chat/completions"];
    let (ttft_count, ttft_sum) = histogram("switchyard_time_to_first_token_seconds");
    let (itl_count, itl_sum) = histogram("switchyard_inter_token_latency_seconds");
    let (finished, _) = histogram("switchyard_request_duration_seconds");
    Ok(Counters {
        requests: sum(
            "switchyard_http_requests_total",
            Some(("route", generation)),
        ),
        // The prompt tokens of every request counted above, refused ones included, as the
        // simulator counts them; a frontend from before that counter: those served.
        input_tokens: if scrape
            .samples
            .iter()
            .any(|s| s.metric == "switchyard_offered_prompt_tokens_total")
        {
            sum("switchyard_offered_prompt_tokens_total", None)
        } else {
            sum("switchyard_input_tokens_total", None)
        },
        cached_tokens: sum("switchyard_cached_tokens_total", None),
        output_tokens: sum("switchyard_output_tokens_total", None),
        finished,
        ttft_sum,
        ttft_count,
        itl_sum,
        itl_count,
        queued: sum("switchyard_requests_queued", None),
    })
}
