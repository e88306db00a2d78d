//! Worker health: one state machine per worker, fed by what the shell observes (requests
//! that progress or fail, canary checks), with `now` as an input.
//!
//! - A failure of the worker's own making (it could not be reached, the connection broke, a
//!   stream stalled, a 5xx-class error, a canary timed out or was slow) makes a healthy
//!   worker **suspicious**: it keeps getting requests, at `suspicious_weight` of its share.
//!   Back-pressure (429/503, "overloaded") and invalid requests (4xx) are never failures.
//! - `failure_threshold` failures in a row open its **circuit breaker**: the worker is
//!   **unhealthy**, gets no new requests, and the shell moves its in-flight requests
//!   elsewhere. A canary answer that differs from what the worker (or the rest of the fleet)
//!   answered before is silent corruption: the breaker opens at once.
//! - After `recovery_timeout` (with jitter, so a fleet that failed together does not come
//!   back together) the breaker is **half-open**: one canary goes through; if it passes the
//!   breaker closes and the worker is healthy again, else it stays open another period.
//! - `success_threshold` successes in a row make a suspicious worker healthy again.
//! - A cap on the fleet: a soft failure (a stall, a hang, a timeout, a 5xx, a slow or
//!   unanswered canary: what an overloaded or starved worker also shows) takes a worker out
//!   only while fewer than `max_unhealthy_fraction` of the workers of its role (at least
//!   one) is out; past that the worker stays suspicious. When most of a fleet looks sick at once,
//!   the load is the likelier cause, and taking workers out moves their requests onto the
//!   rest, which then look sick in turn until nothing serves. Hard evidence (the worker
//!   refused or dropped the connection, or answered wrongly) takes it out regardless.
//!
//! Canaries: a short fixed prompt, greedy, a few tokens, sent to each worker every
//! `canary_interval`, sooner to a worker idle for `canary_idle` (nothing would notice its
//! failure otherwise), and to probe a half-open breaker. Their latency keeps an exponential
//! average; a check slower than `latency_spike_factor` times it counts as a failure.
//!
//! Stalls: a stream that gets no token for `stall_timeout` (the worker's own inter-token
//! latency times `stall_factor`, at least `stall_floor`) is stalled; the first token gets
//! `first_token_timeout`.

mod in_core;

use std::time::Duration;

use rand::Rng;
use rand::rngs::SmallRng;
use serde::{Deserialize, Serialize};
use switchyard_core::Token;

use crate::InvalidConfig;

/// How much the router trusts a worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HealthState {
    #[default]
    Healthy,
    /// A recent failure: still routed to, at reduced weight.
    Suspicious,
    /// Repeated failures: no new requests.
    Unhealthy,
}

