//! Fetching a worker's KV state: the frontend's side of resynchronisation (the worker's
//! side serves `/v1/internal/kv/dump`).

use std::time::Duration;

use async_trait::async_trait;
use switchyard_router::WorkerSnapshot;

use crate::discovery::WorkerInstance;
use crate::snapshot::KvSnapshotSource;

/// The worker's cache as MessagePack `Vec<WorkerSnapshot>`.
pub const DUMP_PATH: &str = "/v1/internal/kv/dump";
/// An index as JSON [`crate::snapshot::IndexView`], on workers and frontends alike, for
/// comparing them.
pub const INDEX_PATH: &str = "/v1/internal/kv/index";
/// The worker's recent events after `?since=ID`, as MessagePack `Vec<KvEvent>`; 410 Gone
/// when its ring no longer holds them all (then fetch the dump).
pub const EVENTS_PATH: &str = "/v1/internal/kv/events";

#[derive(Debug, Clone)]
pub struct KvDumpClient {
    client: reqwest::Client,
}

impl KvDumpClient {
    pub fn new() -> Result<Self, String> {
        Self::with_secret(None)
    }

    /// A client that presents the deployment's request-plane secret.
    pub fn with_secret(secret: Option<&str>) -> Result<Self, String> {
        let client = reqwest::Client::builder()
            .default_headers(super::secret::client_headers(secret)?)
            .connect_timeout(Duration::from_secs(2))
            .timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| e.to_string())?;
        Ok(KvDumpClient { client })
    }
}

#[async_trait]
impl KvSnapshotSource for KvDumpClient {
    async fn snapshot(&self, worker: &WorkerInstance) -> Result<Vec<WorkerSnapshot>, String> {
        let address = worker
            .address
            .as_deref()
            .ok_or_else(|| format!("{} has no address", worker.worker_id))?;
        let response = self
            .client
            .get(format!("http://{address}{DUMP_PATH}"))
            .send()
            .await
            .map_err(|e| format!("{address}: {e}"))?;
        if !response.status().is_success() {
            return Err(format!("{address} answered {}", response.status()));
        }
        let bytes = response
            .bytes()
            .await
            .map_err(|e| format!("{address}: {e}"))?;
        rmp_serde::from_slice(&bytes).map_err(|e| format!("{address}: invalid dump: {e}"))
    }
}
