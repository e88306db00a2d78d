//! Frontend configuration.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
pub use switchyard_router::MigrationConfig;
use switchyard_router::routing::degradation::DegradationConfig;
use switchyard_router::routing::health::HealthConfig;
use switchyard_router::{AdmissionConfig, InvalidConfig, RouterConfig, RoutingConfig};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FrontendConfig {
    pub host: String,
    pub port: u16,
    /// The model name served (clients send it as `model`).
    pub model: String,
    /// A Hugging Face model directory (tokenizer.json, tokenizer_config.json); none: the
    /// built-in tokenizer named by `builtin_tokenizer`.
    pub tokenizer: Option<PathBuf>,
    /// The tokenizer used without a model directory.
    pub builtin_tokenizer: BuiltinTokenizer,
    /// Context length in tokens; by default the model directory's (or 32,768 when its
    /// files declare none), and 32,768 with a built-in tokenizer.
    pub context_length: Option<u32>,
    /// Completion tokens when a request does not say.
    pub default_max_tokens: u32,
    /// Largest request body accepted (32 MiB: images come inline as base64 `data:` URLs).
    pub max_body_bytes: usize,
    pub connections: ConnectionConfig,
    /// A second listener for `/metrics` and the internal endpoints.
    pub admin: AdminConfig,
    /// API keys, tenants and their limits.
    pub auth: crate::auth::AuthConfig,
    /// Longest prompt accepted, in tokens (below the context length; none: the context).
    pub max_prompt_tokens: Option<u32>,
    /// Largest `max_tokens` accepted (none: what the context leaves).
    pub max_output_tokens: Option<u32>,
    /// Policies and their knobs, the seed, cache views.
    pub router: RouterConfig,
    pub admission: AdmissionConfig,
    pub health: HealthConfig,
    pub degradation: DegradationConfig,
    /// Retries before the first token and moves of streams in flight.
    pub migration: MigrationConfig,
    /// When a request for a decode worker is prefilled on a prefill worker.
    pub disagg: switchyard_router::DisaggConfig,
    /// Media in requests (images).
    pub multimodal: crate::media::MultimodalConfig,
    /// The chat template and the parsers of chat answers (tool calls, reasoning).
    pub chat: crate::tools::ChatConfig,
    /// Stored responses of `/v1/responses` (`previous_response_id`).
    pub responses: crate::responses::ResponsesConfig,
}

/// `frontend.admin`: where `/metrics` and `/v1/internal/*` are served. Without a port, the
/// internal endpoints are not served at all and `/metrics` is on the public port.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdminConfig {
    pub host: String,
    /// 0: any free port.
    pub port: Option<u16>,
}

impl Default for AdminConfig {
    fn default() -> Self {
        AdminConfig {
            host: "127.0.0.1".into(),
            port: None,
        }
    }
}

/// The tokenizers built into the binary.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BuiltinTokenizer {
    /// SmolLM2's 49,152-token BPE and ChatML template: prompts count as on a real model.
    #[default]
    Smollm2,
    /// One token per byte, and generated ids read as English words: token counts equal
    /// UTF-8 lengths, for tests that reason in bytes.
    Bytes,
}

/// Context length when neither the configuration nor the model's files give one.
pub const DEFAULT_CONTEXT_LENGTH: u32 = 32_768;

/// Limits on client connections, so slow or idle clients cannot hold the server's sockets
/// and memory.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ConnectionConfig {
    /// Longest a client may take to send a request's headers, and longest a kept-alive
    /// connection may sit idle between requests.
    #[serde(with = "humantime_serde")]
    pub header_read_timeout: Duration,
    /// Longest a client may take to send a request's body beyond the time its size takes
    /// at `min_body_rate` (408 after).
    #[serde(with = "humantime_serde")]
    pub body_read_timeout: Duration,
    /// The slowest a body may arrive, in bytes per second, past `body_read_timeout`: a body
    /// trickled slower fails however steadily it trickles.
    pub min_body_rate: u64,
    /// Open client connections at most; more are closed as soon as they are accepted.
    pub max_connections: usize,
}

impl Default for ConnectionConfig {
    fn default() -> Self {
        ConnectionConfig {
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(30),
            min_body_rate: 64 * 1024,
            max_connections: 8192,
        }
    }
}

