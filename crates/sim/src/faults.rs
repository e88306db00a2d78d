//! Worker failures in the simulated fleet, and what moving requests off a failed worker
//! costs.
//!
//! A fault strikes one worker at an instant:
//! - `crash`: the engine and its KV cache are gone at once. The frontend notices after the
//!   crash detection delay (the connection drops); the worker's requests move elsewhere and
//!   compute their prompt and the tokens already streamed again (re-prefill).
//! - `hang`: the engine stops producing anything while looking alive. The frontend notices
//!   when its first stream's stall timer runs out. Its KV cache is still in device memory, readable by a one-sided
//!   transfer, so a request may move with its KV instead of computing it again.
//! - `drain`: the worker is taken away on notice (a spot instance reclaimed, a node drained):
//!   its requests move at once, with their KV.
//!
//! A worker that failed comes back, fresh and with an empty cache, after the fault's
//! duration, or stays away. An MTBF draws crashes for every worker from an exponential
//! distribution, each followed by a repair time.
//!
//! Moving a request costs either a re-prefill on the target (the perf model's prefill time
//! for what the target does not hold cached) or a KV transfer over the configured link
//! (bytes per token from the model shape, at the link's bandwidth); the cheaper is taken.
//!
//! Two of these are the simulator's models of what the servers do, not the same code:
//! - **How a failure is found.** The servers find a failed worker through what its
//!   requests and canaries show: dispatch deadlines, the stall timer, breakers opened by
//!   failures in a row (see `switchyard_router::routing::health`). Here a crash is found
//!   after a fixed `crash_detection` delay (standing for the connection's drop), a drain
//!   at once, and a hang when the first of the worker's streams is due by the frontend's
//!   own rules (`switchyard_router::flow::stall`: its last token plus the stall timeout,
//!   or its first token's wait, longer while prefill is queued there): that stream finds
//!   the worker idle, a hang opens the breaker at once, and every stream leaves. The
//!   servers' streams leave in the order their tasks wake; here in request order. A
//!   request's failures still open breakers through its life, and a worker whose breaker
//!   opens first is taken out then. A worker that comes back rejoins as a new one, routable
//!   at once: the servers' half-open breaker and canary are not modelled.
//! - **What a hang is.** Here the engine stops. `serve`'s injected hang (the worker's
//!   `Fault::Hang`) withholds the worker's answers while its engine goes on computing and
//!   publishing KV events; a real hang is closer to this model.
//! - **Moves by KV transfer.** `serve` always moves a request by computing its prompt and
//!   streamed tokens again on the new worker: no engine it drives can read another's KV.
//!   With a link configured, the simulator stands for a fleet whose engines can (a
//!   one-sided transfer from a hung or drained worker's memory) and takes the cheaper move.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use thiserror::Error;

use crate::report::Distribution;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    Crash,
    Hang,
    Drain,
}

impl FaultKind {
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::Crash => "crash",
            FaultKind::Hang => "hang",
            FaultKind::Drain => "drain",
        }
    }

    /// Whether the worker's KV cache can still be read after the fault.
    pub fn kv_survives(self) -> bool {
        !matches!(self, FaultKind::Crash)
    }
}

/// One fault: `WORKER:KIND@AT[+FOR]`, e.g. `2:crash@90s+30s` (worker 2 crashes 90 s into
/// the run and is back 30 s later). Workers are numbered from 1, as `serve` numbers them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScheduledFault {
    pub worker: u32,
    pub kind: FaultKind,
    pub at: Duration,
    /// How long the worker stays away; none: for good.
    pub down_for: Option<Duration>,
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum FaultParseError {
    #[error("a fault is WORKER:KIND@AT[+FOR] (e.g. 2:crash@90s+30s), got {0:?}")]
    Shape(String),
    #[error("workers are numbered from 1, got {0:?}")]
    Worker(String),
    #[error("unknown fault kind {0:?}: crash, hang or drain")]
    Kind(String),
    #[error("invalid duration {0:?}: {1}")]
    Duration(String, String),
}