impl HealthState {
    /// The share of traffic the state allows, relative to a healthy worker.
    pub fn weight(self) -> f64 {
        match self {
            HealthState::Healthy => 1.0,
            HealthState::Suspicious => 0.5,
            HealthState::Unhealthy => 0.0,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            HealthState::Healthy => "healthy",
            HealthState::Suspicious => "suspicious",
            HealthState::Unhealthy => "unhealthy",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HealthConfig {
    /// Failures in a row that open a worker's breaker.
    pub failure_threshold: u32,
    /// Successes in a row that make a suspicious worker healthy.
    pub success_threshold: u32,
    /// Share of its traffic a suspicious worker keeps.
    pub suspicious_weight: f64,
    /// How long an open breaker stays open before a probe.
    #[serde(with = "humantime_serde")]
    pub recovery_timeout: Duration,
    /// Random spread of the recovery timeout, as a fraction of it (0.2: ±20 %).
    pub recovery_jitter: f64,
    /// Canary checks: how often each worker gets one (0 turns them off).
    #[serde(with = "humantime_serde")]
    pub canary_interval: Duration,
    /// A worker idle this long gets a canary (it would not be noticed failing otherwise).
    #[serde(with = "humantime_serde")]
    pub canary_idle: Duration,
    /// A canary not answered in this long fails.
    #[serde(with = "humantime_serde")]
    pub canary_timeout: Duration,
    /// Tokens a canary asks for.
    pub canary_max_tokens: u32,
    /// Weight of a new canary latency in its moving average.
    pub latency_alpha: f64,
    /// A canary slower than this many times the average counts as a failure.
    pub latency_spike_factor: f64,
    /// A canary whose tokens are right but whose log probabilities (from a worker that
    /// reports them) moved further than this, in nats, from the worker's first answer is
    /// silent corruption: perturbed logits that have not changed a greedy token yet.
    pub canary_logprob_tolerance: f64,
    /// Shortest stall timeout between tokens.
    #[serde(with = "humantime_serde")]
    pub stall_floor: Duration,
    /// The stall timeout is this many times the worker's average inter-token latency.
    pub stall_factor: f64,
    /// Longest wait for a request's first token before it counts as stalled.
    #[serde(with = "humantime_serde")]
    pub first_token_timeout: Duration,
    /// Soft failures take a worker out only while fewer than this share of the workers of
    /// its role (and at least one) is out (1: no cap).
    pub max_unhealthy_fraction: f64,
}

impl Default for HealthConfig {
    fn default() -> Self {
        HealthConfig {
            failure_threshold: 3,
            success_threshold: 2,
            suspicious_weight: 0.5,
            recovery_timeout: Duration::from_secs(60),
            recovery_jitter: 0.2,
            canary_interval: Duration::from_secs(30),
            canary_idle: Duration::from_secs(10),
            canary_timeout: Duration::from_secs(3),
            canary_max_tokens: 4,
            latency_alpha: 0.1,
            latency_spike_factor: 3.0,
            // The candle engine repeats its canary's values exactly, under load too; how a
            // prompt is split into steps moves a greedy token's by up to 0.05 and other
            // tokens' by up to 0.35 (docs/benchmarks.md, log probabilities).
            canary_logprob_tolerance: 0.5,
            stall_floor: Duration::from_millis(1000),
            stall_factor: 10.0,
            first_token_timeout: Duration::from_secs(30),
            max_unhealthy_fraction: 0.5,
        }
    }
}

impl HealthConfig {
    /// Checks values serde cannot; names the key.
    pub fn validate(&self) -> Result<(), InvalidConfig> {
        if self.failure_threshold == 0 {
            return Err(InvalidConfig::new(
                "health.failure_threshold",
                "must be at least 1",
            ));
        }
        if self.success_threshold == 0 {
            return Err(InvalidConfig::new(
                "health.success_threshold",
                "must be at least 1",
            ));
        }
        if !(self.suspicious_weight > 0.0 && self.suspicious_weight <= 1.0) {
            return Err(InvalidConfig::new(
                "health.suspicious_weight",
                format!("must be in (0, 1], got {}", self.suspicious_weight),
            ));
        }
        if !(0.0..1.0).contains(&self.recovery_jitter) {
            return Err(InvalidConfig::new(
                "health.recovery_jitter",
                format!("must be in [0, 1), got {}", self.recovery_jitter),
            ));
        }
        if !(self.canary_logprob_tolerance > 0.0 && self.canary_logprob_tolerance.is_finite()) {
            return Err(InvalidConfig::new(
                "health.canary_logprob_tolerance",
                format!(
                    "must be a positive number, got {}",
                    self.canary_logprob_tolerance
                ),
            ));
        }
        if !(self.latency_alpha > 0.0 && self.latency_alpha <= 1.0) {
            return Err(InvalidConfig::new(
                "health.latency_alpha",
                format!("must be in (0, 1], got {}", self.latency_alpha),
            ));
        }
        if self.latency_spike_factor.is_nan() || self.latency_spike_factor <= 1.0 {
            return Err(InvalidConfig::new(
                "health.latency_spike_factor",
                format!("must be above 1, got {}", self.latency_spike_factor),
            ));
        }
        InvalidConfig::check_at_least("health.stall_factor", self.stall_factor, 1.0)?;
        if !(0.0..=1.0).contains(&self.max_unhealthy_fraction) {
            return Err(InvalidConfig::new(
                "health.max_unhealthy_fraction",
                format!("must be in [0, 1], got {}", self.max_unhealthy_fraction),
            ));
        }
        if self.canary_max_tokens == 0 {
            return Err(InvalidConfig::new(
                "health.canary_max_tokens",
                "must be at least 1",
            ));
        }
        if self.first_token_timeout.is_zero() {
            return Err(InvalidConfig::new(
                "health.first_token_timeout",
                "must be longer than zero",
            ));
        }
        Ok(())
    }
}

/// Something that went wrong on a worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Failure {
    /// It could not be reached (the connection was refused, no address is known).
    Unreachable,
    /// It accepted no request within the dispatch timeout (gone, or overloaded).
    Timeout,
    /// The connection broke mid-request.
    Disconnected,
    /// A stream got no token for the stall timeout (while the worker's other streams
    /// progressed: something is wrong with that request there).
    Stalled,
    /// The worker produced no token on any stream for the stall timeout while it had
    /// requests: it hangs.
    Hung,
    /// It answered with an error of its own (5xx-class).
    ServerError,
    /// A canary was not answered in time.
    CanaryTimeout,
    /// A canary answered much slower than usual.
    LatencySpike,
    /// A canary answered with other tokens than expected: silent corruption.
    WrongOutput,
}

impl Failure {
    pub const KINDS: [Failure; 9] = [
        Failure::Unreachable,
        Failure::Timeout,
        Failure::Disconnected,
        Failure::Stalled,
        Failure::Hung,
        Failure::ServerError,
        Failure::CanaryTimeout,
        Failure::LatencySpike,
        Failure::WrongOutput,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Failure::Unreachable => "unreachable",
            Failure::Timeout => "timeout",
            Failure::Disconnected => "disconnected",
            Failure::Stalled => "stalled",
            Failure::Hung => "hung",
            Failure::ServerError => "server_error",
            Failure::CanaryTimeout => "canary_timeout",
            Failure::LatencySpike => "latency_spike",
            Failure::WrongOutput => "wrong_output",
        }
    }

    /// Failures that open the breaker at once: the worker cannot be trusted at all
    /// (corrupt), or nothing it holds is moving (hung).
    fn is_definitive(self) -> bool {
        matches!(self, Failure::WrongOutput | Failure::Hung)
    }

    /// Failures that only a broken worker shows (nothing accepted the connection, it broke,
    /// the answer was wrong), as opposed to those an overloaded or starved one shows too:
    /// only these take a worker out past the fleet's cap.
    pub fn is_hard(self) -> bool {
        matches!(
            self,
            Failure::Unreachable | Failure::Disconnected | Failure::WrongOutput
        )
    }
}

/// The state of a worker's circuit breaker.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case", tag = "state")]
pub enum Breaker {
    Closed,
    /// No traffic until `until` (time since the core started).
    Open {
        #[serde(with = "humantime_serde")]
        until: Duration,
    },
    /// One probe (a canary) may go through.
    HalfOpen,
}

impl Breaker {
    pub fn name(self) -> &'static str {
        match self {
            Breaker::Closed => "closed",
            Breaker::Open { .. } => "open",
            Breaker::HalfOpen => "half_open",
        }
    }
}

