//! Frontend configuration.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use switchyard_router::indexer::approx::ApproxConfig;
use switchyard_router::policy::KvPolicyConfig;
use switchyard_router::routing::degradation::DegradationConfig;
use switchyard_router::routing::health::HealthConfig;
use switchyard_router::{
    AdmissionConfig, CacheViewMode, LatencyPolicyConfig, PolicyKind, RouterConfig, RoutingConfig,
};

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
    pub router: RouterSettings,
    pub admission: AdmissionConfig,
    pub health: HealthConfig,
    pub degradation: DegradationConfig,
    pub migration: MigrationConfig,
    /// When a request for a decode worker is prefilled on a prefill worker.
    pub disagg: switchyard_router::DisaggConfig,
    /// Media in requests (images).
    pub multimodal: crate::media::MultimodalConfig,
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
    /// Longest a client may take to send a request's body (408 after).
    #[serde(with = "humantime_serde")]
    pub body_read_timeout: Duration,
    /// Open client connections at most; more are closed as soon as they are accepted.
    pub max_connections: usize,
}

impl Default for ConnectionConfig {
    fn default() -> Self {
        ConnectionConfig {
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(30),
            max_connections: 8192,
        }
    }
}

/// Retries before the first token and migration of streams in flight.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MigrationConfig {
    /// Workers a request may move to after the one it started on (0: none).
    pub max_migrations: u32,
    /// Workers tried for a request before it fails, counting the first.
    pub max_dispatch_attempts: u32,
    /// Longest wait for a worker to accept a request (a worker that never answers is
    /// unreachable).
    #[serde(with = "humantime_serde")]
    pub dispatch_timeout: Duration,
    /// Wait before retrying a request that produced nothing yet, growing by
    /// `backoff_factor` per retry up to `backoff_max`, spread by `backoff_jitter`.
    #[serde(with = "humantime_serde")]
    pub backoff_initial: Duration,
    #[serde(with = "humantime_serde")]
    pub backoff_max: Duration,
    pub backoff_factor: f64,
    pub backoff_jitter: f64,
    /// The fleet-wide budget, a token bucket: each admitted request adds this many moves
    /// to it (the sustained share of requests that may move)…
    pub budget_ratio: f64,
    /// …up to this many, or the number of requests in flight if more (so one failure,
    /// however large, can move everything it caught once); it starts here.
    pub budget_max: f64,
}

