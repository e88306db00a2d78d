//! `switchyard serve`: the frontend and a fleet of in-process workers, no external service.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use switchyard::config::{self, EngineKind};
use switchyard::deploy;
use switchyard_router::PolicyKind;

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// A TOML configuration file (see docs/configuration.md).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Address to listen on.
    #[arg(long)]
    host: Option<String>,
    /// Port to listen on (0: any free port).
    #[arg(long)]
    port: Option<u16>,
    /// The model name to serve.
    #[arg(long)]
    model: Option<String>,
    /// Number of in-process workers.
    #[arg(long)]
    workers: Option<u32>,
    /// The engine the workers run.
    #[arg(long, value_enum)]
    engine: Option<EngineKind>,
    /// A Hugging Face model directory for the tokenizer and chat template.
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// Routing policy.
    #[arg(long)]
    policy: Option<PolicyKind>,
    /// Mocker time runs this many times faster than the timing model.
    #[arg(long)]
    speedup_ratio: Option<f64>,
}

impl ServeArgs {
    /// The flags given, as a configuration overlay.
    fn overlay(&self) -> toml::Table {
        let mut table = toml::Table::new();
        let mut set = |path: &[&str], value: toml::Value| {
            let path: Vec<String> = path.iter().map(|s| s.to_string()).collect();
            config::insert(&mut table, &path, value);
        };
        if let Some(host) = &self.host {
            set(&["frontend", "host"], host.clone().into());
        }
        if let Some(port) = self.port {
            set(&["frontend", "port"], i64::from(port).into());
        }
        if let Some(model) = &self.model {
            set(&["frontend", "model"], model.clone().into());
        }
        if let Some(tokenizer) = &self.tokenizer {
            set(
                &["frontend", "tokenizer"],
                tokenizer.display().to_string().into(),
            );
        }
        if let Some(policy) = self.policy {
            set(&["frontend", "router", "policy"], policy.name().into());
        }
        if let Some(n) = self.workers {
            set(&["workers", "count"], i64::from(n).into());
        }
        if let Some(engine) = self.engine {
            set(
                &["workers", "engine"],
                (if engine == EngineKind::Echo {
                    "echo"
                } else {
                    "mocker"
                })
                .into(),
            );
        }
        if let Some(ratio) = self.speedup_ratio {
            set(&["workers", "mocker", "speedup_ratio"], ratio.into());
        }
        table
    }
}

pub fn run(args: ServeArgs, env: &BTreeMap<String, String>) -> Result<()> {
    let config = config::load(args.config.as_deref(), env, args.overlay())?;
    crate::logging::init(&config.log.level)?;
    tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(async {
        let deployment = deploy::start_local(config.clone()).await?;
        let address = deployment.address;
        println!(
            "Switchyard is serving `{}` on http://{address} with {} {:?} workers.",
            config.frontend.model, config.workers.count, config.workers.engine
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
