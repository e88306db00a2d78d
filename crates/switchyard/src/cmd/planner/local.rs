//! The local connector's worker processes: `switchyard worker` children started and
//! stopped with SIGTERM (which drains them), listed in a state file so a restarted planner
//! adopts the workers it left.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use switchyard_core::WorkerRole;

/// Worker processes this planner runs.
pub(super) struct LocalWorkers {
    state_file: PathBuf,
    args: Vec<String>,
    /// Serving, oldest first: a child of this planner, or one adopted by pid.
    running: Vec<LocalWorker>,
    /// Told to stop, draining.
    stopping: Vec<LocalWorker>,
}

struct LocalWorker {
    pid: u32,
    role: WorkerRole,
    child: Option<Child>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct State {
    /// Process ids of the running (aggregated) workers, oldest first.
    workers: Vec<u32>,
    /// Those of a disaggregated fleet's pools.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    prefill: Vec<u32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    decode: Vec<u32>,
}

impl LocalWorkers {
    /// Takes over the live workers a previous planner listed in `state_file`.
    pub(super) fn adopt(state_file: &Path, args: Vec<String>) -> Result<LocalWorkers> {
        let state: State = match std::fs::read_to_string(state_file) {
            Ok(text) => serde_json::from_str(&text)
                .with_context(|| format!("{}: not a planner state file", state_file.display()))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => State::default(),
            Err(e) => return Err(e).context(format!("cannot read {}", state_file.display())),
        };
        let running = [
            (WorkerRole::Aggregated, state.workers),
            (WorkerRole::Prefill, state.prefill),
            (WorkerRole::Decode, state.decode),
        ]
        .into_iter()
        .flat_map(|(role, pids)| pids.into_iter().map(move |pid| (role, pid)))
        .filter(|&(_, pid)| alive(pid))
        .map(|(role, pid)| LocalWorker {
            pid,
            role,
            child: None,
        })
        .collect::<Vec<_>>();
        if !running.is_empty() {
            tracing::info!(
                workers = running.len(),
                "adopted workers from {}",
                state_file.display()
            );
        }
        let workers = LocalWorkers {
            state_file: state_file.to_path_buf(),
            args,
            running,
            stopping: Vec::new(),
        };
        workers.save()?;
        Ok(workers)
    }

    /// Stops the workers of roles not in `planned`.
    pub(super) fn stop_roles_except(&mut self, planned: &[WorkerRole]) -> Result<()> {
        let (keep, stop): (Vec<LocalWorker>, Vec<LocalWorker>) = std::mem::take(&mut self.running)
            .into_iter()
            .partition(|w| planned.contains(&w.role));
        self.running = keep;
        for worker in stop {
            tracing::warn!(pid = worker.pid, role = %worker.role, "stopping an adopted worker of a pool this planner does not plan");
            terminate(worker.pid);
            self.stopping.push(worker);
        }
        self.save()
    }

    pub(super) fn count(&self, role: WorkerRole) -> u32 {
        self.running.iter().filter(|w| w.role == role).count() as u32
    }

    pub(super) fn scale_to(&mut self, role: WorkerRole, replicas: u32) -> Result<()> {
        // Adopted workers may have exited on their own since.
        self.running.retain(|w| alive(w.pid));
        while self.count(role) < replicas {
            self.start(role)?;
        }
        while self.count(role) > replicas {
            // The newest goes first (the oldest have the warmest caches).
            if let Some(i) = self.running.iter().rposition(|w| w.role == role) {
                let worker = self.running.remove(i);
                terminate(worker.pid);
                self.stopping.push(worker);
            }
        }
        self.save()
    }

    fn start(&mut self, role: WorkerRole) -> Result<()> {
        let program = std::env::current_exe().context("cannot find the switchyard binary")?;
        let dir = self
            .state_file
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."))
            .to_path_buf();
        let n = self.running.len() + self.stopping.len();
        let log_path = dir.join(format!("worker-{}-{n}.log", std::process::id()));
        let log = std::fs::File::create(&log_path)
            .with_context(|| format!("cannot write {}", log_path.display()))?;
        let mut command = Command::new(program);
        command.arg("worker").args(&self.args);
        if role != WorkerRole::Aggregated {
            command.args(["--role", role.name()]);
        }
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("cannot start a worker")?;
        tracing::info!(pid = child.id(), %role, log = %log_path.display(), "worker started");
        self.running.push(LocalWorker {
            pid: child.id(),
            role,
            child: Some(child),
        });
        Ok(())
    }

    /// Collects the exit of stopped workers.
    pub(super) fn reap(&mut self) {
        self.stopping.retain_mut(|w| match &mut w.child {
            Some(child) => !matches!(child.try_wait(), Ok(Some(_)) | Err(_)),
            None => alive(w.pid),
        });
    }

    fn save(&self) -> Result<()> {
        let pids = |role: WorkerRole| -> Vec<u32> {
            self.running
                .iter()
                .filter(|w| w.role == role)
                .map(|w| w.pid)
                .collect()
        };
        let state = State {
            workers: pids(WorkerRole::Aggregated),
            prefill: pids(WorkerRole::Prefill),
            decode: pids(WorkerRole::Decode),
        };
        let tmp = self.state_file.with_extension("tmp");
        std::fs::write(&tmp, serde_json::to_vec_pretty(&state)?)
            .with_context(|| format!("cannot write {}", tmp.display()))?;
        std::fs::rename(&tmp, &self.state_file)
            .with_context(|| format!("cannot write {}", self.state_file.display()))
    }
}

/// Whether a process with this id runs (and is not a zombie).
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// Asks a worker to drain and exit.
fn terminate(pid: u32) {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    let Ok(raw) = i32::try_from(pid) else {
        return;
    };
    if let Err(e) = kill(Pid::from_raw(raw), Signal::SIGTERM) {
        tracing::warn!(pid, "cannot stop the worker: {e}");
    } else {
        tracing::info!(pid, "worker told to drain and stop");
    }
}
