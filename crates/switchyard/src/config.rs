//! The one configuration tree, loaded in one place: TOML file, then `SWITCHYARD_*`
//! environment variables, then command-line flags, each layer overriding the one before.
//!
//! Environment keys nest with `__`: `SWITCHYARD_FRONTEND__PORT=9000` sets `frontend.port`.
//! Values parse as TOML scalars when they can (`9000`, `true`, `0.5`), else as strings
//! (`127.0.0.1`, `250ms`). The loader takes the environment as a map, so tests pass their
//! own; only `main` reads the process environment.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use switchyard_frontend::FrontendConfig;
use switchyard_worker::upstream::OpenAiConfig;
use switchyard_worker::{
    CandleConfig, EchoConfig, EncoderConfig, EncoderModels, EngineConfig, MockerConfig,
    WorkerConfig,
};
use thiserror::Error;

/// Everything `switchyard serve`, `frontend` and `worker` run.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub frontend: FrontendConfig,
    /// The engine workers run (`count` is for `serve` only).
    pub workers: WorkersConfig,
    /// The planes of a distributed deployment (`frontend` and `worker`).
    pub runtime: RuntimeConfig,
    /// A `switchyard worker` process.
    pub worker: WorkerProcessConfig,
    /// `switchyard planner` (and the planner's settings in `switchyard sim`).
    pub planner: switchyard_planner::PlannerConfig,
    pub log: LogConfig,
}

/// Where the distributed planes are.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RuntimeConfig {
    /// `etcd://host:port`.
    pub discovery: Option<String>,
    /// `nats://host:port`.
    pub event_plane: Option<String>,
    /// Deployments sharing etcd and NATS stay apart by namespace.
    pub namespace: String,
    /// A worker that stops renewing its registration is dropped after this long.
    #[serde(with = "humantime_serde")]
    pub lease_ttl: Duration,
    /// Frontends share their in-flight requests over NATS, so each counts the others'
    /// load.
    pub replica_sync: bool,
    /// A shared secret on the request plane: workers refuse frontends without it. Set it
    /// through the environment (`SWITCHYARD_RUNTIME__REQUEST_SECRET`) or a config file,
    /// not on the command line.
    pub request_secret: Option<String>,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            discovery: None,
            event_plane: None,
            namespace: "default".into(),
            lease_ttl: Duration::from_secs(10),
            replica_sync: true,
            request_secret: None,
        }
    }
}

/// The planes' addresses, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Planes {
    pub etcd: String,
    pub nats: String,
}

impl RuntimeConfig {
    /// The etcd and NATS addresses, or an error naming what is missing or malformed.
    pub fn planes(&self) -> Result<Planes, ConfigError> {
        let discovery = self.discovery.as_deref().ok_or_else(|| {
            ConfigError::Check(
                "runtime.discovery is required: pass --discovery etcd://HOST:PORT".into(),
            )
        })?;
        let events = self.event_plane.as_deref().ok_or_else(|| {
            ConfigError::Check(
                "runtime.event_plane is required: pass --event-plane nats://HOST:PORT".into(),
            )
        })?;
        Ok(Planes {
            etcd: endpoint("runtime.discovery", discovery, "etcd")?,
            nats: endpoint("runtime.event_plane", events, "nats")?,
        })
    }
}

/// Checks `scheme://host:port` and returns it.
fn endpoint(key: &str, url: &str, scheme: &str) -> Result<String, ConfigError> {
    let bad = |why: &str| {
        ConfigError::Check(format!(
            "{key} must look like {scheme}://HOST:PORT, got `{url}` ({why})"
        ))
    };
    let rest = url
        .strip_prefix(scheme)
        .and_then(|r| r.strip_prefix("://"))
        .ok_or_else(|| bad("wrong scheme"))?;
    let (host, port) = rest.rsplit_once(':').ok_or_else(|| bad("no port"))?;
    if host.is_empty() || host.contains('/') {
        return Err(bad("no host"));
    }
    port.parse::<u16>().map_err(|_| bad("bad port"))?;
    Ok(url.to_string())
}