impl FromStr for ScheduledFault {
    type Err = FaultParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let shape = || FaultParseError::Shape(s.to_string());
        let (worker, rest) = s.split_once(':').ok_or_else(shape)?;
        let (kind, when) = rest.split_once('@').ok_or_else(shape)?;
        let worker = match worker.trim().parse::<u32>() {
            Ok(w) if w >= 1 => w,
            _ => return Err(FaultParseError::Worker(worker.to_string())),
        };
        let kind = match kind.trim() {
            "crash" => FaultKind::Crash,
            "hang" => FaultKind::Hang,
            "drain" => FaultKind::Drain,
            other => return Err(FaultParseError::Kind(other.to_string())),
        };
        let (at, down_for) = match when.split_once('+') {
            Some((at, down)) => (at, Some(down)),
            None => (when, None),
        };
        let duration = |text: &str| {
            humantime::parse_duration(text.trim())
                .map_err(|e| FaultParseError::Duration(text.to_string(), e.to_string()))
        };
        Ok(ScheduledFault {
            worker,
            kind,
            at: duration(at)?,
            down_for: down_for.map(duration).transpose()?,
        })
    }
}

impl fmt::Display for ScheduledFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}@{}",
            self.worker,
            self.kind.name(),
            humantime::format_duration(self.at)
        )?;
        if let Some(down) = self.down_for {
            write!(f, "+{}", humantime::format_duration(down))?;
        }
        Ok(())
    }
}

/// A link KV moves over.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Link {
    /// Bytes per second.
    pub bandwidth: f64,
    /// Fixed cost of one transfer (connection, memory registration, metadata).
    pub setup: Duration,
}

impl Link {
    pub const NVLINK: f64 = 900e9;
    pub const PCIE5: f64 = 28e9;
    pub const INFINIBAND: f64 = 50e9;

    /// How long moving `bytes` takes.
    pub fn transfer_time(&self, bytes: u64) -> Duration {
        self.setup + Duration::from_secs_f64(bytes as f64 / self.bandwidth)
    }
}

/// Text that is no [`Link`].
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("a link is nvlink, pcie5, ib or a bandwidth in GB/s, got {0:?}")]
pub struct InvalidLink(pub String);

/// `nvlink` (900 GB/s), `pcie5` (28 GB/s), `ib` (50 GB/s), or a bandwidth in GB/s.
impl FromStr for Link {
    type Err = InvalidLink;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bandwidth = match s.trim() {
            "nvlink" => Link::NVLINK,
            "pcie5" => Link::PCIE5,
            "ib" | "infiniband" => Link::INFINIBAND,
            other => match other.parse::<f64>() {
                Ok(gbs) if gbs.is_finite() && gbs > 0.0 => gbs * 1e9,
                _ => return Err(InvalidLink(other.to_string())),
            },
        };
        Ok(Link {
            bandwidth,
            setup: Duration::ZERO,
        })
    }
}

/// The shape of the model's KV cache, for the bytes one token's KV takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelShape {
    pub layers: u32,
    pub kv_heads: u32,
    pub head_dim: u32,
    /// Bytes per value (2 for bf16/fp16, 1 for fp8).
    pub value_bytes: u32,
}

impl ModelShape {
    /// Llama 3 8B: 32 layers, 8 KV heads of 128, bf16.
    pub const LLAMA_3_8B: ModelShape = ModelShape {
        layers: 32,
        kv_heads: 8,
        head_dim: 128,
        value_bytes: 2,
    };
    /// Llama 3 70B: 80 layers, 8 KV heads of 128, bf16.
    pub const LLAMA_3_70B: ModelShape = ModelShape {
        layers: 80,
        kv_heads: 8,
        head_dim: 128,
        value_bytes: 2,
    };

    /// A key and a value per layer and KV head.
    pub fn kv_bytes_per_token(&self) -> u64 {
        2 * u64::from(self.layers)
            * u64::from(self.kv_heads)
            * u64::from(self.head_dim)
            * u64::from(self.value_bytes)
    }
}

/// Text that is no [`ModelShape`].
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error(
    "a model shape is llama-3-8b, llama-3-70b or LAYERS,KV_HEADS,HEAD_DIM,VALUE_BYTES \
     (positive, VALUE_BYTES at most 8), got {0:?}"
)]
pub struct InvalidModelShape(pub String);