/// A change of a worker's health state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthChange {
    pub from: HealthState,
    pub to: HealthState,
}

/// What the health tracker knows of one worker.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorkerHealth {
    pub state: HealthState,
    pub breaker: Breaker,
    pub consecutive_failures: u32,
    pub consecutive_successes: u32,
    /// The last failure, if any.
    pub last_failure: Option<Failure>,
    /// Breaker openings so far.
    pub openings: u32,
    /// Soft failures that would have opened the breaker but for the fleet's cap.
    pub kept_in: u32,
    /// Moving average of canary latency, in seconds.
    pub canary_latency: Option<f64>,
    canary_samples: u32,
    /// Moving average of the gap between streamed tokens, in seconds.
    pub inter_token: Option<f64>,
    /// The worker's first canary answer, and its last.
    #[serde(skip)]
    pub first_answer: Option<Vec<Token>>,
    /// The log probabilities of the first answer that came with them.
    #[serde(skip)]
    first_logprobs: Option<Vec<f32>>,
    #[serde(skip)]
    pub last_answer: Option<Vec<Token>>,
    #[serde(skip)]
    last_activity: Duration,
    #[serde(skip)]
    last_canary: Option<Duration>,
    #[serde(skip)]
    canary_in_flight: bool,
    /// The canary in flight met requests on the worker (when sent or when it came back):
    /// its latency says how busy the worker is, not how healthy, so it is neither judged
    /// against the average nor folded into it (its answer still is judged; stall
    /// detection watches the worker's streams).
    #[serde(skip)]
    pub canary_under_load: bool,
}