/// One worker process of a distributed deployment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WorkerProcessConfig {
    /// Where its request plane listens (`host:port`; port 0 picks a free one).
    pub listen: String,
    /// The `host:port` frontends reach it on; by default the listening address (which
    /// must then not be a wildcard like 0.0.0.0).
    pub advertise: Option<String>,
    /// Its worker id; by default a random one, so a restarted worker is a new worker.
    pub id: Option<u64>,
    /// On SIGTERM, how long requests in flight get to finish.
    #[serde(with = "humantime_serde")]
    pub drain_timeout: Duration,
    /// Fault injection: a schedule, and the admin endpoint's token (tests and demos only).
    pub faults: switchyard_worker::faults::FaultSettings,
    /// Its part of the work: aggregated (prefill and decode), prefill or decode.
    pub role: switchyard_core::WorkerRole,
}

impl Default for WorkerProcessConfig {
    fn default() -> Self {
        WorkerProcessConfig {
            role: switchyard_core::WorkerRole::Aggregated,
            listen: "127.0.0.1:0".into(),
            advertise: None,
            id: None,
            drain_timeout: Duration::from_secs(30),
            faults: Default::default(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum EngineKind {
    Mocker,
    Echo,
    /// A stock OpenAI-compatible server (llama.cpp, vLLM, SGLang): `workers.openai`.
    Openai,
    /// A GGUF model computed on the CPU (builds with the `candle` feature): `workers.candle`.
    Candle,
}

impl EngineKind {
    /// The name in configuration files and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            EngineKind::Mocker => "mocker",
            EngineKind::Echo => "echo",
            EngineKind::Openai => "openai",
            EngineKind::Candle => "candle",
        }
    }
}

/// The in-process workers of `serve`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WorkersConfig {
    pub count: u32,
    /// Disaggregated serving: the first `prefill` of the `count` workers compute prompts,
    /// the others decode (0: every worker does both).
    pub prefill: u32,
    pub engine: EngineKind,
    pub mocker: MockerConfig,
    pub echo: EchoConfig,
    /// The upstream server of `engine = "openai"` workers.
    pub openai: OpenAiConfig,
    /// The model of `engine = "candle"` workers.
    pub candle: CandleConfig,
    /// Real encoders for the encoder workers (a build with the `encoders` feature).
    pub encoder: EncoderModels,
}

impl Default for WorkersConfig {
    fn default() -> Self {
        WorkersConfig {
            count: 4,
            prefill: 0,
            engine: EngineKind::Mocker,
            mocker: MockerConfig::default(),
            echo: EchoConfig::default(),
            openai: OpenAiConfig::default(),
            candle: CandleConfig::default(),
            encoder: EncoderModels::default(),
        }
    }
}

impl WorkersConfig {
    /// The tokenizer the engine's own model file holds, for a frontend given none: the CPU
    /// engine's GGUF file holds its tokenizer and chat template.
    pub fn engine_tokenizer(&self) -> Option<PathBuf> {
        (self.engine == EngineKind::Candle).then(|| self.candle.model.clone())
    }
}

impl Config {
    /// The worker `worker` runs, and `serve`'s LLM workers: the engine `workers.engine`
    /// names, with its settings; a media encoder for role `encoder`.
    pub fn worker_config(&self) -> WorkerConfig {
        let engine = match self.workers.engine {
            _ if self.worker.role == switchyard_core::WorkerRole::Encoder => self.encoder_engine(),
            EngineKind::Mocker => EngineConfig::Mocker(self.mocker_config()),
            EngineKind::Echo => EngineConfig::Echo(self.workers.echo.clone()),
            EngineKind::Openai => EngineConfig::Openai(self.workers.openai.clone()),
            EngineKind::Candle => EngineConfig::Candle(self.workers.candle.clone()),
        };
        WorkerConfig {
            model: self.frontend.model.clone(),
            role: self.worker.role,
            engine,
            faults: self.worker.faults.clone(),
        }
    }

    /// The mocker's settings, enforcing constraints over the frontend's tokenizer when it
    /// names no other (a model directory; a GGUF file's vocabulary it does not read).
    fn mocker_config(&self) -> MockerConfig {
        let mut mocker = self.workers.mocker.clone();
        if mocker.tokenizer.is_none() {
            mocker.tokenizer = self.frontend.tokenizer.clone().filter(|p| p.is_dir());
        }
        mocker
    }

