//! Command-line flags as a configuration overlay (the last layer of `config::load`), and the
//! flags more than one command takes.

use std::path::PathBuf;

use clap::Args;
use switchyard::config::{self, EngineKind, LogFormat};
use switchyard_router::PolicyKind;

/// A configuration overlay under construction.
#[derive(Debug, Default)]
pub struct Overlay(pub toml::Table);

impl Overlay {
    pub fn set(&mut self, path: &[&str], value: impl Into<toml::Value>) {
        let path: Vec<String> = path.iter().map(|s| s.to_string()).collect();
        config::insert(&mut self.0, &path, value.into());
    }

    pub fn set_some<T: Into<toml::Value>>(&mut self, path: &[&str], value: Option<T>) {
        if let Some(value) = value {
            self.set(path, value);
        }
    }

    pub fn engine(&mut self, engine: Option<EngineKind>) {
        self.set_some(&["workers", "engine"], engine.map(EngineKind::name));
    }

    /// `--engine candle --model PATH.gguf`: the model file, served under its file name.
    pub fn candle_model(&mut self, engine: Option<EngineKind>, model: Option<&str>) {
        let (Some(EngineKind::Candle), Some(path)) = (engine, model) else {
            return;
        };
        self.set(&["workers", "candle", "model"], path);
        let name = std::path::Path::new(path)
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| path.to_owned());
        self.set(&["frontend", "model"], name);
    }
}

/// The frontend's own flags (`serve` and `frontend`).
#[derive(Debug, Args)]
pub struct FrontendFlags {
    /// A TOML configuration file (see docs/configuration.md).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Address to listen on.
    #[arg(long)]
    host: Option<String>,
    /// Port to listen on (0: any free port).
    #[arg(long)]
    port: Option<u16>,
    /// The model name served.
    #[arg(long)]
    model: Option<String>,
    /// A Hugging Face model directory for the tokenizer and chat template (default: the
    /// built-in SmolLM2 tokenizer).
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// A Jinja chat template file used instead of the model's.
    #[arg(long, value_name = "FILE")]
    chat_template: Option<PathBuf>,
    /// How the model writes tool calls (`qwen`, `llama`, `mistral`, `deepseek`, `harmony`, ...;
    /// default: from the model's name, else `qwen`).
    #[arg(long, value_name = "NAME")]
    tool_call_parser: Option<String>,
    /// How the model marks its reasoning (`deepseek_r1`, `qwen3`, ...; default: from the
    /// model's name, else none).
    #[arg(long, value_name = "NAME")]
    reasoning_parser: Option<String>,
    /// The model's context length in tokens (default: the model directory's, else 32,768).
    #[arg(long)]
    context_length: Option<u32>,
    /// Routing policy.
    #[arg(long)]
    policy: Option<PolicyKind>,
    /// Require this API key (`Authorization: Bearer KEY`); repeat for several keys.
    #[arg(long = "api-key", value_name = "KEY")]
    api_keys: Vec<String>,
    /// A TOML file of API keys with tenants, priority tiers and limits.
    #[arg(long, value_name = "FILE")]
    api_keys_file: Option<PathBuf>,
    /// Serve `/metrics` and the internal endpoints on this port (of `frontend.admin.host`,
    /// 127.0.0.1 by default) instead of the public one; 0: any free port.
    #[arg(long)]
    admin_port: Option<u16>,
    #[command(flatten)]
    pub log: LogFlags,
}

/// How a service logs (every command that runs one).
#[derive(Debug, Args)]
pub struct LogFlags {
    /// `text`, or `json`: one object per line, for log collectors.
    #[arg(long, value_enum)]
    log_format: Option<LogFormat>,
}

impl LogFlags {
    pub fn apply(&self, o: &mut Overlay) {
        o.set_some(&["log", "format"], self.log_format.map(LogFormat::name));
    }
}

impl FrontendFlags {
    /// The `--model` given.
    pub fn model(&self) -> Option<&str> {
        self.model.as_deref()
    }

    pub fn apply(&self, o: &mut Overlay) {
        o.set_some(&["frontend", "host"], self.host.clone());
        o.set_some(&["frontend", "port"], self.port.map(i64::from));
        o.set_some(&["frontend", "model"], self.model.clone());
        o.set_some(
            &["frontend", "tokenizer"],
            self.tokenizer.as_ref().map(|t| t.display().to_string()),
        );
        o.set_some(
            &["frontend", "chat", "template"],
            self.chat_template.as_ref().map(|t| t.display().to_string()),
        );
        o.set_some(
            &["frontend", "chat", "tool_call_parser"],
            self.tool_call_parser.clone(),
        );
        o.set_some(
            &["frontend", "chat", "reasoning_parser"],
            self.reasoning_parser.clone(),
        );
        o.set_some(
            &["frontend", "context_length"],
            self.context_length.map(i64::from),
        );
        o.set_some(
            &["frontend", "router", "policy"],
            self.policy.map(|p| p.name()),
        );
        if !self.api_keys.is_empty() {
            o.set(&["frontend", "auth", "api_keys"], self.api_keys.clone());
        }
        o.set_some(
            &["frontend", "auth", "keys_file"],
            self.api_keys_file.as_ref().map(|p| p.display().to_string()),
        );
        o.set_some(
            &["frontend", "admin", "port"],
            self.admin_port.map(i64::from),
        );
        self.log.apply(o);
    }
}
