//! Worker selection policies: one file per policy, behind the one [`Policy`] trait.
//!
//! Every policy sees the same [`Candidate`] rows (one per eligible worker) and picks one.
//! `latency` and `kv` are Switchyard's own; the others are baselines to compare them with.
//!
//! - [`kv`]: the worker where the request should finish soonest, by blocks.
//! - [`latency`]: the worker where its first token comes soonest, by the worker's timing.
//! - [`round_robin`], [`random`], [`least_loaded`], [`power_of_two`]: load baselines.
//! - [`cache_aware`]: SGLang's router's rules.
//! - [`choice`]: picking among costs (cheapest, ties, softmax), shared by the policies.
//!
//! The list below ([`policies!`]) is the one place a policy is named: its kind, its name in
//! configuration and on the command line, and how it is built from [`PolicySettings`]. A
//! policy's knobs live in its own config struct, in its own file, embedded in
//! `crate::RouterConfig` (`[frontend.router.<policy>]` in a configuration file).

use std::fmt;
use std::str::FromStr;

use rand::rngs::SmallRng;
use serde::{Deserialize, Serialize};
use switchyard_core::perf::{PerfModel, StepShape};
use switchyard_core::{WorkerId, WorkerKey};

pub mod cache_aware;
pub mod choice;
pub mod kv;
pub mod latency;
pub mod least_loaded;
pub mod power_of_two;
pub mod random;
pub mod round_robin;
#[cfg(test)]
mod tests;

pub use cache_aware::{CacheAware, CacheAwareConfig};
pub use kv::{KvPolicy, KvPolicyConfig};
pub use latency::{LatencyPolicy, LatencyPolicyConfig};
pub use least_loaded::LeastLoaded;
pub use power_of_two::PowerOfTwo;
pub use random::RandomPolicy;
pub use round_robin::RoundRobin;

/// What a policy knows about one worker for one request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Candidate {
    pub worker: WorkerKey,
    /// Blocks of the request already cached on the worker (consecutive from the first).
    pub overlap_blocks: u32,
    /// Blocks cached on the worker in total (its tree size).
    pub cached_blocks: u64,
    /// Blocks held by the worker's in-flight requests.
    pub active_blocks: u64,
    /// Blocks of the request the worker's in-flight requests do not already hold.
    pub new_blocks: u64,
    /// Prefill tokens routed to the worker and not yet computed.
    pub prefill_tokens: u64,
    /// How long the worker has been computing the head of those tokens, in milliseconds
    /// (0 when none are queued).
    pub prefill_elapsed_ms: f64,
    /// In-flight requests on the worker.
    pub active_requests: u32,
    /// The worker's timing, an index into [`Selection::timings`].
    pub timing: u16,
}

/// How a worker's steps take time, for predicting latency: announced by the worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerTiming {
    pub perf: PerfModel,
    /// Tokens one step computes at most (vLLM's `max_num_batched_tokens`).
    pub max_batched_tokens: u32,
    /// KV blocks the worker holds.
    pub capacity_blocks: u64,
}

impl Default for WorkerTiming {
    /// The mocker's defaults: the polynomial model, vLLM's 8,192-token steps, 16,384 blocks.
    fn default() -> Self {
        WorkerTiming {
            perf: PerfModel::Polynomial,
            max_batched_tokens: 8192,
            capacity_blocks: 16_384,
        }
    }
}

impl WorkerTiming {
    /// One step's decode time for `decoding` running sequences whose contexts hold
    /// `kv_tokens`, with `active_blocks` of the worker's KV in use, in milliseconds.
    pub fn decode_step_ms(&self, decoding: u32, kv_tokens: u64, active_blocks: u64) -> f64 {
        if decoding == 0 {
            return 0.0;
        }
        self.perf.decode_ms(&StepShape {
            decode_seqs: decoding,
            decode_kv_tokens: kv_tokens,
            active_blocks,
            capacity_blocks: self.capacity_blocks,
            ..StepShape::default()
        })
    }

    /// Prefill of `tokens` in steps of at most `max_batched_tokens`: milliseconds of
    /// prefill compute, and the number of steps.
    pub fn prefill_steps_ms(&self, tokens: u64) -> (f64, u64) {
        let budget = u64::from(self.max_batched_tokens.max(1));
        let (full, rest) = (tokens / budget, tokens % budget);
        let mut ms = full as f64 * self.perf.prefill_ms(budget as u32);
        if rest > 0 {
            ms += self.perf.prefill_ms(rest as u32);
        }
        (ms, full + u64::from(rest > 0))
    }
}