/// `llama-3-8b`, `llama-3-70b`, or `LAYERS,KV_HEADS,HEAD_DIM,VALUE_BYTES`.
impl FromStr for ModelShape {
    type Err = InvalidModelShape;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "llama-3-8b" => return Ok(ModelShape::LLAMA_3_8B),
            "llama-3-70b" => return Ok(ModelShape::LLAMA_3_70B),
            _ => {}
        }
        let parts: Vec<u32> = s
            .split(',')
            .map(|p| p.trim().parse::<u32>())
            .collect::<Result<_, _>>()
            .map_err(|_| InvalidModelShape(s.to_string()))?;
        match parts[..] {
            [layers, kv_heads, head_dim, value_bytes]
                if parts.iter().all(|&p| p > 0) && value_bytes <= 8 =>
            {
                Ok(ModelShape {
                    layers,
                    kv_heads,
                    head_dim,
                    value_bytes,
                })
            }
            _ => Err(InvalidModelShape(s.to_string())),
        }
    }
}

/// Failures to play and how the fleet copes.
#[derive(Debug, Clone, PartialEq)]
pub struct FaultConfig {
    pub schedule: Vec<ScheduledFault>,
    /// Mean time between crashes of each worker; none: only the schedule.
    pub mtbf: Option<Duration>,
    /// How long a worker crashed by the MTBF stays away.
    pub repair: Duration,
    /// How long the frontend takes to notice a crash (the chaos test measures this on
    /// real processes: 3-20 ms at the median, under 70 ms at worst).
    pub crash_detection: Duration,
    /// The link KV can move over; none: a moved request always computes its KV again.
    pub link: Option<Link>,
    pub kv_bytes_per_token: u64,
}

impl Default for FaultConfig {
    fn default() -> Self {
        FaultConfig {
            schedule: Vec::new(),
            mtbf: None,
            repair: Duration::from_secs(60),
            crash_detection: Duration::from_millis(20),
            link: None,
            kv_bytes_per_token: ModelShape::LLAMA_3_8B.kv_bytes_per_token(),
        }
    }
}

impl FaultConfig {
    /// Whether any fault can happen.
    pub fn any(&self) -> bool {
        !self.schedule.is_empty() || self.mtbf.is_some()
    }

    /// The schedule plus the crashes the MTBF draws for `workers` workers up to `horizon`,
    /// ordered by time.
    pub fn plan(&self, workers: u32, horizon: Duration, seed: u64) -> Vec<ScheduledFault> {
        let mut faults: Vec<ScheduledFault> = self
            .schedule
            .iter()
            .filter(|f| f.worker <= workers)
            .copied()
            .collect();
        if let Some(mtbf) = self.mtbf.filter(|m| !m.is_zero()) {
            let mut rng = SmallRng::seed_from_u64(seed ^ 0x6661_756c_7473);
            for worker in 1..=workers {
                let mut t = Duration::ZERO;
                loop {
                    // Exponential inter-failure times: -ln(U) * MTBF.
                    let u: f64 = rng.random_range(f64::MIN_POSITIVE..1.0);
                    t += mtbf.mul_f64(-u.ln());
                    if t > horizon {
                        break;
                    }
                    faults.push(ScheduledFault {
                        worker,
                        kind: FaultKind::Crash,
                        at: t,
                        down_for: Some(self.repair),
                    });
                    t += self.repair;
                }
            }
        }
        faults.sort_by_key(|f| (f.at, f.worker));
        faults
    }
}

