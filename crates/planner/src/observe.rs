//! What the planner sees: a fleet observation per metric pull, and the summary of one
//! adjustment interval built from them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use switchyard_core::WorkerRole;

/// One worker's load at a metric pull.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct WorkerSample {
    pub role: WorkerRole,
    /// Share of the KV cache held by running requests, in [0, 1].
    pub kv_usage: f64,
    /// Requests waiting to be prefilled.
    pub waiting: u32,
    /// Requests prefilling or decoding.
    pub running: u32,
}

/// Traffic since the previous pull (counter differences), as the frontend saw it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct TrafficSample {
    /// Requests that arrived.
    pub requests: u64,
    /// Their prompt tokens, and how many of those were found cached.
    pub input_tokens: u64,
    pub cached_tokens: u64,
    /// Output tokens of requests that finished, and how many finished.
    pub output_tokens: u64,
    pub finished: u64,
    /// Sum and count of the times to first token and inter-token latencies measured.
    pub ttft_ms_sum: f64,
    pub ttft_count: u64,
    pub itl_ms_sum: f64,
    pub itl_count: u64,
}

impl TrafficSample {
    pub fn add(&mut self, other: &TrafficSample) {
        self.requests += other.requests;
        self.input_tokens += other.input_tokens;
        self.cached_tokens += other.cached_tokens;
        self.output_tokens += other.output_tokens;
        self.finished += other.finished;
        self.ttft_ms_sum += other.ttft_ms_sum;
        self.ttft_count += other.ttft_count;
        self.itl_ms_sum += other.itl_ms_sum;
        self.itl_count += other.itl_count;
    }
}

/// The fleet at one metric pull: every worker that answered, and the traffic since the last.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Observation {
    pub workers: Vec<WorkerSample>,
    pub traffic: TrafficSample,
}

impl Observation {
    pub fn count(&self, role: WorkerRole) -> u32 {
        self.workers.iter().filter(|w| w.role == role).count() as u32
    }

    /// Adds requests waiting in front of the workers (a frontend's admission queue) to
    /// the waiting requests of the workers that generate, spread evenly: they wait for a
    /// free engine as surely as those queued in the engines.
    pub fn add_queued(&mut self, queued: u32) {
        let generating = self
            .workers
            .iter()
            .filter(|w| w.role.serves_generation())
            .count() as u32;
        let (Some(each), Some(extra)) = (
            queued.checked_div(generating),
            queued.checked_rem(generating),
        ) else {
            return;
        };
        for (i, w) in self
            .workers
            .iter_mut()
            .filter(|w| w.role.serves_generation())
            .enumerate()
        {
            w.waiting += each + u32::from((i as u32) < extra);
        }
    }
}

/// One role over an adjustment interval.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct RoleLoad {
    /// Workers seen at the last pull.
    pub workers: u32,
    /// Mean KV usage over the interval's pulls and the role's workers; 0 with no samples
    /// (no workers, or no pull): an idle role, not an unknown one.
    pub kv_usage: f64,
    /// Mean waiting requests per worker over the interval's pulls.
    pub queue_per_worker: f64,
    /// Mean running requests per worker.
    pub running_per_worker: f64,
}

/// The traffic of an adjustment interval, in the units the SLA rules use.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct TrafficSummary {
    pub requests: u64,
    /// Requests per second.
    pub rate: f64,
    /// Mean prompt and output lengths (0 without requests).
    pub isl: f64,
    pub osl: f64,
    /// Share of prompt tokens found in cache.
    pub hit_rate: f64,
    /// Mean observed latencies, if any were measured.
    pub ttft_ms: Option<f64>,
    pub itl_ms: Option<f64>,
}

/// An adjustment interval, summarised.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct IntervalSummary {
    pub roles: BTreeMap<WorkerRole, RoleLoad>,
    pub traffic: TrafficSummary,
}

impl IntervalSummary {
    pub fn role(&self, role: WorkerRole) -> RoleLoad {
        self.roles.get(&role).copied().unwrap_or_default()
    }
}

/// Sums of one role's samples over an interval.
#[derive(Debug, Clone, Copy, Default)]
struct RoleSums {
    pulls: u32,
    kv_usage: f64,
    queue: f64,
    running: f64,
    last_workers: u32,
}

/// Accumulates the pulls of one adjustment interval.
#[derive(Debug, Clone, Default)]
pub(crate) struct IntervalAccumulator {
    roles: BTreeMap<WorkerRole, RoleSums>,
    traffic: TrafficSample,
}

impl IntervalAccumulator {
    pub fn add(&mut self, roles: &[WorkerRole], observation: &Observation) {
        for &role in roles {
            let sums = self.roles.entry(role).or_default();
            let workers: Vec<&WorkerSample> = observation
                .workers
                .iter()
                .filter(|w| w.role == role)
                .collect();
            sums.pulls += 1;
            sums.last_workers = workers.len() as u32;
            if !workers.is_empty() {
                let n = workers.len() as f64;
                sums.kv_usage += workers
                    .iter()
                    .map(|w| w.kv_usage.clamp(0.0, 1.0))
                    .sum::<f64>()
                    / n;
                sums.queue += workers.iter().map(|w| f64::from(w.waiting)).sum::<f64>() / n;
                sums.running += workers.iter().map(|w| f64::from(w.running)).sum::<f64>() / n;
            }
        }
        self.traffic.add(&observation.traffic);
    }

