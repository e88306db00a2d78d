//! Replica sync: the frontends of a model tell each other which requests they routed where,
//! so each counts the others' requests in the workers' load and two frontends do not pile
//! onto the same worker.
//!
//! Every message is one frontend's events, in the order it made them. Besides each request's
//! routing, prefill and end, a frontend periodically announces the requests it still has
//! (`Alive`), which repairs lost messages and lets the others drop a frontend that died.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use switchyard_core::{RequestId, SequenceHash, WorkerKey};
use tokio::sync::mpsc;

use crate::events::EventPlaneError;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReplicaEvent {
    /// A request was sent to `worker`.
    Routed {
        request: RequestId,
        worker: WorkerKey,
        /// Prompt tokens the worker has to compute.
        prefill_tokens: u64,
        /// The prompt's full blocks.
        seq_hashes: Vec<SequenceHash>,
    },
    /// Its prompt is computed.
    PrefillDone { request: RequestId },
    /// It ended.
    Finished { request: RequestId },
    /// Every request the frontend has in flight now.
    Alive { requests: Vec<RequestId> },
    /// The frontend's traffic so far, for planners watching the planes (frontends ignore
    /// it). Published whether or not replica sync is on.
    Traffic(TrafficCounters),
}

/// A frontend's traffic since it started: cumulative counters (a reader diffs two of
/// them), and the requests waiting in its admission queue now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrafficCounters {
    /// Generation requests received (completions and chat completions, any outcome).
    pub requests: u64,
    /// Prompt tokens of those requests (refused ones included).
    pub input_tokens: u64,
    /// Prompt tokens found cached, of the requests served.
    pub cached_tokens: u64,
    pub output_tokens: u64,
    /// Requests finished (answered or failed after admission).
    pub finished: u64,
    /// Times to first token, summed in microseconds, and how many.
    pub ttft_us_sum: u64,
    pub ttft_count: u64,
    /// Inter-token latencies, summed in microseconds, and how many.
    pub itl_us_sum: u64,
    pub itl_count: u64,
    /// Requests held in the admission queue for want of a free engine (a level, not a
    /// count).
    pub queued: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaMessage {
    /// Which frontend (random per process).
    pub frontend: u64,
    pub events: Vec<ReplicaEvent>,
}

/// Bounded; a subscriber that falls behind loses messages (the periodic `Alive` repairs
/// what they would have said).
pub type ReplicaSubscription = mpsc::Receiver<ReplicaMessage>;

#[async_trait]
pub trait ReplicaPlane: Send + Sync + std::fmt::Debug {
    async fn publish_replica(
        &self,
        model: &str,
        message: &ReplicaMessage,
    ) -> Result<(), EventPlaneError>;

    /// Every later message about `model` (including this process's own).
    async fn subscribe_replicas(&self, model: &str)
    -> Result<ReplicaSubscription, EventPlaneError>;
}