impl WorkerHealth {
    pub fn new(now: Duration) -> Self {
        WorkerHealth {
            state: HealthState::Healthy,
            breaker: Breaker::Closed,
            consecutive_failures: 0,
            consecutive_successes: 0,
            last_failure: None,
            openings: 0,
            kept_in: 0,
            canary_latency: None,
            canary_samples: 0,
            inter_token: None,
            first_answer: None,
            first_logprobs: None,
            last_answer: None,
            last_activity: now,
            last_canary: None,
            canary_in_flight: false,
            canary_under_load: false,
        }
    }

    fn set(&mut self, to: HealthState) -> Option<HealthChange> {
        let from = self.state;
        self.state = to;
        (from != to).then_some(HealthChange { from, to })
    }

    /// Opens the breaker until `now` + the (jittered) recovery timeout.
    fn open(
        &mut self,
        config: &HealthConfig,
        now: Duration,
        rng: &mut SmallRng,
    ) -> Option<HealthChange> {
        let jitter = if config.recovery_jitter > 0.0 {
            rng.random_range(-config.recovery_jitter..=config.recovery_jitter)
        } else {
            0.0
        };
        let wait = config.recovery_timeout.mul_f64((1.0 + jitter).max(0.0));
        self.breaker = Breaker::Open { until: now + wait };
        self.openings += 1;
        self.consecutive_successes = 0;
        self.set(HealthState::Unhealthy)
    }

    /// Records a failure. `room`: the fleet may lose another worker (see the module's
    /// cap); without it a soft failure leaves a healthy worker suspicious at most.
    pub fn fail(
        &mut self,
        failure: Failure,
        room: bool,
        config: &HealthConfig,
        now: Duration,
        rng: &mut SmallRng,
    ) -> Option<HealthChange> {
        self.last_activity = now;
        self.last_failure = Some(failure);
        self.consecutive_successes = 0;
        self.consecutive_failures += 1;
        match self.breaker {
            // Already out of rotation: a failed probe keeps it out another period.
            Breaker::Open { .. } => None,
            Breaker::HalfOpen => self.open(config, now, rng),
            Breaker::Closed => {
                let opens = failure.is_definitive()
                    || self.consecutive_failures >= config.failure_threshold;
                if opens && (room || failure.is_hard()) {
                    self.open(config, now, rng)
                } else {
                    self.kept_in += u32::from(opens);
                    self.set(HealthState::Suspicious)
                }
            }
        }
    }

    /// Records a success: a request that made progress or completed, a canary that passed.
    /// Only a canary closes a half-open breaker (`probe`): ordinary requests do not reach
    /// an open or half-open worker.
    pub fn succeed(
        &mut self,
        config: &HealthConfig,
        now: Duration,
        probe: bool,
    ) -> Option<HealthChange> {
        self.last_activity = now;
        self.consecutive_failures = 0;
        self.consecutive_successes += 1;
        match self.breaker {
            Breaker::Open { .. } => None,
            Breaker::HalfOpen if probe => {
                self.breaker = Breaker::Closed;
                self.consecutive_successes = 0;
                self.set(HealthState::Healthy)
            }
            Breaker::HalfOpen => None,
            Breaker::Closed => {
                if self.state == HealthState::Suspicious
                    && self.consecutive_successes >= config.success_threshold
                {
                    self.set(HealthState::Healthy)
                } else {
                    None
                }
            }
        }
    }

    /// Folds an observed gap between two streamed tokens into the average.
    pub fn observe_gap(&mut self, gap: Duration, config: &HealthConfig, now: Duration) {
        self.last_activity = now;
        let gap = gap.as_secs_f64();
        self.inter_token = Some(match self.inter_token {
            None => gap,
            Some(avg) => avg + config.latency_alpha * (gap - avg),
        });
    }

    /// The last time the worker was seen working (a token, a success, a canary answer),
    /// or when it was registered.
    pub fn last_activity(&self) -> Duration {
        self.last_activity
    }

    /// How long a stream on this worker may go without a token before it counts as stalled.
    pub fn stall_timeout(&self, config: &HealthConfig) -> Duration {
        let derived = self.inter_token.map_or(Duration::ZERO, |s| {
            Duration::try_from_secs_f64(s * config.stall_factor).unwrap_or(Duration::MAX)
        });
        derived.max(config.stall_floor)
    }

    /// Moves an open breaker whose time is up to half-open.
    pub fn tick(&mut self, now: Duration) {
        if let Breaker::Open { until } = self.breaker
            && now >= until
        {
            self.breaker = Breaker::HalfOpen;
        }
    }

