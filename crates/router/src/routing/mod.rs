//! The routing core: everything the router decides about the fleet, as one state machine
//! with no I/O and no clock (`now` is an argument). The servers' async shell and the
//! simulator drive this same code, so what the simulator says about routing is true of the
//! servers. One request's life around these decisions is [`crate::flow`].
//!
//! It holds, one file per responsibility:
//! - [`fleet`]: workers joining, leaving, draining; the [`registry`] of their roles,
//!   health, block-size agreement; which cache view each is seen through;
//! - [`health`]: each worker's health state machine, and (in `health/in_core.rs`) what
//!   requests and canaries show of the workers, stall timeouts, and the fleet's
//!   [`degradation`] level;
//! - [`admission`]: the priority queue in front of routing, and (in
//!   `admission/in_core.rs`) when the fleet is busy;
//! - [`route`]: the decisions: a worker, a (prefill, decode) pair, joint media routing;
//! - [`lifecycle`]: what a routed request does to its worker's load until it ends, and the
//!   fleet-wide migration budget;
//! - [`encoders`]: the encoder pool model.
//!
//! A request's records: [`RoutingCore::admit`] (admitted, queued or refused); if queued,
//! released later by [`RoutingCore::next_admitted`]; [`RoutingCore::route_pair`] picks its
//! worker(s) and records them; [`RoutingCore::prefill_done`] at its first token;
//! [`RoutingCore::finish`] however it ends. After anything that may free capacity (a
//! request ending, a worker joining) the caller asks `next_admitted` again.

pub mod admission;
pub mod degradation;
pub mod encoders;
pub mod fleet;
pub mod health;
pub mod lifecycle;
pub mod registry;
pub mod route;

use std::time::Duration;

use rand::SeedableRng;
use rand::rngs::SmallRng;
use serde::{Deserialize, Serialize};
use switchyard_core::WorkerId;

use crate::flow::{MigrationBudget, MigrationConfig};
use crate::indexer::approx::ApproxIndexer;
use crate::router::{Router, RouterConfig};
use admission::{AdmissionConfig, AdmissionQueue};
use degradation::{Degradation, DegradationConfig};
use health::HealthConfig;
use registry::{JoinRefused, Registry, WorkerEntry};
pub use route::{DisaggConfig, LocalReason, PairDecision, RouteQuery};

/// Settings of the routing core: the frontend's `[frontend.router]`, `[frontend.admission]`,
/// `[frontend.health]`, `[frontend.degradation]`, `[frontend.disagg]` and
/// `[frontend.migration]`, each as it is.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RoutingConfig {
    /// Policies, seed, request TTL, cache views.
    pub router: RouterConfig,
    pub admission: AdmissionConfig,
    pub health: HealthConfig,
    pub degradation: DegradationConfig,
    pub disagg: DisaggConfig,
    pub migration: MigrationConfig,
}

impl RoutingConfig {
    /// Checks the ranges serde cannot; names the key.
    pub fn validate(&self) -> Result<(), crate::InvalidConfig> {
        self.router.validate()?;
        self.admission.validate()?;
        self.health.validate()?;
        self.degradation.validate()?;
        self.disagg.validate()?;
        self.migration.validate()
    }
}

/// How the registry changed to match discovery.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkerChanges {
    pub joined: Vec<WorkerId>,
    /// Workers that left (or restarted as a new incarnation); their cache entries are
    /// stale. Those still running requests drain first.
    pub left: Vec<WorkerId>,
    pub refused: Vec<JoinRefused>,
}

/// The routing core. See the module docs.
#[derive(Debug)]
pub struct RoutingCore {
    config: RoutingConfig,
    registry: Registry,
    router: Router,
    approx: ApproxIndexer,
    approx_workers: usize,
    admission: AdmissionQueue,
    degradation: Degradation,
    /// The fleet-wide budget of moves (see [`MigrationConfig`]).
    migrations: MigrationBudget,
    /// The latest time any call brought, for what comes without one (workers joining).
    now: Duration,
    /// Breaker jitter and the weighting of suspicious workers (seeded: runs repeat).
    rng: SmallRng,
}

impl RoutingCore {
    pub fn new(config: RoutingConfig) -> Self {
        RoutingCore {
            config,
            registry: Registry::default(),
            router: Router::new(config.router),
            approx: ApproxIndexer::new(config.router.approx),
            approx_workers: 0,
            admission: AdmissionQueue::new(config.admission),
            degradation: Degradation::new(config.degradation),
            migrations: MigrationBudget::new(&config.migration),
            now: Duration::ZERO,
            rng: SmallRng::seed_from_u64(config.router.seed ^ 0x6865_616c_7468),
        }
    }

    /// Moves the core's notion of now forward (every call that takes `now` does).
    pub fn tick(&mut self, now: Duration) {
        self.now = self.now.max(now);
    }

    pub fn config(&self) -> &RoutingConfig {
        &self.config
    }

    /// Tokens per block prompts are cut into: the workers' agreed size, or the configured
    /// one while no worker has announced any.
    pub fn block_size(&self) -> u32 {
        self.registry
            .block_size()
            .unwrap_or(self.config.router.block_size)
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    pub fn router(&self) -> &Router {
        &self.router
    }

    pub fn worker(&self, id: WorkerId) -> Option<&WorkerEntry> {
        self.registry.get(id)
    }

    /// Workers that may take new requests.
    pub fn routable_workers(&self) -> usize {
        self.registry.iter().filter(|e| e.serving()).count()
    }
}