impl Default for MigrationConfig {
    fn default() -> Self {
        MigrationConfig {
            max_migrations: 3,
            max_dispatch_attempts: 3,
            dispatch_timeout: Duration::from_secs(3),
            backoff_initial: Duration::from_millis(50),
            backoff_max: Duration::from_secs(2),
            backoff_factor: 1.5,
            backoff_jitter: 0.2,
            budget_ratio: 0.5,
            budget_max: 100.0,
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
            router: RouterSettings::default(),
            admission: AdmissionConfig {
                wait_target: Some(switchyard_router::routing::admission::DEFAULT_WAIT_TARGET),
                busy_kv_threshold: switchyard_router::routing::admission::SERVER_BUSY_KV_THRESHOLD,
                ..AdmissionConfig::default()
            },
            health: HealthConfig::default(),
            degradation: DegradationConfig::default(),
            migration: MigrationConfig::default(),
            disagg: switchyard_router::DisaggConfig::default(),
            multimodal: crate::media::MultimodalConfig::default(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RouterSettings {
    pub policy: PolicyKind,
    /// Weight of prefill work against decode load in the kv policy's cost.
    pub overlap_weight: f64,
    /// Weight of the delay a request's prefill adds to running decodes in the latency
    /// policy's cost.
    pub itl_weight: f64,
    /// Weight of the request's own decoding (its `max_tokens` × the worker's step time
    /// with it) in the latency policy's cost; 0: not counted.
    pub output_weight: f64,
    /// Weight of the delay a request's prefill adds to the first token of the prefill
    /// queued before it, in the latency policy's cost.
    pub queue_delay_weight: f64,
    /// Cost per millisecond by which a worker's decode step with the request would exceed
    /// (1 + decode_tail_margin) × the workers' mean step, in the latency policy's cost.
    pub decode_tail_weight: f64,
    pub decode_tail_margin: f64,
    /// Softmax temperature of the kv policy; 0 picks the cheapest worker.
    pub temperature: f64,
    /// Requests active longer than this are presumed lost and freed.
    #[serde(with = "humantime_serde")]
    pub request_ttl: Duration,
    pub seed: u64,
    /// `auto`: each worker seen through its KV events if it publishes them, else through
    /// what was routed to it; `approximate`: every worker through what was routed to it.
    pub cache_view: CacheViewMode,
    /// How long the approximate view assumes a routed block stays cached.
    #[serde(with = "humantime_serde")]
    pub approx_ttl: Duration,
}

impl Default for RouterSettings {
    fn default() -> Self {
        RouterSettings {
            policy: PolicyKind::Latency,
            overlap_weight: 1.0,
            itl_weight: LatencyPolicyConfig::default().itl_weight,
            output_weight: LatencyPolicyConfig::default().output_weight,
            queue_delay_weight: LatencyPolicyConfig::default().queue_delay_weight,
            decode_tail_weight: LatencyPolicyConfig::default().decode_tail_weight,
            decode_tail_margin: LatencyPolicyConfig::default().decode_tail_margin,
            temperature: 0.0,
            request_ttl: Duration::from_secs(600),
            seed: 0,
            cache_view: CacheViewMode::Auto,
            approx_ttl: ApproxConfig::default().ttl,
        }
    }
}

impl FrontendConfig {
    /// The routing core's settings.
    pub fn routing(&self) -> RoutingConfig {
        let r = &self.router;
        RoutingConfig {
            router: RouterConfig {
                policy: r.policy,
                kv: KvPolicyConfig {
                    overlap_weight: r.overlap_weight,
                    temperature: r.temperature,
                },
                latency: LatencyPolicyConfig {
                    itl_weight: r.itl_weight,
                    output_weight: r.output_weight,
                    queue_delay_weight: r.queue_delay_weight,
                    decode_tail_weight: r.decode_tail_weight,
                    decode_tail_margin: r.decode_tail_margin,
                    temperature: r.temperature,
                },
                request_ttl: r.request_ttl,
                seed: r.seed,
                ..RouterConfig::default()
            },
            cache_view: r.cache_view,
            approx: ApproxConfig {
                ttl: r.approx_ttl,
                ..ApproxConfig::default()
            },
            admission: self.admission,
            health: self.health,
            degradation: self.degradation,
            disagg: self.disagg,
        }
    }
}

impl FrontendConfig {
    /// Checks values serde cannot.
    pub fn validate(&self) -> Result<(), String> {
        if self.model.trim().is_empty() {
            return Err("frontend.model must not be empty".into());
        }
        if self.default_max_tokens == 0 {
            return Err("frontend.default_max_tokens must be at least 1".into());
        }
        self.multimodal
            .image
            .validate()
            .map_err(|e| format!("frontend.multimodal.image: {e}"))?;
        self.multimodal
            .audio
            .validate()
            .map_err(|e| format!("frontend.multimodal.audio: {e}"))?;
        self.multimodal
            .video
            .validate(&self.multimodal.image)
            .map_err(|e| format!("frontend.multimodal.video: {e}"))?;
        self.multimodal
            .encoder_cost
            .validate()
            .map_err(|e| format!("frontend.multimodal.encoder_cost: {e}"))?;
        if self.multimodal.fetch_timeout.is_zero() {
            return Err("frontend.multimodal.fetch_timeout must be longer than zero".into());
        }
        if self.multimodal.encode_timeout.is_zero() {
            return Err("frontend.multimodal.encode_timeout must be longer than zero".into());
        }
        let c = &self.connections;
        if c.header_read_timeout.is_zero() || c.body_read_timeout.is_zero() {
            return Err(
                "frontend.connections.header_read_timeout and body_read_timeout must be longer than zero"
                    .into(),
            );
        }
        if c.max_connections == 0 {
            return Err("frontend.connections.max_connections must be at least 1".into());
        }
        if self.max_body_bytes < 1024 {
            return Err(format!(
                "frontend.max_body_bytes must be at least 1024, got {}",
                self.max_body_bytes
            ));
        }
        let r = &self.router;
        if !(r.overlap_weight.is_finite() && r.overlap_weight >= 0.0) {
            return Err(format!(
                "frontend.router.overlap_weight must be a non-negative number, got {}",
                r.overlap_weight
            ));
        }
        if !(r.temperature.is_finite() && r.temperature >= 0.0) {
            return Err(format!(
                "frontend.router.temperature must be a non-negative number, got {}",
                r.temperature
            ));
        }
        let a = &self.admission;
        if !(a.busy_kv_threshold > 0.0 && a.busy_kv_threshold <= 1.0) {
            return Err(format!(
                "frontend.admission.busy_kv_threshold must be in (0, 1], got {}",
                a.busy_kv_threshold
            ));
        }
        if !(a.busy_prefill_share.is_finite() && a.busy_prefill_share > 0.0) {
            return Err(format!(
                "frontend.admission.busy_prefill_share must be a number above 0, got {}",
                a.busy_prefill_share
            ));
        }
        if a.max_queue == 0 {
            return Err("frontend.admission.max_queue must be at least 1".into());
        }
        if r.approx_ttl.is_zero() {
            return Err("frontend.router.approx_ttl must be longer than zero".into());
        }
        self.health
            .validate()
            .map_err(|e| format!("frontend.{e}"))?;
        let m = &self.migration;
        if m.max_dispatch_attempts == 0 {
            return Err("frontend.migration.max_dispatch_attempts must be at least 1".into());
        }
        if !(m.backoff_factor >= 1.0 && (0.0..1.0).contains(&m.backoff_jitter)) {
            return Err(
                "frontend.migration.backoff_factor must be at least 1 and backoff_jitter in [0, 1)"
                    .into(),
            );
        }
        if !(m.budget_ratio >= 0.0 && m.budget_max >= 0.0) {
            return Err(
                "frontend.migration.budget_ratio and budget_max must not be negative".into(),
            );
        }
        if m.dispatch_timeout.is_zero() {
            return Err("frontend.migration.dispatch_timeout must be longer than zero".into());
        }
        Ok(())
    }
}