    /// An encoder worker's engine: timed by the media settings, or real for the modalities
    /// `workers.encoder` names models for.
    pub fn encoder_engine(&self) -> EngineConfig {
        let multimodal = &self.frontend.multimodal;
        EngineConfig::Encoder(EncoderConfig {
            cost: multimodal.encoder_cost(),
            encoders: 1,
            max_pending: multimodal.preprocess_queue,
            models: self.workers.encoder.clone(),
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    /// A tracing filter, e.g. `info` or `switchyard_frontend=debug,info`.
    pub level: String,
    /// `text` for people, `json` (one object per line) for log collectors.
    pub format: LogFormat,
    /// Export request spans over OTLP/HTTP to this URL (`http://host:4318/v1/traces`);
    /// needs a build with the `otel` feature. Off by default.
    pub otlp_endpoint: Option<String>,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            level: "info".into(),
            format: LogFormat::Text,
            otlp_endpoint: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

impl LogFormat {
    pub fn name(self) -> &'static str {
        match self {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        }
    }
}

#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("config file {path} is not valid TOML: {source}")]
    Toml {
        path: String,
        source: Box<toml::de::Error>,
    },
    #[error("invalid configuration at `{path}`: {message}")]
    Invalid { path: String, message: String },
    #[error("invalid configuration: {0}")]
    Check(String),
}

/// Loads the configuration: `file` (if any) ← `env` (`SWITCHYARD_*` keys) ← `flags`.
pub fn load(
    file: Option<&Path>,
    env: &BTreeMap<String, String>,
    flags: toml::Table,
) -> Result<Config, ConfigError> {
    let mut merged = toml::Table::new();
    if let Some(path) = file {
        let name = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: name.clone(),
            source,
        })?;
        let table: toml::Table = toml::from_str(&text).map_err(|source| ConfigError::Toml {
            path: name,
            source: Box::new(source),
        })?;
        merge(&mut merged, table);
    }
    let (env_values, mut typed) = env_table(env);
    merge(&mut merged, env_values);
    merge(&mut merged, flags);
    loop {
        match serde_path_to_error::deserialize::<_, Config>(toml::Value::Table(merged.clone())) {
            Ok(config) => {
                config.validate()?;
                return Ok(config);
            }
            Err(e) => {
                let path = e.path().to_string();
                // An environment value read as a number or boolean where a string was
                // wanted (a model named `7`): take it as the string it was, and retry.
                if let Some(at) = typed.iter().position(|(p, _)| p.join(".") == path) {
                    let (keys, text) = typed.swap_remove(at);
                    if lookup(&merged, &keys).is_some_and(|v| !v.is_str()) {
                        insert(&mut merged, &keys, toml::Value::String(text));
                        continue;
                    }
                }
                return Err(ConfigError::Invalid {
                    path,
                    message: e.inner().to_string(),
                });
            }
        }
    }
}

fn lookup<'a>(table: &'a toml::Table, path: &[String]) -> Option<&'a toml::Value> {
    let (first, rest) = path.split_first()?;
    let value = table.get(first)?;
    match (rest.is_empty(), value) {
        (true, value) => Some(value),
        (false, toml::Value::Table(inner)) => lookup(inner, rest),
        _ => None,
    }
}

