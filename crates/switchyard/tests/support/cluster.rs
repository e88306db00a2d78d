//! A deployment of separate processes for tests: real NATS and etcd servers on free
//! loopback ports, `switchyard frontend` and `switchyard worker` processes meeting there.

use std::time::{Duration, Instant};

use serde_json::Value;
use switchyard_runtime::testing::{EtcdServer, NatsServer};

use super::client;
use super::process::Process;

/// How long a killed worker stays registered.
pub const LEASE_TTL_SECS: u64 = 2;

/// The servers and the processes of one deployment.
pub struct Cluster {
    pub nats: NatsServer,
    pub etcd: EtcdServer,
    pub dir: tempfile::TempDir,
}

impl Cluster {
    pub fn start() -> Cluster {
        Cluster {
            nats: NatsServer::start(),
            etcd: EtcdServer::start(),
            dir: tempfile::tempdir().unwrap(),
        }
    }

    pub fn planes(&self) -> Vec<String> {
        [
            "--discovery",
            &self.etcd.url(),
            "--event-plane",
            &self.nats.url(),
            "--namespace",
            "itest",
        ]
        .map(str::to_string)
        .to_vec()
    }

    pub fn worker(&self, id: u64, speedup_ratio: &str) -> Process {
        self.worker_with(
            &format!("worker-{id}"),
            &[
                "--worker-id",
                &id.to_string(),
                "--speedup-ratio",
                speedup_ratio,
            ],
        )
    }

    /// A worker with these flags (and the planes, and the lease TTL).
    pub fn worker_with(&self, name: &str, flags: &[&str]) -> Process {
        self.worker_with_env(name, flags, &[])
    }

    /// A worker with these flags and `SWITCHYARD_*` environment pairs.
    pub fn worker_with_env(&self, name: &str, flags: &[&str], env: &[(&str, &str)]) -> Process {
        let mut args = vec!["worker".to_string()];
        args.extend(self.planes());
        if !flags.contains(&"--lease-ttl") {
            args.extend(["--lease-ttl".to_string(), format!("{LEASE_TTL_SECS}s")]);
        }
        args.extend(flags.iter().map(|f| f.to_string()));
        Process::spawn_with_env(name, &args, env, self.dir.path())
    }

    pub fn frontend(&self, name: &str, port: u16) -> Process {
        self.frontend_with(name, port, &[])
    }

    /// A frontend with settings given as `SWITCHYARD_*` environment pairs.
    pub fn frontend_with(&self, name: &str, port: u16, env: &[(&str, &str)]) -> Process {
        let mut args = vec!["frontend".to_string()];
        args.extend(self.planes());
        args.extend(["--port".to_string(), port.to_string()]);
        args.extend(["--admin-port".to_string(), "0".to_string()]);
        Process::spawn_with_env(name, &args, env, self.dir.path())
    }
}

pub async fn get_json(url: &str) -> Value {
    client()
        .get(url)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// Polls until `check` holds, or fails with `what`.
pub async fn eventually<F, Fut>(within: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let deadline = Instant::now() + within;
    loop {
        let last = match check().await {
            Ok(()) => return,
            Err(e) => e,
        };
        assert!(
            Instant::now() < deadline,
            "{what} not within {within:?}: {last}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub async fn workers_seen(frontend: &Process) -> u64 {
    get_json(&frontend.url("/health")).await["workers"]
        .as_u64()
        .unwrap_or(0)
}

pub async fn wait_for_workers(frontend: &Process, n: u64, within: Duration) {
    eventually(
        within,
        &format!("{} seeing {n} workers", frontend.name),
        || async {
            let seen = workers_seen(frontend).await;
            if seen == n {
                Ok(())
            } else {
                Err(format!("sees {seen}"))
            }
        },
    )
    .await;
}
