//! The planner's virtual connector: the fleet's metrics go to the same [`Planner`] the
//! servers' planner runs, at its metric interval in virtual time, and its replica counts
//! become workers started (after a cold start) or drained.

use std::collections::BTreeMap;
use std::time::Duration;

use switchyard_core::WorkerRole;
use switchyard_mocker::MockEngine;
use switchyard_planner::config::GpusPerEngine;
use switchyard_planner::{Decision, Observation, Planner, TrafficSample, WorkerSample};

use super::{Event, Fleet, SimConfig, SimError, Slot, StepOutput, worker_key};
use switchyard_router::flow::Leave;

use crate::faults::FaultKind;
use crate::scaling::{PlannerReport, PlannerSim};

/// The planner and what it did.
#[derive(Debug)]
pub(super) struct Scaling {
    planner: Planner,
    cold_start: Duration,
    metric_interval: Duration,
    gpus_per_engine: GpusPerEngine,
    /// Traffic since the last pull.
    pub(super) traffic: TrafficSample,
    decisions: Vec<Decision>,
    worker_seconds: f64,
    gpu_seconds: f64,
    accounted_at: Duration,
    peak: u32,
    added: u32,
    removed: u32,
}

impl Scaling {
    pub(super) fn new(sim: &PlannerSim, config: &SimConfig) -> Result<Scaling, SimError> {
        let initial: BTreeMap<WorkerRole, u32> = match &config.disagg {
            Some(d) => [
                (WorkerRole::Prefill, d.prefill),
                (WorkerRole::Decode, config.workers - d.prefill),
            ]
            .into_iter()
            .collect(),
            None => [(WorkerRole::Aggregated, config.workers)]
                .into_iter()
                .collect(),
        };
        let planner = Planner::new(
            sim.config.clone(),
            &initial,
            config.perf_of(0).clone(),
            Duration::ZERO,
        )?;
        Ok(Scaling {
            planner,
            cold_start: sim.cold_start,
            metric_interval: sim.config.metric_interval,
            gpus_per_engine: sim.config.budget.gpus_per_engine,
            traffic: TrafficSample::default(),
            decisions: Vec::new(),
            worker_seconds: 0.0,
            gpu_seconds: 0.0,
            accounted_at: Duration::ZERO,
            peak: config.workers,
            added: 0,
            removed: 0,
        })
    }
}