impl Default for FrontendConfig {
    fn default() -> Self {
        FrontendConfig {
            host: "127.0.0.1".into(),
            port: 8000,
            model: "switchyard-mock".into(),
            tokenizer: None,
            builtin_tokenizer: BuiltinTokenizer::default(),
            context_length: None,
            default_max_tokens: 256,
            max_body_bytes: 32 << 20,
            connections: ConnectionConfig::default(),
            admin: AdminConfig::default(),
            auth: crate::auth::AuthConfig::default(),
            max_prompt_tokens: None,
            max_output_tokens: None,
            router: RouterConfig::default(),
            admission: AdmissionConfig::default(),
            health: HealthConfig::default(),
            degradation: DegradationConfig::default(),
            migration: MigrationConfig::default(),
            disagg: switchyard_router::DisaggConfig::default(),
            multimodal: crate::media::MultimodalConfig::default(),
            chat: crate::tools::ChatConfig::default(),
            responses: crate::responses::ResponsesConfig::default(),
        }
    }
}

impl FrontendConfig {
    /// The routing core's settings: the sections it reads, as they are.
    pub fn routing(&self) -> RoutingConfig {
        RoutingConfig {
            router: self.router,
            admission: self.admission,
            health: self.health,
            degradation: self.degradation,
            disagg: self.disagg,
            migration: self.migration,
        }
    }
}

/// What [`FrontendConfig::validate`] found wrong: the key, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidFrontendConfig {
    /// A value under `frontend` itself (the message names the key).
    #[error("{0}")]
    Value(String),
    /// A media section (`frontend.multimodal.*`): the section and its settings' complaint.
    // The media settings' checks report plain text, so the text is all there is to keep.
    #[error("{section}: {message}")]
    Media {
        section: &'static str,
        message: String,
    },
    /// `frontend.multimodal.encoder_cost`.
    #[error("frontend.multimodal.encoder_cost: {0}")]
    EncoderCost(#[source] InvalidConfig),
    /// A routing section (`frontend.router`, `frontend.admission`, ...).
    #[error("frontend.{0}")]
    Routing(#[source] InvalidConfig),
}

impl InvalidFrontendConfig {
    fn value(message: impl Into<String>) -> Self {
        InvalidFrontendConfig::Value(message.into())
    }

    fn media(section: &'static str, message: impl ToString) -> Self {
        InvalidFrontendConfig::Media {
            section,
            message: message.to_string(),
        }
    }
}

impl FrontendConfig {
    /// Checks values serde cannot.
    pub fn validate(&self) -> Result<(), InvalidFrontendConfig> {
        use InvalidFrontendConfig as E;
        if self.model.trim().is_empty() {
            return Err(E::value("frontend.model must not be empty"));
        }
        if self.default_max_tokens == 0 {
            return Err(E::value("frontend.default_max_tokens must be at least 1"));
        }
        self.chat.validate().map_err(E::value)?;
        self.multimodal
            .image
            .validate()
            .map_err(|e| E::media("frontend.multimodal.image", e))?;
        self.multimodal
            .audio
            .validate()
            .map_err(|e| E::media("frontend.multimodal.audio", e))?;
        self.multimodal
            .video
            .validate(&self.multimodal.image)
            .map_err(|e| E::media("frontend.multimodal.video", e))?;
        self.multimodal
            .encoder_cost
            .validate()
            .map_err(E::EncoderCost)?;
        if self.multimodal.fetch_timeout.is_zero() {
            return Err(E::value(
                "frontend.multimodal.fetch_timeout must be longer than zero",
            ));
        }
        if self.multimodal.encode_timeout.is_zero() {
            return Err(E::value(
                "frontend.multimodal.encode_timeout must be longer than zero",
            ));
        }
        let c = &self.connections;
        if c.header_read_timeout.is_zero() || c.body_read_timeout.is_zero() {
            return Err(E::value(
                "frontend.connections.header_read_timeout and body_read_timeout must be longer than zero",
            ));
        }
        if c.max_connections == 0 {
            return Err(E::value(
                "frontend.connections.max_connections must be at least 1",
            ));
        }
        if self.max_body_bytes < 1024 {
            return Err(E::Value(format!(
                "frontend.max_body_bytes must be at least 1024, got {}",
                self.max_body_bytes
            )));
        }
        self.routing().validate().map_err(E::Routing)?;
        Ok(())
    }
}