    /// The summary of the interval that lasted `seconds`, and a fresh accumulator.
    pub fn finish(&mut self, seconds: f64) -> IntervalSummary {
        let done = std::mem::take(self);
        let roles = done
            .roles
            .into_iter()
            .map(|(role, s)| {
                let per_pull = |v: f64| {
                    if s.pulls == 0 {
                        0.0
                    } else {
                        v / f64::from(s.pulls)
                    }
                };
                let load = RoleLoad {
                    workers: s.last_workers,
                    kv_usage: per_pull(s.kv_usage),
                    queue_per_worker: per_pull(s.queue),
                    running_per_worker: per_pull(s.running),
                };
                (role, load)
            })
            .collect();
        let t = done.traffic;
        let per = |sum: u64, n: u64| if n == 0 { 0.0 } else { sum as f64 / n as f64 };
        let traffic = TrafficSummary {
            requests: t.requests,
            rate: if seconds > 0.0 {
                t.requests as f64 / seconds
            } else {
                0.0
            },
            isl: per(t.input_tokens, t.requests),
            osl: per(t.output_tokens, t.finished),
            hit_rate: per(t.cached_tokens, t.input_tokens).clamp(0.0, 1.0),
            ttft_ms: (t.ttft_count > 0).then(|| t.ttft_ms_sum / t.ttft_count as f64),
            itl_ms: (t.itl_count > 0).then(|| t.itl_ms_sum / t.itl_count as f64),
        };
        IntervalSummary { roles, traffic }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn worker(role: WorkerRole, kv_usage: f64, waiting: u32) -> WorkerSample {
        WorkerSample {
            role,
            kv_usage,
            waiting,
            running: 2,
        }
    }

    #[test]
    fn the_admission_queue_is_spread_over_the_generating_workers() {
        let mut o = Observation {
            workers: vec![
                worker(WorkerRole::Prefill, 0.0, 1),
                worker(WorkerRole::Decode, 0.5, 0),
                worker(WorkerRole::Decode, 0.5, 2),
                worker(WorkerRole::Decode, 0.5, 0),
            ],
            traffic: TrafficSample::default(),
        };
        o.add_queued(7);
        let waiting: Vec<u32> = o.workers.iter().map(|w| w.waiting).collect();
        // 7 over three decode workers: 3, 2, 2; the prefill worker's queue is its own.
        assert_eq!(waiting, [1, 3, 4, 2]);
        let mut prefill_only = Observation {
            workers: vec![worker(WorkerRole::Prefill, 0.0, 1)],
            traffic: TrafficSample::default(),
        };
        prefill_only.add_queued(5);
        assert_eq!(prefill_only.workers[0].waiting, 1, "nobody to give it to");
    }

    #[test]
    fn an_interval_averages_its_pulls_and_a_missing_role_is_idle() {
        let mut acc = IntervalAccumulator::default();
        let roles = [WorkerRole::Prefill, WorkerRole::Decode];
        acc.add(
            &roles,
            &Observation {
                workers: vec![
                    worker(WorkerRole::Decode, 0.2, 0),
                    worker(WorkerRole::Decode, 0.6, 0),
                    worker(WorkerRole::Prefill, 0.0, 3),
                ],
                traffic: TrafficSample {
                    requests: 10,
                    input_tokens: 1000,
                    cached_tokens: 250,
                    output_tokens: 400,
                    finished: 8,
                    ttft_ms_sum: 800.0,
                    ttft_count: 8,
                    ..TrafficSample::default()
                },
            },
        );
        acc.add(
            &roles,
            &Observation {
                workers: vec![worker(WorkerRole::Decode, 1.0, 0)],
                traffic: TrafficSample {
                    requests: 10,
                    input_tokens: 1000,
                    finished: 2,
                    output_tokens: 100,
                    ..TrafficSample::default()
                },
            },
        );
        let s = acc.finish(4.0);
        let decode = s.role(WorkerRole::Decode);
        assert_eq!(decode.workers, 1);
        assert!((decode.kv_usage - (0.4 + 1.0) / 2.0).abs() < 1e-12);
        // The second pull saw no prefill worker: it counts as idle (0), not as missing.
        let prefill = s.role(WorkerRole::Prefill);
        assert_eq!(prefill.queue_per_worker, 1.5);
        assert_eq!(prefill.workers, 0);
        assert_eq!(s.traffic.rate, 5.0);
        assert_eq!(s.traffic.isl, 100.0);
        assert_eq!(s.traffic.osl, 50.0);
        assert_eq!(s.traffic.hit_rate, 0.125);
        assert_eq!(s.traffic.ttft_ms, Some(100.0));
        assert_eq!(s.traffic.itl_ms, None);
        // And the accumulator starts over.
        assert_eq!(acc.finish(1.0).traffic.requests, 0);
    }
}
