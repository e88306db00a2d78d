//! Worker configuration.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use switchyard_mocker::EngineArgs;

/// One worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerConfig {
    /// The model name it serves.
    pub model: String,
    pub engine: EngineConfig,
    /// Fault injection (tests, chaos runs, demos).
    #[serde(default)]
    pub faults: crate::faults::FaultSettings,
}

/// Which engine a worker hosts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum EngineConfig {
    Mocker(MockerConfig),
    Echo(EchoConfig),
}

impl EngineConfig {
    /// Shortest interval between two load reports on the event plane.
    pub fn load_report_interval(&self) -> Duration {
        match self {
            EngineConfig::Mocker(mocker) => mocker.load_report_interval,
            EngineConfig::Echo(_) => MockerConfig::default().load_report_interval,
        }
    }
}

/// The simulated engine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MockerConfig {
    #[serde(flatten)]
    pub args: EngineArgs,
    /// Seed of the generated tokens, the model's: the same on every worker, so a stream
    /// resumed on another worker continues the same sequence.
    pub seed: u64,
    /// A timing profile (JSON or NPZ) instead of the polynomial model.
    pub perf_profile: Option<PathBuf>,
    /// Shortest interval between two load reports on the event plane.
    #[serde(with = "humantime_serde")]
    pub load_report_interval: Duration,
}

impl Default for MockerConfig {
    fn default() -> Self {
        MockerConfig {
            args: EngineArgs::default(),
            seed: 0,
            perf_profile: None,
            load_report_interval: Duration::from_millis(100),
        }
    }
}

/// An engine that streams the prompt back, for tests and for measuring the serving path.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EchoConfig {
    /// Tokens per KV block it announces (it keeps no cache).
    pub block_size: u32,
    /// Wait before the first token.
    #[serde(with = "humantime_serde")]
    pub first_token_delay: Duration,
    /// Wait between tokens.
    #[serde(with = "humantime_serde")]
    pub token_delay: Duration,
}

impl Default for EchoConfig {
    fn default() -> Self {
        EchoConfig {
            block_size: 16,
            first_token_delay: Duration::ZERO,
            token_delay: Duration::ZERO,
        }
    }
}
