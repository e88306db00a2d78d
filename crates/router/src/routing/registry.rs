//! The worker registry: which workers the router may use, and in what state.
//!
//! Each worker is registered from what it announces ([`WorkerSpec`]: role, block size,
//! capacity, whether it publishes KV events) and carries what the router learns about it:
//! a health state and a draining flag. A draining worker gets no new requests, but the
//! requests it still runs keep counting in its load until they end; a worker that leaves
//! discovery while requests are in flight drains until they are done.
//!
//! Block sizes must agree: the first worker that announces one sets it for the model (the
//! prompt is hashed in blocks of that size), a worker announcing another is refused, and
//! once no worker announcing a size is left the next one may bring a new size. Workers
//! that announce none (an engine whose cache is not visible in blocks) fit any.

use std::collections::BTreeMap;

use serde::Serialize;
use switchyard_core::{WorkerId, WorkerKey, WorkerRole};
use thiserror::Error;

use super::health::{HealthState, WorkerHealth};
use crate::router::CacheViewMode;

/// What a worker announces about itself, as far as routing is concerned.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerSpec {
    pub id: WorkerId,
    /// Random per start: a worker restarted under the same id is a new incarnation.
    pub incarnation: u64,
    pub role: WorkerRole,
    /// Data-parallel ranks (each one its own cache and load).
    pub dp_size: u32,
    pub block_size: Option<u32>,
    pub capacity_blocks: Option<u64>,
    pub max_num_seqs: Option<u32>,
    /// Whether it publishes KV events.
    pub kv_events: bool,
    /// How its steps take time (its performance model and step budget), if it says.
    pub timing: Option<crate::policy::WorkerTiming>,
}

impl WorkerSpec {
    /// An aggregated worker with one rank, publishing events.
    pub fn new(id: WorkerId, block_size: u32) -> Self {
        WorkerSpec {
            id,
            incarnation: 0,
            role: WorkerRole::Aggregated,
            dp_size: 1,
            block_size: Some(block_size),
            capacity_blocks: None,
            max_num_seqs: None,
            kv_events: true,
            timing: None,
        }
    }

    /// The worker's ranks.
    pub fn keys(&self) -> impl Iterator<Item = WorkerKey> + use<> {
        let id = self.id;
        (0..self.dp_size.max(1)).map(move |dp_rank| WorkerKey {
            worker_id: id,
            dp_rank,
        })
    }
}

/// Where the router's knowledge of a worker's cache comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CacheView {
    /// The worker's KV events.
    Events,
    /// Prompts routed to it, assumed cached for a while (it publishes no events).
    Approximate,
}

impl CacheViewMode {
    pub fn view_for(self, spec: &WorkerSpec) -> CacheView {
        match self {
            CacheViewMode::Auto if spec.kv_events => CacheView::Events,
            _ => CacheView::Approximate,
        }
    }
}

/// A registered worker.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorkerEntry {
    #[serde(skip)]
    pub spec: WorkerSpec,
    pub view: CacheView,
    /// Its health state, breaker and the measures behind them.
    pub health: WorkerHealth,
    /// Takes no new requests; its in-flight ones still count.
    pub draining: bool,
    /// It left discovery and is kept only until its in-flight requests end.
    pub departed: bool,
}

impl WorkerEntry {
    /// Whether new requests may go to it.
    pub fn routable(&self) -> bool {
        !self.draining && !self.departed && self.health.state != HealthState::Unhealthy
    }

    /// Its state as operators see it: `dead` (it left discovery; kept until its requests
    /// end), `draining` (shutting down), else its health state.
    pub fn status(&self) -> &'static str {
        if self.departed {
            "dead"
        } else if self.draining {
            "draining"
        } else {
            self.health.state.name()
        }
    }

    /// Whether it is a worker that takes generation requests and may take one now.
    pub fn serving(&self) -> bool {
        self.routable() && self.spec.role.serves_generation()
    }

    /// Whether it takes generation requests now or may again without leaving: serving, or
    /// out of rotation only for its health (its breaker half-opens).
    pub fn may_serve(&self) -> bool {
        !self.draining && !self.departed && self.spec.role.serves_generation()
    }
}

/// Why a worker was not registered.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum JoinRefused {
    #[error("worker {worker} uses {got}-token blocks but the model's workers use {expected}")]
    BlockSize {
        worker: WorkerId,
        expected: u32,
        got: u32,
    },
    #[error("worker {0} is already registered")]
    Duplicate(WorkerId),
}

/// The registered workers.
#[derive(Debug, Default)]
pub struct Registry {
    entries: BTreeMap<WorkerId, WorkerEntry>,
    block_size: Option<u32>,
}

impl Registry {
    pub fn get(&self, id: WorkerId) -> Option<&WorkerEntry> {
        self.entries.get(&id)
    }

    pub fn get_mut(&mut self, id: WorkerId) -> Option<&mut WorkerEntry> {
        self.entries.get_mut(&id)
    }

    pub fn iter(&self) -> impl Iterator<Item = &WorkerEntry> + '_ {
        self.entries.values()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The agreed block size, if any worker announced one.
    pub fn block_size(&self) -> Option<u32> {
        self.block_size
    }

    /// Registers a worker (checking its block size against the model's).
    pub fn add(
        &mut self,
        spec: WorkerSpec,
        mode: CacheViewMode,
        now: std::time::Duration,
    ) -> Result<(), JoinRefused> {
        if self.entries.contains_key(&spec.id) {
            return Err(JoinRefused::Duplicate(spec.id));
        }
        if let (Some(expected), Some(got)) = (self.block_size, spec.block_size)
            && expected != got
        {
            return Err(JoinRefused::BlockSize {
                worker: spec.id,
                expected,
                got,
            });
        }
        if self.block_size.is_none() {
            self.block_size = spec.block_size;
        }
        let view = mode.view_for(&spec);
        self.entries.insert(
            spec.id,
            WorkerEntry {
                spec,
                view,
                health: WorkerHealth::new(now),
                draining: false,
                departed: false,
            },
        );
        Ok(())
    }

    /// Unregisters a worker for good.
    pub fn remove(&mut self, id: WorkerId) -> Option<WorkerEntry> {
        let entry = self.entries.remove(&id)?;
        if !self.entries.values().any(|e| e.spec.block_size.is_some()) {
            self.block_size = None;
        }
        Some(entry)
    }
}