    /// Whether a canary should be sent now.
    pub fn canary_due(&self, config: &HealthConfig, now: Duration) -> bool {
        if self.canary_in_flight || config.canary_interval.is_zero() {
            return false;
        }
        match self.breaker {
            Breaker::Open { .. } => false,
            Breaker::HalfOpen => true,
            Breaker::Closed => match self.last_canary {
                None => true,
                Some(last) => {
                    let interval = now >= last + config.canary_interval;
                    let idle = now >= self.last_activity + config.canary_idle
                        && now >= last + config.canary_idle;
                    // A suspicious worker is probed again at once: its next failures (or
                    // successes) should not wait for traffic or the timer.
                    let suspicious = self.state == HealthState::Suspicious
                        && now >= last + config.canary_timeout;
                    interval || idle || suspicious
                }
            },
        }
    }

    pub fn canary_started(&mut self, now: Duration) {
        self.canary_in_flight = true;
        self.last_canary = Some(now);
    }

    /// A canary that came back with nothing to judge (the worker was draining or
    /// overloaded).
    pub fn canary_skipped(&mut self) {
        self.canary_in_flight = false;
    }

    /// A canary's answer, judged against this worker's first answer and the fleet's
    /// `reference` (what most workers answered, if any other worker did); or its failure.
    pub fn canary_finished(
        &mut self,
        answer: Result<CanaryAnswer, Failure>,
        reference: Option<&[Token]>,
        room: bool,
        config: &HealthConfig,
        now: Duration,
        rng: &mut SmallRng,
    ) -> Option<HealthChange> {
        self.canary_in_flight = false;
        let CanaryAnswer {
            tokens,
            logprobs,
            latency,
        } = match answer {
            Ok(answer) => answer,
            Err(failure) => return self.fail(failure, room, config, now, rng),
        };
        let first = self
            .first_answer
            .get_or_insert_with(|| tokens.clone())
            .clone();
        self.last_answer = Some(tokens.clone());
        let wrong = tokens != first || reference.is_some_and(|r| r != tokens.as_slice());
        // Logits that drifted: the same tokens, their log probabilities moved.
        let drifted = !wrong
            && logprobs.len() == tokens.len()
            && match &self.first_logprobs {
                Some(first) => first.iter().zip(&logprobs).any(|(a, b)| {
                    // Not a number is never within it.
                    let moved = f64::from(a - b).abs();
                    moved.is_nan() || moved > config.canary_logprob_tolerance
                }),
                None => {
                    self.first_logprobs = Some(logprobs);
                    false
                }
            };
        if wrong || drifted {
            return self.fail(Failure::WrongOutput, room, config, now, rng);
        }
        if std::mem::take(&mut self.canary_under_load) {
            return self.succeed(config, now, true);
        }
        let seconds = latency.as_secs_f64();
        let spike = self.canary_samples >= 3
            && self
                .canary_latency
                .is_some_and(|avg| seconds > config.latency_spike_factor * avg);
        self.canary_latency = Some(match self.canary_latency {
            None => seconds,
            Some(avg) => avg + config.latency_alpha * (seconds - avg),
        });
        self.canary_samples += 1;
        if spike {
            return self.fail(Failure::LatencySpike, room, config, now, rng);
        }
        self.succeed(config, now, true)
    }
}

/// What a canary came back with.
#[derive(Debug, Clone, PartialEq)]
pub struct CanaryAnswer {
    pub tokens: Vec<Token>,
    /// Each token's log probability, from a worker that reports them (else empty).
    pub logprobs: Vec<f32>,
    pub latency: Duration,
}

impl CanaryAnswer {
    /// An answer without log probabilities.
    pub fn new(tokens: Vec<Token>, latency: Duration) -> Self {
        CanaryAnswer {
            tokens,
            logprobs: Vec::new(),
            latency,
        }
    }
}

/// The canary answer a strict majority of workers gave, if at least two agree (one worker
/// alone, or a split fleet, is no reference: a corrupt worker must not outvote a good one).
/// Each worker's last answer counts once.
pub fn majority<'a>(answers: impl Iterator<Item = &'a [Token]>) -> Option<(&'a [Token], usize)> {
    let answers: Vec<&[Token]> = answers.collect();
    answers.iter().find_map(|&candidate| {
        let votes = answers.iter().filter(|&&a| a == candidate).count();
        (votes >= 2 && 2 * votes > answers.len()).then_some((candidate, votes))
    })
}

#[cfg(test)]
mod tests;
