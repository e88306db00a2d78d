//! Discovery over etcd: each worker's instance is a key under the namespace's prefix,
//! attached to a lease the worker keeps alive. A worker that dies stops renewing; when its
//! lease expires etcd deletes the key and every watcher sees it leave.
//!
//! Both sides survive etcd restarts: watchers re-list and watch again; a registration whose
//! lease was lost registers again under a new lease.
//!
//! [`client`] speaks etcd's v3 API through its JSON gateway.

pub mod client;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use client::{EtcdClient, EtcdError, LeaseId, WatchEvent};
use futures::StreamExt;
use switchyard_core::WorkerId;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::token;
use crate::discovery::{Discovery, DiscoveryError, Instances, Lease, WorkerInstance};

#[derive(Debug, Clone)]
pub struct EtcdDiscovery {
    endpoint: String,
    prefix: String,
    ttl: Duration,
    instances: Arc<watch::Sender<Instances>>,
    /// Whether the watch task runs: only processes that look at the workers need it.
    following: Arc<std::sync::atomic::AtomicBool>,
    tracker: TaskTracker,
    cancel: CancellationToken,
}

/// Waits `delay`, or returns `false` if cancelled first.
async fn pause(cancel: &CancellationToken, delay: Duration) -> bool {
    tokio::select! {
        () = cancel.cancelled() => false,
        () = tokio::time::sleep(delay) => true,
    }
}

impl EtcdDiscovery {
    /// Discovery through `etcd://host:port` under `namespace`. Registrations use leases of
    /// `ttl`. Returns at once; the first [`Discovery::watch`] starts following the
    /// namespace's workers in the background (connecting, and reconnecting, as needed).
    pub fn start(
        url: &str,
        namespace: &str,
        ttl: Duration,
        tracker: TaskTracker,
        cancel: CancellationToken,
    ) -> Self {
        let endpoint = url.strip_prefix("etcd://").unwrap_or(url).to_string();
        EtcdDiscovery {
            endpoint,
            prefix: format!("/switchyard/{}/instances/", token(namespace)),
            ttl: ttl.max(Duration::from_secs(1)),
            instances: Arc::new(watch::Sender::new(Arc::new(BTreeMap::new()))),
            following: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            tracker,
            cancel,
        }
    }

    fn key(&self, id: WorkerId) -> String {
        format!("{}{:016x}", self.prefix, id.0)
    }

    /// Lists the prefix, then watches it from the listed revision; on any failure starts
    /// over.
    async fn follow(self) {
        let mut backoff = Duration::from_millis(100);
        loop {
            match self.follow_once().await {
                Ok(()) => return,
                Err(e) => tracing::warn!(error = %e, "etcd watch interrupted; retrying"),
            }
            if !pause(&self.cancel, backoff).await {
                return;
            }
            backoff = (backoff * 2).min(Duration::from_secs(2));
        }
    }

    async fn follow_once(&self) -> Result<(), EtcdError> {
        let client = EtcdClient::new(&self.endpoint)?;
        let (revision, listed) = client.list(self.prefix.as_bytes()).await?;
        let mut by_key: HashMap<Vec<u8>, WorkerInstance> = HashMap::new();
        for kv in listed {
            if let Some(instance) = decode(&kv.key, &kv.value) {
                by_key.insert(kv.key, instance);
            }
        }
        self.publish(&by_key);
        let mut stream = client.watch(self.prefix.as_bytes(), revision + 1).await?;
        loop {
            let message = tokio::select! {
                () = self.cancel.cancelled() => return Ok(()),
                message = stream.next() => message,
            };
            let events = match message {
                Some(events) => events?,
                None => return Err(EtcdError::WatchEnded("the watch stream ended".into())),
            };
            for event in events {
                match event {
                    WatchEvent::Put(kv) => match decode(&kv.key, &kv.value) {
                        Some(instance) => {
                            by_key.insert(kv.key, instance);
                        }
                        // An unreadable record replaces whatever the key held.
                        None => {
                            by_key.remove(&kv.key);
                        }
                    },
                    WatchEvent::Delete { key } => {
                        by_key.remove(&key);
                    }
                }
            }
            self.publish(&by_key);
        }
    }

    fn publish(&self, by_key: &HashMap<Vec<u8>, WorkerInstance>) {
        let map: BTreeMap<WorkerId, WorkerInstance> =
            by_key.values().map(|i| (i.worker_id, i.clone())).collect();
        self.instances.send_if_modified(|current| {
            if **current == map {
                return false;
            }
            *current = Arc::new(map);
            true
        });
    }
}

