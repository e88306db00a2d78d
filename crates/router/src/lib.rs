//! KV-aware routing, pure and synchronous: no I/O, no tasks, no clocks (time is an input).
//!
//! - [`indexer`]: the radix-tree index of which worker caches which prefix, fed by KV
//!   events ([`indexer::Indexer`]), or by routing decisions for engines that publish none
//!   ([`indexer::approx::ApproxIndexer`]), and shared between threads by
//!   [`indexer::shared::SharedIndexer`].
//! - [`active`]: what each worker is busy with (blocks and prefill tokens of in-flight
//!   requests).
//! - [`policy`]: the selection policies (`kv` and the baselines), selectable by name.
//! - [`router`]: the [`Router`] tying active sequences and policies together.
//!
//! # Concurrency
//!
//! The indexer is a plain tree owned by one value. In a server, request handlers look up
//! while events stream in; [`indexer::shared::SharedIndexer`] puts the tree behind a
//! read-mostly lock: lookups run concurrently on the callers' threads, ingestion applies
//! events in bounded batches and hands the lock to waiting readers between batches, so a
//! lookup waits at most one bounded batch. `indexer-bench` measures lookup latency while a
//! writer thread ingests at full speed.

pub mod active;
pub mod indexer;
pub mod policy;
pub mod router;

pub use active::{ActiveSequences, WorkerLoad};
pub use indexer::{
    ApplyOutcome, EventGap, Indexer, IndexerConfig, IndexerStats, OverlapScores, WorkerSnapshot,
};
pub use policy::{Candidate, PolicyKind, RoutingOverrides};
pub use router::{RouteDecision, RouteError, RouteRequest, Router, RouterConfig};
