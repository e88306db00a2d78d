//! Fetching a worker's KV state: the frontend's side of resynchronisation (the worker's
//! side serves `/v1/internal/kv/dump`).

use std::time::Duration;

use async_trait::async_trait;
use switchyard_router::WorkerSnapshot;
use thiserror::Error;

use super::secret::InvalidSecret;
use crate::discovery::WorkerInstance;
use crate::snapshot::{KvSnapshotSource, SnapshotError};

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

/// Why a [`KvDumpClient`] could not be built.
#[derive(Debug, Error)]
pub enum KvClientError {
    #[error(transparent)]
    Secret(#[from] InvalidSecret),
    #[error(transparent)]
    Build(reqwest::Error),
}

impl KvDumpClient {
    pub fn new() -> Result<Self, KvClientError> {
        Self::with_secret(None)
    }

    /// A client that presents the deployment's request-plane secret.
    pub fn with_secret(secret: Option<&str>) -> Result<Self, KvClientError> {
        let client = reqwest::Client::builder()
            .default_headers(super::secret::client_headers(secret)?)
            .connect_timeout(Duration::from_secs(2))
            .timeout(Duration::from_secs(10))
            .build()
            .map_err(KvClientError::Build)?;
        Ok(KvDumpClient { client })
    }
}

#[async_trait]
impl KvSnapshotSource for KvDumpClient {
    async fn snapshot(
        &self,
        worker: &WorkerInstance,
    ) -> Result<Vec<WorkerSnapshot>, SnapshotError> {
        let address = worker
            .address
            .as_deref()
            .ok_or(SnapshotError::NoAddress(worker.worker_id))?;
        let unreachable = |source| SnapshotError::Unreachable {
            address: address.to_owned(),
            source,
        };
        let response = self
            .client
            .get(format!("http://{address}{DUMP_PATH}"))
            .send()
            .await
            .map_err(unreachable)?;
        if !response.status().is_success() {
            return Err(SnapshotError::Status {
                address: address.to_owned(),
                status: response.status(),
            });
        }
        let bytes = response.bytes().await.map_err(unreachable)?;
        rmp_serde::from_slice(&bytes).map_err(|source| SnapshotError::InvalidDump {
            address: address.to_owned(),
            source,
        })
    }
}