impl Config {
    fn validate(&self) -> Result<(), ConfigError> {
        self.frontend
            .validate()
            .map_err(|e| ConfigError::Check(e.to_string()))?;
        if self.workers.count == 0 {
            return Err(ConfigError::Check(
                "workers.count must be at least 1".into(),
            ));
        }
        self.workers
            .mocker
            .args
            .validate()
            .map_err(|e| ConfigError::Check(format!("workers.mocker: {e}")))?;
        if self.workers.prefill > 0 && self.workers.prefill >= self.workers.count {
            return Err(ConfigError::Check(format!(
                "workers.prefill ({}) must leave at least one of the workers.count ({}) to decode",
                self.workers.prefill, self.workers.count
            )));
        }
        self.workers
            .mocker
            .kv_transfer
            .validate()
            .map_err(|e| ConfigError::Check(format!("workers.mocker.{e}")))?;
        if self.frontend.disagg.max_prefill_queue_tokens == 0 {
            return Err(ConfigError::Check(
                "frontend.disagg.max_prefill_queue_tokens must be at least 1".into(),
            ));
        }
        // An encoder worker is a mock encoder whatever the engine (see `deploy`).
        if self.workers.engine == EngineKind::Openai
            && self.worker.role != switchyard_core::WorkerRole::Encoder
        {
            self.workers
                .openai
                .validate()
                .map_err(|e| ConfigError::Check(format!("workers.openai: {e}")))?;
            if self.worker.role != switchyard_core::WorkerRole::Aggregated {
                return Err(ConfigError::Check(
                    "an openai worker serves aggregated requests only (worker.role)".into(),
                ));
            }
        }
        if self.workers.engine == EngineKind::Candle {
            self.workers
                .candle
                .validate()
                .map_err(|e| ConfigError::Check(format!("workers.candle: {e}")))?;
            if self.worker.role != switchyard_core::WorkerRole::Aggregated
                || self.workers.prefill > 0
            {
                return Err(ConfigError::Check(
                    "a candle worker serves aggregated requests only".into(),
                ));
            }
        }
        if self.workers.echo.block_size == 0 {
            return Err(ConfigError::Check(
                "workers.echo.block_size must be at least 1".into(),
            ));
        }
        if self.runtime.namespace.is_empty() {
            return Err(ConfigError::Check(
                "runtime.namespace must not be empty".into(),
            ));
        }
        if let Some(secret) = &self.runtime.request_secret
            && (secret.len() < 16 || !secret.bytes().all(|b| b.is_ascii_graphic()))
        {
            return Err(ConfigError::Check(
                "runtime.request_secret must be at least 16 visible ASCII characters".into(),
            ));
        }
        if self.runtime.lease_ttl < Duration::from_secs(1) {
            return Err(ConfigError::Check(
                "runtime.lease_ttl must be at least 1s (etcd leases count whole seconds)".into(),
            ));
        }
        if self.worker.id == Some(0) {
            return Err(ConfigError::Check("worker.id must not be 0".into()));
        }
        Ok(())
    }
}

/// `SWITCHYARD_A__B=v` becomes `a.b = v`; variables without a `__` are ignored.
/// Also returns the values typed other than as strings, with their text, in case the
/// setting wants a string after all.
#[allow(clippy::type_complexity)]
fn env_table(env: &BTreeMap<String, String>) -> (toml::Table, Vec<(Vec<String>, String)>) {
    let mut table = toml::Table::new();
    let mut typed = Vec::new();
    for (key, value) in env {
        let Some(rest) = key.strip_prefix("SWITCHYARD_") else {
            continue;
        };
        let path: Vec<String> = rest.split("__").map(str::to_ascii_lowercase).collect();
        // Every setting sits in a section, so configuration variables have a `__`; others
        // (SWITCHYARD_CACHE for scripts/test, ...) are not configuration. A misspelt
        // section still has its `__` and is reported as unknown.
        if path.len() < 2 || path.iter().any(String::is_empty) {
            continue;
        }
        let parsed = scalar(value);
        if !parsed.is_str() {
            typed.push((path.clone(), value.clone()));
        }
        insert(&mut table, &path, parsed);
    }
    (table, typed)
}

/// A value as the environment and `--set` give it: a TOML value when it parses as one
/// (`9000`, `true`, `0.5`, `["a", "b"]`), else the string it is (`127.0.0.1`, `250ms`).
pub fn parse_value(text: &str) -> toml::Value {
    scalar(text)
}

fn scalar(text: &str) -> toml::Value {
    match toml::from_str::<toml::Table>(&format!("v = {text}")) {
        Ok(mut t) => t
            .remove("v")
            .unwrap_or_else(|| toml::Value::String(text.to_string())),
        Err(_) => toml::Value::String(text.to_string()),
    }
}

