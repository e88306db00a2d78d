//! `switchyard serve`: the frontend and a fleet of in-process workers, no external service.

use std::collections::BTreeMap;

use anyhow::Result;
use clap::Args;
use switchyard::config::{self, EngineKind};
use switchyard::deploy;

use super::flags::{FrontendFlags, Overlay};

#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    frontend: FrontendFlags,
    /// Number of in-process workers.
    #[arg(long)]
    workers: Option<u32>,
    /// Disaggregated serving: this many of the workers compute prompts, the others decode.
    #[arg(long)]
    prefill_workers: Option<u32>,
    /// The engine the workers run.
    #[arg(long, value_enum)]
    engine: Option<EngineKind>,
    /// Mocker time runs this many times faster than the timing model.
    #[arg(long)]
    speedup_ratio: Option<f64>,
    /// A measured timing profile (JSON or NPZ; `switchyard profile` writes one): the
    /// mocker's timing instead of the polynomial model; the candle engine's announced
    /// timing (what routers predict it with) and prompt chunk size.
    #[arg(long)]
    perf_profile: Option<std::path::PathBuf>,
}

impl ServeArgs {
    /// The flags given, as a configuration overlay.
    fn overlay(&self) -> toml::Table {
        let mut o = Overlay::default();
        self.frontend.apply(&mut o);
        o.set_some(&["workers", "count"], self.workers.map(i64::from));
        o.set_some(&["workers", "prefill"], self.prefill_workers.map(i64::from));
        o.engine(self.engine);
        o.candle_model(self.engine, self.frontend.model());
        o.set_some(&["workers", "mocker", "speedup_ratio"], self.speedup_ratio);
        for engine in ["mocker", "candle"] {
            o.set_some(
                &["workers", engine, "perf_profile"],
                self.perf_profile.as_ref().map(|p| p.display().to_string()),
            );
        }
        o.0
    }
}

pub fn run(args: ServeArgs, env: &BTreeMap<String, String>) -> Result<()> {
    let config = config::load(args.frontend.config.as_deref(), env, args.overlay())?;
    let _telemetry = crate::logging::init(&config.log, "switchyard")?;
    tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(async {
        let deployment = deploy::start_local(config.clone()).await?;
        let address = deployment.address;
        let split = match config.workers.prefill {
            0 => String::new(),
            p => format!(
                " ({p} prefill, {} decode)",
                config.workers.count - p
            ),
        };
        println!(
            "Switchyard is serving `{}` on http://{address} with {} {:?} workers{split}.{}",
            config.frontend.model,
            config.workers.count,
            config.workers.engine,
            admin_note(deployment.admin_address)
        );
        println!(
            "Try: curl http://{address}/v1/chat/completions -H 'Content-Type: application/json' -d '{{\"model\": \"{}\", \"messages\": [{{\"role\": \"user\", \"content\": \"Hello!\"}}], \"max_tokens\": 32}}'",
            config.frontend.model
        );
        crate::signals::terminated().await;
        tracing::info!("shutting down");
        deployment.shutdown(deploy::SHUTDOWN_GRACE).await
    })
}

/// How the first line announces the admin listener (tests read it from there).
pub(crate) fn admin_note(admin: Option<std::net::SocketAddr>) -> String {
    admin
        .map(|a| format!(" Metrics and internal endpoints on admin http://{a}."))
        .unwrap_or_default()
}