impl Fleet<'_> {
    /// Workers that cost GPU time: starting, up, draining, or failed (the machine is still
    /// there).
    fn live_workers(&self) -> u32 {
        self.slots.iter().filter(|s| **s != Slot::Retired).count() as u32
    }

    /// Adds the GPU time spent since the last change of the fleet.
    fn account(&mut self) {
        let live = self.live_workers();
        let now = self.now;
        if let Some(s) = &mut self.scaling {
            let gpus: u32 = self
                .slots
                .iter()
                .zip(&self.roles)
                .filter(|(slot, _)| **slot != Slot::Retired)
                .map(|(_, &role)| s.gpus_per_engine.of(role))
                .sum();
            let elapsed = now.saturating_sub(s.accounted_at).as_secs_f64();
            s.worker_seconds += f64::from(live) * elapsed;
            s.gpu_seconds += f64::from(gpus) * elapsed;
            s.accounted_at = now;
            s.peak = s.peak.max(live);
        }
    }

    /// Whether any request is still to arrive or to finish.
    fn work_remains(&self) -> bool {
        let r = &self.report;
        r.completed + r.rejected + r.failed < r.requests
    }

    pub(super) fn planner_pull(&mut self) {
        let Some(scaling) = &mut self.scaling else {
            return;
        };
        let traffic = std::mem::take(&mut scaling.traffic);
        let workers = self
            .slots
            .iter()
            .zip(&self.engines)
            .zip(&self.roles)
            .filter(|((slot, _), _)| **slot == Slot::Up)
            .map(|((_, engine), &role)| {
                let load = engine.load();
                WorkerSample {
                    role,
                    kv_usage: load.kv_usage(),
                    waiting: load.waiting,
                    running: load.running,
                }
            })
            .collect();
        let mut observation = Observation { workers, traffic };
        // The admission queue, as `switchyard planner` reads it from a frontend.
        observation.add_queued(u32::try_from(self.core.queued()).unwrap_or(u32::MAX));
        let tick = scaling.planner.tick(self.now, &observation);
        if let Some(decision) = tick.decision {
            scaling.decisions.push(decision);
        }
        let next = self.now + scaling.metric_interval;
        for action in tick.actions {
            self.scale_to(action.role, action.replicas);
        }
        if self.work_remains() {
            self.schedule(next, Event::PlannerPull);
        }
    }

    /// Slots of workers of `role` in a state `wanted` accepts.
    fn slots_of(&self, role: WorkerRole, wanted: impl Fn(Slot) -> bool) -> Vec<usize> {
        (0..self.slots.len())
            .filter(|&i| self.roles[i] == role && wanted(self.slots[i]))
            .collect()
    }

    /// Starts or drains workers of `role` until `target` are up or starting.
    fn scale_to(&mut self, role: WorkerRole, target: u32) {
        self.account();
        let mut current = self
            .slots_of(role, |s| matches!(s, Slot::Starting | Slot::Up))
            .len() as u32;
        while current < target {
            self.start_worker(role);
            current += 1;
        }
        while current > target {
            // A worker still starting goes first (the newest); else the least busy one.
            let starting = self.slots_of(role, |s| s == Slot::Starting);
            let victim = if let Some(&slot) = starting.last() {
                self.slots[slot] = Slot::Retired;
                self.scaled_down();
                current -= 1;
                continue;
            } else {
                self.slots_of(role, |s| s == Slot::Up)
                    .into_iter()
                    .min_by_key(|&i| {
                        let load = self.engines[i].load();
                        (load.running + load.waiting, std::cmp::Reverse(i))
                    })
            };
            let Some(slot) = victim else {
                break;
            };
            self.drain(slot);
            current -= 1;
        }
    }

    fn scaled_down(&mut self) {
        if let Some(s) = &mut self.scaling {
            s.removed += 1;
        }
    }

    fn start_worker(&mut self, role: WorkerRole) {
        let slot = self.engines.len();
        self.roles.push(role);
        let key = worker_key(slot as u32);
        let Ok(engine) = MockEngine::new(
            key,
            self.config.engine,
            self.config.perf_of(slot).clone(),
            self.config.seed,
        ) else {
            unreachable!("the engine arguments were accepted at the start");
        };
        self.engines.push(engine);
        self.outputs.push(StepOutput::default());
        self.step_end.push(None);
        self.slots.push(Slot::Starting);
        self.accepted.push(false);
        self.per_worker_requests.push(0);
        self.per_worker_prefill.push(0);
        let cold_start = self
            .scaling
            .as_ref()
            .map_or(Duration::ZERO, |s| s.cold_start);
        if let Some(s) = &mut self.scaling {
            s.added += 1;
        }
        self.schedule(self.now + cold_start, Event::WorkerReady(slot as u32));
    }

    pub(super) fn worker_ready(&mut self, slot: usize) {
        if self.slots[slot] == Slot::Starting {
            self.register(slot);
        }
    }

    /// Takes the worker out of routing; it leaves once its requests have finished.
    fn drain(&mut self, slot: usize) {
        self.core
            .set_draining(worker_key(slot as u32).worker_id, true);
        self.slots[slot] = Slot::Draining;
        self.scaled_down();
        // Requests bound to it that its engine does not hold yet (prefilling on a prefill
        // worker, or their KV on its way) are work too: it retires after them.
        let key = worker_key(slot as u32);
        let bound = self.core.load(key).requests > 0;
        if self.step_end[slot].is_none() && !self.engines[slot].has_work() && !bound {
            self.retire(slot);
        }
    }

    /// A drained worker leaves.
    pub(super) fn retire(&mut self, slot: usize) {
        self.account();
        // Anything still bound to it (a request whose KV is on its way there) goes
        // elsewhere, as from a drained worker.
        let caught = self.unregister(slot);
        self.slots[slot] = Slot::Retired;
        let now = self.now;
        let worker = worker_key(slot as u32).worker_id;
        for id in caught {
            let index = self.prefill_ids.remove(&id).unwrap_or(id.0 as u32);
            self.move_request(index, worker, Leave::Cancelled, FaultKind::Drain, now);
        }
    }

    pub(super) fn planner_report(&mut self, end: Duration) -> PlannerReport {
        self.now = self.now.max(end);
        self.account();
        let final_workers = self
            .slots
            .iter()
            .filter(|s| matches!(s, Slot::Up | Slot::Starting))
            .count() as u32;
        let Some(s) = self.scaling.take() else {
            return PlannerReport::default();
        };
        let span = end.as_secs_f64().max(f64::MIN_POSITIVE);
        PlannerReport {
            gpu_hours: s.gpu_seconds / 3600.0,
            mean_workers: s.worker_seconds / span,
            peak_workers: s.peak,
            final_workers,
            workers_added: s.added,
            workers_removed: s.removed,
            decisions: s.decisions,
        }
    }
}