/// Sets `path` in `table`, creating tables on the way.
pub fn insert(table: &mut toml::Table, path: &[String], value: toml::Value) {
    match path {
        [] => {}
        [last] => {
            table.insert(last.clone(), value);
        }
        [first, rest @ ..] => {
            let entry = table
                .entry(first.clone())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            if !entry.is_table() {
                *entry = toml::Value::Table(toml::Table::new());
            }
            if let toml::Value::Table(inner) = entry {
                insert(inner, rest, value);
            }
        }
    }
}

/// Deep merge: tables merge key by key, anything else is replaced.
fn merge(base: &mut toml::Table, overlay: toml::Table) {
    for (key, value) in overlay {
        match (base.get_mut(&key), value) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            (_, value) => {
                base.insert(key, value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn layers_override_in_order() {
        let dir = std::env::temp_dir().join(format!("switchyard-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("c.toml");
        std::fs::write(&file, "[frontend]\nport = 7000\nmodel = \"from-file\"\n[workers]\ncount = 2\n[workers.mocker]\nblock_size = 32\nload_report_interval = \"250ms\"\n").unwrap();
        let e = env(&[
            ("SWITCHYARD_FRONTEND__PORT", "7100"),
            ("SWITCHYARD_WORKERS__ENGINE", "echo"),
            ("SWITCHYARD_CACHE", "/tmp/elsewhere"),
            ("SWITCHYARD_PYTHON", "/usr/bin/python3"),
            ("HOME", "/x"),
        ]);
        let mut flags = toml::Table::new();
        insert(
            &mut flags,
            &["frontend".into(), "port".into()],
            toml::Value::Integer(7200),
        );
        let config = load(Some(&file), &e, flags).unwrap();
        assert_eq!(config.frontend.port, 7200);
        assert_eq!(config.frontend.model, "from-file");
        assert_eq!(config.workers.count, 2);
        assert_eq!(config.workers.engine, EngineKind::Echo);
        assert_eq!(config.workers.mocker.args.block_size, 32);
        assert_eq!(
            config.workers.mocker.load_report_interval,
            std::time::Duration::from_millis(250)
        );
        assert_eq!(
            config.workers.mocker.args.num_gpu_blocks, 16_384,
            "defaults fill the rest"
        );
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn mistakes_are_named_precisely() {
        let err = load(
            None,
            &env(&[("SWITCHYARD_FRONTEND__PROT", "1")]),
            toml::Table::new(),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("frontend") && err.contains("unknown field `prot`"),
            "{err}"
        );
        let err = load(
            None,
            &env(&[("SWITCHYARD_FRONTNED__PORT", "1")]),
            toml::Table::new(),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("unknown field `frontned`"), "{err}");
        let err = load(
            None,
            &env(&[("SWITCHYARD_WORKERS__COUNT", "many")]),
            toml::Table::new(),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("`workers.count`") && err.contains("invalid type"),
            "{err}"
        );
        let err = load(
            None,
            &env(&[("SWITCHYARD_WORKERS__COUNT", "0")]),
            toml::Table::new(),
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            err,
            "invalid configuration: workers.count must be at least 1"
        );
        let err = load(
            None,
            &env(&[("SWITCHYARD_FRONTEND__ROUTER__POLICY", "fastest")]),
            toml::Table::new(),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("frontend.router.policy"), "{err}");
        let err = load(
            Some(Path::new("/nonexistent/s.toml")),
            &BTreeMap::new(),
            toml::Table::new(),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.starts_with("cannot read config file /nonexistent/s.toml"),
            "{err}"
        );
        let err = load(
            None,
            &env(&[("SWITCHYARD_WORKERS__MOCKER__MAX_NUM_SEQS", "0")]),
            toml::Table::new(),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("max_num_seqs must be at least 1"), "{err}");
    }

    #[test]
    fn plane_addresses_are_checked() {
        let mut runtime = RuntimeConfig::default();
        let err = runtime.planes().unwrap_err().to_string();
        assert!(err.contains("--discovery etcd://HOST:PORT"), "{err}");
        runtime.discovery = Some("etcd://127.0.0.1:2379".into());
        let err = runtime.planes().unwrap_err().to_string();
        assert!(err.contains("--event-plane nats://HOST:PORT"), "{err}");
        runtime.event_plane = Some("http://127.0.0.1:4222".into());
        let err = runtime.planes().unwrap_err().to_string();
        assert!(
            err.contains("runtime.event_plane must look like nats://HOST:PORT")
                && err.contains("wrong scheme"),
            "{err}"
        );
        runtime.event_plane = Some("nats://127.0.0.1".into());
        assert!(
            runtime
                .planes()
                .unwrap_err()
                .to_string()
                .contains("no port")
        );
        runtime.event_plane = Some("nats://127.0.0.1:99999".into());
        assert!(
            runtime
                .planes()
                .unwrap_err()
                .to_string()
                .contains("bad port")
        );
        runtime.event_plane = Some("nats://localhost:4222".into());
        let planes = runtime.planes().unwrap();
        assert_eq!(planes.etcd, "etcd://127.0.0.1:2379");
        assert_eq!(planes.nats, "nats://localhost:4222");

        let err = load(
            None,
            &env(&[("SWITCHYARD_RUNTIME__LEASE_TTL", "200ms")]),
            toml::Table::new(),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("runtime.lease_ttl must be at least 1s"),
            "{err}"
        );
        let config = load(
            None,
            &env(&[
                ("SWITCHYARD_RUNTIME__LEASE_TTL", "3s"),
                ("SWITCHYARD_WORKER__ID", "7"),
            ]),
            toml::Table::new(),
        )
        .unwrap();
        assert_eq!(config.runtime.lease_ttl, Duration::from_secs(3));
        assert_eq!(config.worker.id, Some(7));
    }

    #[test]
    fn env_values_that_look_like_numbers_can_still_be_strings() {
        let config = load(
            None,
            &env(&[
                ("SWITCHYARD_FRONTEND__MODEL", "7"),
                ("SWITCHYARD_RUNTIME__NAMESPACE", "true"),
                ("SWITCHYARD_FRONTEND__PORT", "9000"),
            ]),
            toml::Table::new(),
        )
        .unwrap();
        assert_eq!(config.frontend.model, "7");
        assert_eq!(config.runtime.namespace, "true");
        assert_eq!(config.frontend.port, 9000);
        // A number where a number is wanted is still checked.
        let err = load(
            None,
            &env(&[("SWITCHYARD_FRONTEND__PORT", "1.5")]),
            toml::Table::new(),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("`frontend.port`"), "{err}");
    }

    #[test]
    fn an_encoder_workers_modalities_come_from_the_environment_as_a_list() {
        let config = load(
            None,
            &env(&[(
                "SWITCHYARD_WORKERS__ENCODER__MODALITIES",
                r#"["audio", "video"]"#,
            )]),
            toml::Table::new(),
        )
        .unwrap();
        use switchyard_core::Modality;
        assert_eq!(
            config.workers.encoder.modalities,
            [Modality::Audio, Modality::Video]
        );
        let err = load(
            None,
            &env(&[("SWITCHYARD_WORKERS__ENCODER__MODALITIES", r#"["smell"]"#)]),
            toml::Table::new(),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("modalities"), "{err}");
    }

    #[test]
    fn the_documented_example_is_the_defaults() {
        let doc = include_str!("../../../docs/configuration.md");
        let example = doc
            .split("```toml\n")
            .nth(1)
            .and_then(|rest| rest.split("```").next())
            .unwrap();
        let table: toml::Table = toml::from_str(example).unwrap();
        let documented: Config = serde_path_to_error::deserialize(toml::Value::Table(table))
            .unwrap_or_else(|e| panic!("docs/configuration.md: {e}"));
        assert_eq!(documented, Config::default());
    }

    #[test]
    fn env_values_are_typed_when_they_can_be() {
        assert_eq!(scalar("8000"), toml::Value::Integer(8000));
        assert_eq!(scalar("true"), toml::Value::Boolean(true));
        assert_eq!(scalar("127.0.0.1"), toml::Value::String("127.0.0.1".into()));
        assert_eq!(scalar("250ms"), toml::Value::String("250ms".into()));
    }
}
