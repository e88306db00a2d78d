//! Discovery: which workers serve which model.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use switchyard_core::protocol::{ConstraintKind, ConstraintKinds};
use switchyard_core::{Modalities, WorkerId, WorkerRole};
use thiserror::Error;
use tokio::sync::watch;

/// What a worker announces about itself: who it is, where it listens, and what its engine
/// can do.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerInstance {
    pub worker_id: WorkerId,
    /// The model name clients ask for.
    pub model: String,
    #[serde(default)]
    pub role: WorkerRole,
    /// Tokens per KV block; every worker of a model that has blocks must agree. None for
    /// engines whose cache is not visible in blocks (an OpenAI-compatible upstream).
    #[serde(default)]
    pub block_size: Option<u32>,
    /// KV cache capacity, in blocks, when known.
    #[serde(default)]
    pub capacity_blocks: Option<u64>,
    /// Most requests the engine runs at once, when known.
    #[serde(default)]
    pub max_num_seqs: Option<u32>,
    /// Whether it publishes KV events; without them the router assumes routed prompts are
    /// cached (the approximate view).
    #[serde(default = "yes")]
    pub kv_events: bool,
    /// Data-parallel ranks (1 for a plain engine).
    pub dp_size: u32,
    /// Where its request plane listens, for network request planes.
    #[serde(default)]
    pub address: Option<String>,
    /// Random per start: a worker restarted under the same id is a new incarnation, whose
    /// cache and event ids start afresh.
    #[serde(default)]
    pub incarnation: u64,
    /// How its steps take time, for routers that predict latency.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub perf: Option<switchyard_core::perf::PerfModel>,
    /// Tokens one step computes at most.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_batched_tokens: Option<u32>,
    /// Its engine takes the prompt as text (an OpenAI-compatible upstream): requests to it
    /// carry the rendered prompt along with its tokens.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub prompt_text: bool,
    /// Its engine merges media embeddings into the sequences it prefills (a real model):
    /// requests with media carry the items' embeddings, or wait for them.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub media_embeddings: bool,
    /// What an encoder worker encodes (every modality unless it says).
    #[serde(default, skip_serializing_if = "Modalities::is_all")]
    pub modalities: Modalities,
    /// The constraint kinds its engine enforces (structured output).
    #[serde(default, skip_serializing_if = "ConstraintKinds::is_empty")]
    pub constraints: ConstraintKinds,
    /// The vocabularies it enforces constraints over, by name, when it enforces them over
    /// token ids (a frontend sends it constrained requests only in one of them); none for
    /// an engine that takes text.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub vocabularies: Vec<String>,
    /// Its engine reports each generated token's log probability and up to 20 likeliest
    /// alternatives' (requests asking for them go only to such workers).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub logprobs: bool,
    /// It reports a prompt's log probabilities too (a completion's `echo`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub prompt_logprobs: bool,
}

/// What a request needs of the worker it goes to, beyond serving its model.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Needs<'a> {
    /// A constraint of this kind enforced over the frontend's vocabulary (when it has a
    /// name workers know).
    pub constraint: Option<(ConstraintKind, Option<&'a str>)>,
    /// Log probabilities reported.
    pub logprobs: bool,
    /// The prompt's log probabilities reported.
    pub prompt_logprobs: bool,
}

impl Needs<'_> {
    /// Whether any worker will do.
    pub fn is_none(&self) -> bool {
        self.constraint.is_none() && !self.logprobs && !self.prompt_logprobs
    }
}

fn yes() -> bool {
    true
}

impl WorkerInstance {
    /// A plain worker of `model`: aggregated, publishing events, one rank, no address.
    pub fn new(worker_id: WorkerId, model: impl Into<String>) -> Self {
        WorkerInstance {
            worker_id,
            model: model.into(),
            role: WorkerRole::Aggregated,
            block_size: None,
            capacity_blocks: None,
            max_num_seqs: None,
            kv_events: true,
            dp_size: 1,
            address: None,
            incarnation: 0,
            perf: None,
            max_batched_tokens: None,
            prompt_text: false,
            media_embeddings: false,
            modalities: Modalities::default(),
            constraints: ConstraintKinds::NONE,
            vocabularies: Vec::new(),
            logprobs: false,
            prompt_logprobs: false,
        }
    }

    /// Whether its engine enforces `kind` for a frontend whose vocabulary is `vocabulary`.
    pub fn enforces(&self, kind: ConstraintKind, vocabulary: Option<&str>) -> bool {
        self.constraints.contains(kind)
            && (self.vocabularies.is_empty()
                || vocabulary.is_some_and(|v| self.vocabularies.iter().any(|w| w == v)))
    }

    /// Whether it meets everything `needs` asks.
    pub fn serves(&self, needs: &Needs<'_>) -> bool {
        needs
            .constraint
            .is_none_or(|(kind, vocabulary)| self.enforces(kind, vocabulary))
            && (self.logprobs || !needs.logprobs)
            && (self.prompt_logprobs || !needs.prompt_logprobs)
    }
}

/// Every registered worker, by id.
pub type Instances = Arc<BTreeMap<WorkerId, WorkerInstance>>;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DiscoveryError {
    #[error("worker {0} is already registered")]
    Duplicate(WorkerId),
    #[error("discovery is unavailable: {0}")]
    Unavailable(String),
}

/// Keeps a registration alive; dropping it (or [`Lease::revoke`]) deregisters the worker.
pub trait Lease: Send + Sync + std::fmt::Debug {
    fn worker_id(&self) -> WorkerId;
}

#[async_trait]
pub trait Discovery: Send + Sync + std::fmt::Debug {
    /// Registers a worker for as long as the returned lease lives.
    async fn register(&self, instance: WorkerInstance) -> Result<Box<dyn Lease>, DiscoveryError>;

    /// The current instances, updated on every change.
    fn watch(&self) -> watch::Receiver<Instances>;
}