/// What failures did to a run.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct FailureReport {
    /// Faults that struck (a fault on a worker already away does nothing).
    pub faults: u64,
    pub faults_by_kind: std::collections::BTreeMap<&'static str, u64>,
    /// Requests caught on a failed worker (a request caught twice counts twice).
    pub interrupted: u64,
    /// Interrupted before their first token: sent again, as a new request.
    pub restarted: u64,
    /// Moves of requests that had streamed tokens.
    pub migrations: u64,
    /// Moves that sent the KV over the link.
    pub by_transfer: u64,
    /// Moves that computed prompt and streamed tokens again.
    pub by_reprefill: u64,
    /// Requests that could not be moved (out of moves, or no worker left).
    pub failed: u64,
    /// Requests completed after at least one move.
    pub completed_after_move: u64,
    /// Tokens the targets had to compute again (not cached there), by re-prefill.
    pub recomputed_tokens: u64,
    pub transferred_bytes: u64,
    /// From the fault to the moved request's next token (what its client waits).
    pub stall_ms: Distribution,
    /// End to end, requests that were moved.
    pub moved_e2e_ms: Distribution,
    /// End to end, requests never caught by a fault.
    pub untouched_e2e_ms: Distribution,
    /// Worker time lost to faults (from each fault to the worker's return or the end).
    pub worker_seconds_down: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fault_specs_parse_and_print_back() {
        let f: ScheduledFault = "2:crash@90s+30s".parse().unwrap();
        assert_eq!(
            f,
            ScheduledFault {
                worker: 2,
                kind: FaultKind::Crash,
                at: Duration::from_secs(90),
                down_for: Some(Duration::from_secs(30)),
            }
        );
        assert_eq!(f.to_string().parse::<ScheduledFault>().unwrap(), f);
        let h: ScheduledFault = "1:hang@1m500ms".parse().unwrap();
        assert_eq!(
            (h.kind, h.at, h.down_for),
            (FaultKind::Hang, Duration::from_millis(60_500), None)
        );
        for bad in [
            "crash@1s",
            "0:crash@1s",
            "x:crash@1s",
            "1:melt@1s",
            "1:crash",
            "1:crash@soon",
            "1:drain@1s+",
        ] {
            assert!(bad.parse::<ScheduledFault>().is_err(), "{bad}");
        }
        assert!(matches!(
            "1:melt@1s".parse::<ScheduledFault>(),
            Err(FaultParseError::Kind(k)) if k == "melt"
        ));
    }

    #[test]
    fn links_and_shapes() {
        assert_eq!("nvlink".parse::<Link>().unwrap().bandwidth, 900e9);
        assert_eq!("pcie5".parse::<Link>().unwrap().bandwidth, 28e9);
        assert_eq!("ib".parse::<Link>().unwrap().bandwidth, 50e9);
        assert_eq!("12.5".parse::<Link>().unwrap().bandwidth, 12.5e9);
        assert!("0".parse::<Link>().is_err() && "fast".parse::<Link>().is_err());
        // 1 GB over 50 GB/s: 20 ms.
        let ib: Link = "ib".parse().unwrap();
        assert_eq!(ib.transfer_time(1_000_000_000), Duration::from_millis(20));
        assert_eq!(ModelShape::LLAMA_3_8B.kv_bytes_per_token(), 131_072);
        assert_eq!(
            "80,8,128,2".parse::<ModelShape>().unwrap(),
            ModelShape::LLAMA_3_70B
        );
        assert!("32,8,128".parse::<ModelShape>().is_err());
        assert!("32,0,128,2".parse::<ModelShape>().is_err());
    }

    #[test]
    fn mtbf_draws_crashes_with_the_expected_mean_and_repairs() {
        let config = FaultConfig {
            mtbf: Some(Duration::from_secs(100)),
            repair: Duration::from_secs(10),
            schedule: vec!["3:hang@5s".parse().unwrap(), "9:crash@1s".parse().unwrap()],
            ..FaultConfig::default()
        };
        let horizon = Duration::from_secs(200_000);
        let plan = config.plan(4, horizon, 7);
        assert!(plan.windows(2).all(|w| w[0].at <= w[1].at));
        // Worker 9 does not exist; the hang is kept.
        assert!(plan.iter().all(|f| f.worker <= 4));
        assert!(plan.iter().any(|f| f.kind == FaultKind::Hang));
        for worker in 1..=4 {
            let crashes: Vec<_> = plan
                .iter()
                .filter(|f| f.worker == worker && f.kind == FaultKind::Crash)
                .collect();
            // A worker is up MTBF on average, then down for the repair: about
            // horizon / 110 s crashes each.
            let expected = horizon.as_secs_f64() / 110.0;
            let n = crashes.len() as f64;
            assert!((n - expected).abs() < expected * 0.1, "{n} vs {expected}");
            // Never a crash while down.
            assert!(
                crashes
                    .windows(2)
                    .all(|w| w[1].at >= w[0].at + config.repair)
            );
        }
        // Same seed, same plan; another seed, another.
        assert_eq!(config.plan(4, horizon, 7), plan);
        assert_ne!(config.plan(4, horizon, 8), plan);
    }
}
