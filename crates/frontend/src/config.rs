//! Frontend configuration.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use switchyard_router::indexer::approx::ApproxConfig;
use switchyard_router::policy::KvPolicyConfig;
use switchyard_router::{AdmissionConfig, CacheViewMode, PolicyKind, RouterConfig, RoutingConfig};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FrontendConfig {
    pub host: String,
    pub port: u16,
    /// The model name served (clients send it as `model`).
    pub model: String,
    /// A Hugging Face model directory (tokenizer.json, tokenizer_config.json); none: the
    /// built-in byte-level tokenizer and template.
    pub tokenizer: Option<PathBuf>,
    /// Context length in tokens; by default the model's, or 32,768 with the built-in tokenizer.
    pub context_length: Option<u32>,
    /// Completion tokens when a request does not say.
    pub default_max_tokens: u32,
    /// Largest request body accepted.
    pub max_body_bytes: usize,
    pub router: RouterSettings,
    pub admission: AdmissionConfig,
}

impl Default for FrontendConfig {
    fn default() -> Self {
        FrontendConfig {
            host: "127.0.0.1".into(),
            port: 8000,
            model: "switchyard-mock".into(),
            tokenizer: None,
            context_length: None,
            default_max_tokens: 256,
            max_body_bytes: 4 << 20,
            router: RouterSettings::default(),
            admission: AdmissionConfig::default(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RouterSettings {
    pub policy: PolicyKind,
    /// Weight of prefill work against decode load in the kv policy's cost.
    pub overlap_weight: f64,
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
            policy: PolicyKind::Kv,
            overlap_weight: 1.0,
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
        if a.max_queue == 0 {
            return Err("frontend.admission.max_queue must be at least 1".into());
        }
        if r.approx_ttl.is_zero() {
            return Err("frontend.router.approx_ttl must be longer than zero".into());
        }
        Ok(())
    }
}
