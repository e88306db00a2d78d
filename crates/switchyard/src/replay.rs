//! Replaying a deployment in the simulator: its settings from the configuration tree
//! `serve` reads (the fleet from `[workers]`: its size, prefill/decode split, the mocker's
//! engine, timing and KV link; the routing from `[frontend]` as it is; the encoders from
//! `[frontend.multimodal]`), and what only a simulation has from [`SimOnly`].

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use switchyard_mocker::PerfModel;
use switchyard_sim::{DisaggSim, EncoderSim, FaultConfig, Link, SimConfig};

use crate::config::Config;

/// What no configuration key holds: the simulation's own settings.
#[derive(Debug, Clone, Default)]
pub struct SimOnly {
    /// Timing profiles for a mixed fleet (worker i runs the (i mod n)-th; `polynomial`
    /// names the default model); none: `workers.mocker.perf_profile`.
    pub perf_profiles: Vec<PathBuf>,
    /// How long KV events take to reach the indexer.
    pub event_delay: Duration,
    /// Tokens that end a generation early (the servers take the tokenizer's).
    pub eos_token_ids: Vec<u32>,
    /// Faults to play; its `kv_bytes_per_token` is replaced by `kv_bytes_per_token`, or
    /// by `workers.mocker.kv_transfer`'s.
    pub faults: FaultConfig,
    pub kv_bytes_per_token: Option<u64>,
    /// Keep a record of every request.
    pub record_requests: bool,
}

/// The simulator's settings for `config`, with the simulation's own `only`.
pub fn sim_config(config: &Config, only: SimOnly) -> Result<SimConfig> {
    let mocker = &config.workers.mocker;
    // Mocker engines run at their configured speedup in `serve` and here alike.
    let engine = mocker.args;
    engine.validate().context("invalid engine arguments")?;
    let mut perf = Vec::new();
    for path in &only.perf_profiles {
        perf.push(if path.as_os_str() == "polynomial" {
            PerfModel::Polynomial
        } else {
            switchyard_mocker::perf::load(path)?
        });
    }
    if perf.is_empty() {
        perf.push(match &mocker.perf_profile {
            Some(path) => switchyard_mocker::perf::load(path)?,
            None => PerfModel::Polynomial,
        });
    }
    let kv_bytes_per_token = only
        .kv_bytes_per_token
        .unwrap_or_else(|| mocker.kv_transfer.bytes_per_token());
    let workers = config.workers.count;
    let disagg = (config.workers.prefill > 0).then(|| DisaggSim {
        prefill: config.workers.prefill,
        link: kv_link(config),
        kv_bytes_per_token,
    });
    let media = &config.frontend.multimodal;
    let encoders = (media.encoders > 0).then(|| EncoderSim {
        count: media.encoders,
        cost: media.encoder_cost(),
        policy: media.encoder_policy,
        joint: media.joint_routing,
        overlap: media.overlap,
        store_bytes: media.feature_store.cpu_mib.saturating_mul(1 << 20),
        after_prefill: media.feature_store.after_prefill,
    });
    Ok(SimConfig {
        workers,
        engine,
        perf,
        routing: config.frontend.routing(),
        event_delay: only.event_delay,
        eos_token_ids: only.eos_token_ids,
        seed: mocker.seed,
        record_requests: only.record_requests,
        lazy_engines: true,
        faults: FaultConfig {
            kv_bytes_per_token,
            ..only.faults
        },
        planner: None,
        sla_targets: None,
        disagg,
        encoders,
    })
}

/// The link a decode worker pulls KV over, as `workers.mocker.kv_transfer` describes it.
pub fn kv_link(config: &Config) -> Link {
    let transfer = &config.workers.mocker.kv_transfer;
    Link {
        bandwidth: transfer.bandwidth_gbps * 1e9,
        setup: transfer.latency,
    }
}
