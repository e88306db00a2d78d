//! KV-aware routing, pure and synchronous: no I/O, no tasks, no clocks (time is an input).
//!
//! - [`routing`]: the routing core, the one state machine the servers and the simulator
//!   both drive: the worker registry (roles, health, draining, block-size agreement), each
//!   worker's cache view, admission, exclusion, and the decisions.
//! - [`flow`]: one request's life around those decisions (tries, exclusions, stalls,
//!   moves, the migration budget, media), decided once for the servers and the simulator.
//! - [`indexer`]: the radix-tree index of which worker caches which prefix, fed by KV
//!   events ([`indexer::Indexer`]), or by routing decisions for engines that publish none
//!   ([`indexer::approx::ApproxIndexer`]), and shared between threads by
//!   [`indexer::shared::SharedIndexer`].
//! - [`active`]: what each worker is busy with (blocks and prefill tokens of in-flight
//!   requests).
//! - [`policy`]: the selection policies, one file each, selectable by name.
//! - [`router`]: the [`Router`] tying active sequences and policies together, and its
//!   settings ([`RouterConfig`]).
//! - [`settings`]: what the settings share ([`InvalidConfig`]).
//!
//! Every settings struct here carries serde and is embedded as it is in the frontend's
//! configuration (`[frontend.router]`, `[frontend.admission]`, …), which the simulator
//! reads too.
//!
//! # Concurrency
//!
//! Everything here is a plain value owned by one caller. In a server, request handlers look
//! up the index while events stream in: [`indexer::shared::SharedIndexer`] keeps one tree
//! that one writer at a time changes and lookups read on the caller's thread without a lock
//! (atomic node fields, pages that never move); the routing core itself sits
//! behind a mutex (a decision takes microseconds), and is handed the index's matches.
//! `indexer-bench` (`cargo run --release -p switchyard-router --example indexer-bench`)
//! measures lookup latency while a writer thread ingests at full speed; `route-bench`
//! (`cargo bench -p switchyard-router --bench route`) the cost of one routing decision.

pub mod active;
pub mod flow;
pub mod indexer;
pub mod policy;
pub mod router;
pub mod routing;
pub mod settings;

pub use active::{ActiveSequences, WorkerLoad};
pub use flow::{GiveUp, Leave, MigrationConfig, RequestLife, Shell, TryFailure};
pub use indexer::{
    ApplyOutcome, EventGap, Indexer, IndexerConfig, IndexerStats, OverlapScores, WorkerSnapshot,
};
pub use policy::{Candidate, LatencyPolicyConfig, PolicyKind, RoutingOverrides, WorkerTiming};
pub use router::{CacheViewMode, RouteDecision, RouteError, RouteRequest, Router, RouterConfig};
pub use routing::admission::{Admission, AdmissionConfig, Rejection};
pub use routing::health::HealthState;
pub use routing::registry::{CacheView, JoinRefused, WorkerEntry, WorkerSpec};
pub use routing::{
    DisaggConfig, LocalReason, PairDecision, RouteQuery, RoutingConfig, RoutingCore, WorkerChanges,
};
pub use settings::InvalidConfig;
