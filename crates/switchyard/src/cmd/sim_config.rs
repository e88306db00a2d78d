//! The simulator's settings from the configuration tree `serve` reads: the fleet from
//! `[workers]` (its size, prefill/decode split, the mocker's engine, timing and KV link),
//! the routing from `[frontend]` as it is, the encoders from `[frontend.multimodal]`; what
//! only a simulation has from `switchyard sim`'s flags.

use anyhow::{Context, Result};
use switchyard::config::Config;
use switchyard_mocker::PerfModel;
use switchyard_sim::{DisaggSim, EncoderSim, FaultConfig, Link, SimConfig};

use super::sim::SimArgs;

/// The simulator's settings for `config`, with the flags' simulation-only parts.
pub(super) fn sim_config(config: &Config, args: &SimArgs) -> Result<SimConfig> {
    let mocker = &config.workers.mocker;
    let mut engine = mocker.args;
    // The simulator runs in model time: the engines' own speedup is for real-time serving.
    engine.speedup_ratio = 1.0;
    engine.validate().context("invalid engine arguments")?;
    let mut perf = Vec::new();
    for path in args.perf_profiles() {
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
    let kv_bytes_per_token = args
        .model_shape()
        .map_or(mocker.kv_transfer.bytes_per_token(), |s| {
            s.kv_bytes_per_token()
        });
    let (faults, mtbf, repair, crash_detection) = args.faults();
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
    });
    Ok(SimConfig {
        workers,
        engine,
        perf,
        routing: config.frontend.routing(),
        event_delay: args.event_delay(),
        eos_token_ids: args.eos_token_ids().to_vec(),
        seed: mocker.seed,
        record_requests: args.requests_out.is_some(),
        lazy_engines: true,
        faults: FaultConfig {
            schedule: faults.to_vec(),
            mtbf,
            repair,
            crash_detection,
            link: args.kv_link(),
            kv_bytes_per_token,
        },
        planner: None,
        sla_targets: None,
        disagg,
        encoders,
    })
}

/// The link a decode worker pulls KV over, as `workers.mocker.kv_transfer` describes it.
pub(super) fn kv_link(config: &Config) -> Link {
    let transfer = &config.workers.mocker.kv_transfer;
    Link {
        bandwidth: transfer.bandwidth_gbps * 1e9,
        setup: transfer.latency,
    }
}
