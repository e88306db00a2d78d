//! The one configuration tree, loaded in one place: TOML file, then `SWITCHYARD_*`
//! environment variables, then command-line flags, each layer overriding the one before.
//!
//! Environment keys nest with `__`: `SWITCHYARD_FRONTEND__PORT=9000` sets `frontend.port`.
//! Values parse as TOML scalars when they can (`9000`, `true`, `0.5`), else as strings
//! (`127.0.0.1`, `250ms`). The loader takes the environment as a map, so tests pass their
//! own; only `main` reads the process environment.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use switchyard_frontend::FrontendConfig;
use switchyard_worker::{EchoConfig, MockerConfig};
use thiserror::Error;

/// Everything `switchyard serve` runs.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub frontend: FrontendConfig,
    pub workers: WorkersConfig,
    pub log: LogConfig,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum EngineKind {
    Mocker,
    Echo,
}

/// The in-process workers of `serve`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WorkersConfig {
    pub count: u32,
    pub engine: EngineKind,
    pub mocker: MockerConfig,
    pub echo: EchoConfig,
}

impl Default for WorkersConfig {
    fn default() -> Self {
        WorkersConfig {
            count: 4,
            engine: EngineKind::Mocker,
            mocker: MockerConfig::default(),
            echo: EchoConfig::default(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    /// A tracing filter, e.g. `info` or `switchyard_frontend=debug,info`.
    pub level: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            level: "info".into(),
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
    merge(&mut merged, env_table(env));
    merge(&mut merged, flags);
    let config: Config =
        serde_path_to_error::deserialize(toml::Value::Table(merged)).map_err(|e| {
            ConfigError::Invalid {
                path: e.path().to_string(),
                message: e.inner().to_string(),
            }
        })?;
    config.validate()?;
    Ok(config)
}

impl Config {
    fn validate(&self) -> Result<(), ConfigError> {
        self.frontend.validate().map_err(ConfigError::Check)?;
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
        if self.workers.echo.block_size == 0 {
            return Err(ConfigError::Check(
                "workers.echo.block_size must be at least 1".into(),
            ));
        }
        Ok(())
    }
}

/// `SWITCHYARD_A__B=v` becomes `a.b = v`.
fn env_table(env: &BTreeMap<String, String>) -> toml::Table {
    let mut table = toml::Table::new();
    for (key, value) in env {
        let Some(rest) = key.strip_prefix("SWITCHYARD_") else {
            continue;
        };
        let path: Vec<String> = rest.split("__").map(str::to_ascii_lowercase).collect();
        if path.iter().any(String::is_empty) {
            continue;
        }
        insert(&mut table, &path, scalar(value));
    }
    table
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
    fn env_values_are_typed_when_they_can_be() {
        assert_eq!(scalar("8000"), toml::Value::Integer(8000));
        assert_eq!(scalar("true"), toml::Value::Boolean(true));
        assert_eq!(scalar("127.0.0.1"), toml::Value::String("127.0.0.1".into()));
        assert_eq!(scalar("250ms"), toml::Value::String("250ms".into()));
    }
}
