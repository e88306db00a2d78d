//! The routing core's side of health: what requests and canaries show of the workers
//! (their health, how long their streams may go silent, the fleet's degradation level),
//! fed to each worker's state machine ([`super::WorkerHealth`]).

use std::time::Duration;

use switchyard_core::{Token, WorkerId};

use super::{self as health, Failure, HealthChange, HealthConfig, HealthState};
use crate::routing::{RoutingCore, degradation};

impl RoutingCore {
    /// Sets a worker's health state by hand (an operator's decision, a test). Returns
    /// whether it is registered.
    pub fn set_health(&mut self, id: WorkerId, health: HealthState) -> bool {
        self.registry
            .get_mut(id)
            .map(|e| e.health.state = health)
            .is_some()
    }

    pub fn health_config(&self) -> &HealthConfig {
        &self.config.health
    }

    /// A failure of the worker's own making (see [`health`]). Returns the change of state,
    /// if any: a worker that became unhealthy must have its in-flight requests moved.
    pub fn observe_failure(
        &mut self,
        worker: WorkerId,
        failure: Failure,
        now: Duration,
    ) -> Option<HealthChange> {
        self.tick(now);
        let config = self.config.health;
        let room = self.room_to_take_out(worker);
        self.registry
            .get_mut(worker)?
            .health
            .fail(failure, room, &config, now, &mut self.rng)
    }

    /// Whether soft failures may take `worker` out: fewer than
    /// `health.max_unhealthy_fraction` (at least one) of the registered workers in its role
    /// (the pool its load would move to) are out already.
    pub(super) fn room_to_take_out(&self, worker: WorkerId) -> bool {
        let Some(role) = self.registry.get(worker).map(|e| e.spec.role) else {
            return true;
        };
        let (mut fleet, mut out) = (0usize, 0usize);
        for entry in self
            .registry
            .iter()
            .filter(|e| !e.departed && e.spec.role == role)
        {
            fleet += 1;
            out += usize::from(entry.health.state == HealthState::Unhealthy);
        }
        let allowed = (fleet as f64 * self.config.health.max_unhealthy_fraction).floor() as usize;
        out < allowed.max(1)
    }

    /// A request that completed on the worker.
    pub fn observe_success(&mut self, worker: WorkerId, now: Duration) -> Option<HealthChange> {
        self.tick(now);
        let config = self.config.health;
        self.registry
            .get_mut(worker)?
            .health
            .succeed(&config, now, false)
    }

    /// A gap between two tokens streamed from the worker.
    pub fn observe_gap(&mut self, worker: WorkerId, gap: Duration, now: Duration) {
        self.tick(now);
        let config = self.config.health;
        if let Some(entry) = self.registry.get_mut(worker) {
            entry.health.observe_gap(gap, &config, now);
        }
    }

    /// How long a stream on `worker` may go without a token before it counts as stalled.
    pub fn stall_timeout(&self, worker: WorkerId) -> Duration {
        self.registry
            .get(worker)
            .map_or(self.config.health.stall_floor, |e| {
                e.health.stall_timeout(&self.config.health)
            })
    }

    /// How much longer `worker` is predicted to be busy with the prefill routed to it (the
    /// longest of its ranks): a stream there may wait that long beyond its stall timeout.
    pub fn queued_prefill_time(&self, worker: WorkerId, now: Duration) -> Duration {
        self.registry.get(worker).map_or(Duration::ZERO, |e| {
            e.spec
                .keys()
                .map(|key| self.router.queued_prefill_time(key, now))
                .max()
                .unwrap_or_default()
        })
    }

    /// Moves open breakers whose time is up to half-open; returns the workers due a canary
    /// now, marked as being checked.
    pub fn due_canaries(&mut self, now: Duration) -> Vec<WorkerId> {
        self.tick(now);
        let config = self.config.health;
        let mut due = Vec::new();
        for id in self.registry.iter().map(|e| e.spec.id).collect::<Vec<_>>() {
            let loaded = self.has_requests(id);
            if let Some(entry) = self.registry.get_mut(id) {
                if entry.departed {
                    continue;
                }
                entry.health.tick(now);
                if entry.health.canary_due(&config, now) {
                    entry.health.canary_started(now);
                    entry.health.canary_under_load = loaded;
                    due.push(id);
                }
            }
        }
        due
    }

    /// A canary's answer (its tokens and latency) or its failure. The answer is judged
    /// against the worker's first answer and against what most other workers answered.
    pub fn canary_finished(
        &mut self,
        worker: WorkerId,
        answer: Result<health::CanaryAnswer, Failure>,
        now: Duration,
    ) -> Option<HealthChange> {
        let reference: Option<Vec<Token>> = {
            let others = self
                .registry
                .iter()
                .filter(|e| e.spec.id != worker && e.health.state != HealthState::Unhealthy)
                .filter_map(|e| e.health.last_answer.as_deref());
            health::majority(others).map(|(answer, _)| answer.to_vec())
        };
        let config = self.config.health;
        let loaded = self.has_requests(worker);
        let room = self.room_to_take_out(worker);
        let entry = self.registry.get_mut(worker)?;
        entry.health.canary_under_load |= loaded;
        entry.health.canary_finished(
            answer,
            reference.as_deref(),
            room,
            &config,
            now,
            &mut self.rng,
        )
    }

    /// Whether requests routed to `worker` are in flight there.
    pub(super) fn has_requests(&self, worker: WorkerId) -> bool {
        self.registry
            .get(worker)
            .is_some_and(|e| e.spec.keys().any(|key| self.router.load(key).requests > 0))
    }

    /// A canary that came back with nothing to judge.
    pub fn canary_skipped(&mut self, worker: WorkerId) {
        if let Some(entry) = self.registry.get_mut(worker) {
            entry.health.canary_skipped();
        }
    }

    /// The degradation level now (0 normal … 4 reject new requests), from the capacity
    /// of the healthy workers against what the fleet had, and latency against the SLO.
    pub fn degradation_level(&mut self, now: Duration) -> u8 {
        self.tick(now);
        let (healthy, nominal) = self.capacities();
        self.degradation.level(healthy, nominal, now)
    }

    /// The degradation level's inputs, if the level changed since this was last asked.
    pub fn take_degradation_change(&mut self) -> Option<degradation::DegradationState> {
        self.degradation.take_change()
    }

    /// A request's time to first token, for the SLO side of degradation.
    pub fn observe_ttft(&mut self, ttft: Duration) {
        self.degradation.observe_ttft(ttft);
    }

    /// Capacity of the serving workers that are healthy (suspicious ones at their weight),
    /// and of every serving worker registered and not leaving.
    pub(super) fn capacities(&self) -> (f64, f64) {
        let weight = self.config.health.suspicious_weight;
        let mut healthy = 0.0;
        let mut nominal = 0.0;
        for e in self.registry.iter() {
            if !e.spec.role.serves_generation() || e.departed || e.draining {
                continue;
            }
            let capacity = degradation::capacity(&e.spec);
            nominal += capacity;
            healthy += capacity
                * match e.health.state {
                    HealthState::Healthy => 1.0,
                    HealthState::Suspicious => weight,
                    HealthState::Unhealthy => 0.0,
                };
        }
        (healthy, nominal)
    }
}
