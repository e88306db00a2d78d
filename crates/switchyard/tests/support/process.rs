//! `switchyard` processes for tests: started from the built binary, announcing their
//! address on their first line of stdout, killed when dropped.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// A `switchyard` process; killed on drop, its log printed if the test failed.
pub struct Process {
    pub name: String,
    child: Child,
    /// Where it serves: the frontend's HTTP address or the worker's request plane.
    pub address: String,
    log: PathBuf,
    /// The admin listener's address, if it announced one.
    pub admin: Option<String>,
}

impl Process {
    pub fn spawn(name: &str, args: &[String], dir: &Path) -> Process {
        Self::spawn_with_env(name, args, &[], dir)
    }

    pub fn spawn_with_env(
        name: &str,
        args: &[String],
        env: &[(&str, &str)],
        dir: &Path,
    ) -> Process {
        let log = dir.join(format!("{name}.log"));
        let stderr = std::fs::File::create(&log).unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_switchyard"))
            .args(args)
            .env("SWITCHYARD_LOG__LEVEL", "info,async_nats=warn")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .unwrap();
        // The first line of stdout announces the address.
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            let mut line = String::new();
            let _ = reader.read_line(&mut line);
            let _ = tx.send(line);
            // Keep draining so the process never blocks on a full pipe.
            let _ = std::io::copy(&mut reader, &mut std::io::sink());
        });
        let line = match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(line) if !line.is_empty() => line,
            _ => {
                let _ = child.kill();
                let mut text = String::new();
                let _ = std::fs::File::open(&log).and_then(|mut f| f.read_to_string(&mut text));
                panic!("{name} did not start:\n{text}");
            }
        };
        let address = line
            .split(" on ")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .map(|a| a.trim_start_matches("http://").to_string())
            .unwrap_or_else(|| panic!("{name}: no address in {line:?}"));
        // A frontend with an admin listener names it on the same line.
        let admin = line
            .split(" admin http://")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .map(|a| a.trim_end_matches('.').to_string());
        Process {
            name: name.to_string(),
            child,
            address,
            admin,
            log,
        }
    }

    /// What it logged so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `/metrics` and `/v1/internal/*` go to the admin listener when there is one.
    pub fn url(&self, path: &str) -> String {
        if let Some(admin) = &self.admin
            && super::is_admin_path(path)
        {
            return format!("http://{admin}{path}");
        }
        format!("http://{}{path}", self.address)
    }

    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn sigterm(&self) {
        self.signal("TERM");
    }

    /// Sends a signal by name (`STOP`, `CONT`, `TERM`).
    pub fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .args([&format!("-{name}"), &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    pub fn wait(&mut self, within: Duration) -> ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "{} did not exit within {within:?}",
                self.name
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // SWITCHYARD_TEST_LOGS=DIR keeps every process's whole log there, to read a
        // failure the printed excerpt does not explain.
        if let Some(dir) = std::env::var_os("SWITCHYARD_TEST_LOGS") {
            let dir = PathBuf::from(dir);
            let _ = std::fs::create_dir_all(&dir);
            let _ = std::fs::copy(&self.log, dir.join(format!("{}.log", self.name)));
        }
        if std::thread::panicking() {
            let text = std::fs::read_to_string(&self.log).unwrap_or_default();
            // A panic, error or change of degradation level early in a long run would
            // scroll out of the tail: the first panics and errors, the last level changes.
            let mut alarms: Vec<&str> = text
                .lines()
                .filter(|l| l.contains("panicked") || l.contains(" ERROR "))
                .take(10)
                .collect();
            let levels: Vec<&str> = text.lines().filter(|l| l.contains("degradation")).collect();
            alarms.extend(&levels[levels.len().saturating_sub(20)..]);
            // And the last changes of workers' health (a cascade of workers found unhealthy).
            let health: Vec<&str> = text
                .lines()
                .filter(|l| {
                    l.contains("worker unhealthy")
                        || l.contains("worker suspicious")
                        || l.contains("worker healthy again")
                })
                .collect();
            alarms.extend(&health[health.len().saturating_sub(30)..]);
            if !alarms.is_empty() {
                eprintln!("--- {} (panics and errors) ---", self.name);
                for line in alarms {
                    eprintln!("{line}");
                }
            }
            let tail: Vec<&str> = text.lines().rev().take(40).collect();
            eprintln!("--- {} (last lines) ---", self.name);
            for line in tail.iter().rev() {
                eprintln!("{line}");
            }
        }
    }
}