/// Per-request routing overrides.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct RoutingOverrides {
    pub policy: Option<PolicyKind>,
    pub overlap_weight: Option<f64>,
    pub temperature: Option<f64>,
    /// The worker the request goes to whenever it may take it (serving, not excluded),
    /// whatever the policy would choose: joint routing sends media it did not encode to the
    /// worker holding their KV.
    pub worker: Option<WorkerId>,
    /// Its media were not encoded: the worker it is pinned to (`worker`) holds their KV,
    /// and no other has them, so in a disaggregated fleet that worker prefills it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub held_media: bool,
    /// The request goes ahead of its media (still being encoded).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub media_pending: bool,
    /// The most tokens the request will generate (its `max_tokens`), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
}

/// One request, as the policies see it.
#[derive(Debug, Clone, Copy)]
pub struct Selection<'a> {
    pub isl_tokens: u64,
    pub block_size: u32,
    pub candidates: &'a [Candidate],
    pub overrides: &'a RoutingOverrides,
    /// The workers' timings ([`Candidate::timing`] indexes them).
    pub timings: &'a [WorkerTiming],
}

/// A selection policy. Returns the index of the chosen candidate (`None` only when there
/// are no candidates).
pub trait Policy: Send + fmt::Debug {
    fn kind(&self) -> PolicyKind;
    fn select(&mut self, selection: &Selection<'_>, rng: &mut SmallRng) -> Option<usize>;
}

/// The settings policies are built with: their parts of [`crate::RouterConfig`].
#[derive(Debug, Clone, Copy, Default)]
pub struct PolicySettings {
    pub kv: KvPolicyConfig,
    pub latency: LatencyPolicyConfig,
    pub cache_aware: CacheAwareConfig,
}

/// Declares the policies: each one's kind, its name, and how it is built.
macro_rules! policies {
    ($( $(#[$doc:meta])* $kind:ident = $name:literal => $build:expr ),+ $(,)?) => {
        /// The policies, by name.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        pub enum PolicyKind {
            $( $(#[$doc])* #[serde(rename = $name)] $kind, )+
        }

        impl PolicyKind {
            /// Every policy, in the order they are listed.
            pub const ALL: &'static [PolicyKind] = &[$(PolicyKind::$kind),+];

            /// Its name in configuration files and on the command line.
            pub fn name(self) -> &'static str {
                match self {
                    $(PolicyKind::$kind => $name,)+
                }
            }
        }

        /// Builds a policy with its settings from `config`.
        pub fn build(kind: PolicyKind, config: &PolicySettings) -> Box<dyn Policy> {
            let build: fn(&PolicySettings) -> Box<dyn Policy> = match kind {
                $(PolicyKind::$kind => $build,)+
            };
            build(config)
        }
    };
}

policies! {
    /// Least predicted work by blocks: prefill against decode load ([`kv`]).
    Kv = "kv" => |c| Box::new(KvPolicy { config: c.kv }),
    /// Soonest predicted first token, by the worker's timing model ([`latency`]).
    Latency = "latency" => |c| Box::new(LatencyPolicy { config: c.latency }),
    RoundRobin = "round-robin" => |_| Box::new(RoundRobin::default()),
    Random = "random" => |_| Box::new(RandomPolicy),
    LeastLoaded = "least-loaded" => |_| Box::new(LeastLoaded),
    PowerOfTwo = "power-of-two" => |_| Box::new(PowerOfTwo),
    /// SGLang's router's rules ([`cache_aware`]).
    CacheAware = "cache-aware" => |c| Box::new(CacheAware { config: c.cache_aware }),
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A policy name that is not in the list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownPolicy(pub String);

impl fmt::Display for UnknownPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = PolicyKind::ALL.iter().map(|k| k.name()).collect();
        write!(
            f,
            "unknown routing policy {:?}; expected one of: {}",
            self.0,
            names.join(", ")
        )
    }
}

impl std::error::Error for UnknownPolicy {}

impl FromStr for PolicyKind {
    type Err = UnknownPolicy;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        PolicyKind::ALL
            .iter()
            .copied()
            .find(|k| k.name() == s)
            .ok_or_else(|| UnknownPolicy(s.to_string()))
    }
}