/// A worker record, or a warning naming the key when it cannot be read (a worker of another
/// version, or something else written under the prefix).
fn decode(key: &[u8], value: &[u8]) -> Option<WorkerInstance> {
    match serde_json::from_slice::<WorkerInstance>(value) {
        Ok(instance) => Some(instance),
        Err(e) => {
            tracing::warn!(
                key = %String::from_utf8_lossy(key),
                error = %e,
                "ignoring a discovery record that cannot be decoded"
            );
            None
        }
    }
}

#[derive(Debug)]
struct EtcdLease {
    worker_id: WorkerId,
    stop: CancellationToken,
}

impl Lease for EtcdLease {
    fn worker_id(&self) -> WorkerId {
        self.worker_id
    }
}

impl Drop for EtcdLease {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

#[async_trait]
impl Discovery for EtcdDiscovery {
    /// Registers once (so a misconfigured endpoint fails loudly), then keeps the lease
    /// alive, registering again whenever the lease is lost. Dropping the lease revokes it.
    async fn register(&self, instance: WorkerInstance) -> Result<Box<dyn Lease>, DiscoveryError> {
        let key = self.key(instance.worker_id);
        let value = serde_json::to_vec(&instance)
            .map_err(|e| DiscoveryError::Unavailable(e.to_string()))?;
        let client = EtcdClient::new(&self.endpoint)
            .map_err(|e| DiscoveryError::Unavailable(e.to_string()))?;
        let first = grant_and_put(&client, &key, &value, self.ttl)
            .await
            .map_err(|e| DiscoveryError::Unavailable(format!("cannot register with etcd: {e}")))?;
        let stop = self.cancel.child_token();
        let keeper = Keeper {
            key,
            value,
            ttl: self.ttl,
            stop: stop.clone(),
        };
        self.tracker.spawn(keeper.run(client, first));
        Ok(Box::new(EtcdLease {
            worker_id: instance.worker_id,
            stop,
        }))
    }

    fn watch(&self) -> watch::Receiver<Instances> {
        if !self
            .following
            .swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            self.tracker.spawn(self.clone().follow());
        }
        self.instances.subscribe()
    }
}

/// Registers `key` under a new lease of `ttl`.
async fn grant_and_put(
    client: &EtcdClient,
    key: &str,
    value: &[u8],
    ttl: Duration,
) -> Result<LeaseId, EtcdError> {
    let lease = client.grant(ttl).await?;
    client.put(key.as_bytes(), value, lease).await?;
    Ok(lease)
}

struct Keeper {
    key: String,
    value: Vec<u8>,
    ttl: Duration,
    stop: CancellationToken,
}

impl Keeper {
    async fn run(self, client: EtcdClient, first: LeaseId) {
        let mut current = Some(first);
        loop {
            let lease = match current.take() {
                Some(lease) => lease,
                None => match grant_and_put(&client, &self.key, &self.value, self.ttl).await {
                    Ok(lease) => {
                        tracing::info!(key = %self.key, "registered again with etcd");
                        lease
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot register with etcd; retrying");
                        if !pause(&self.stop, Duration::from_millis(500)).await {
                            return;
                        }
                        continue;
                    }
                },
            };
            match self.keep_alive(&client, lease).await {
                Ok(()) => {
                    // Stopped: revoke so watchers see the worker leave at once.
                    let revoke = client.revoke(lease);
                    let _ = tokio::time::timeout(Duration::from_secs(2), revoke).await;
                    return;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "lost the etcd lease; registering again");
                    if !pause(&self.stop, Duration::from_millis(200)).await {
                        return;
                    }
                }
            }
        }
    }

    /// Renews every third of the TTL; returns Ok when stopped, Err when the lease is lost.
    async fn keep_alive(&self, client: &EtcdClient, lease: LeaseId) -> Result<(), EtcdError> {
        loop {
            if !pause(&self.stop, self.ttl / 3).await {
                return Ok(());
            }
            // A dead connection may not fail on its own: bound each round.
            match tokio::time::timeout(self.ttl / 2, client.keep_alive(lease)).await {
                Ok(Ok(ttl)) if ttl > 0 => {}
                Ok(Ok(_)) => return Err(EtcdError::WatchEnded("the lease expired".into())),
                Ok(Err(e)) => return Err(e),
                Err(_) => return Err(EtcdError::WatchEnded("no answer from etcd".into())),
            }
        }
    }
}
