//! API keys: who may call the public API, as which tenant, at what priority and how fast.
//!
//! Off unless keys are configured (`frontend.auth.api_keys`, `--api-key`, or a keys file).
//! With keys, every `/v1/*` request needs `Authorization: Bearer KEY` (401 otherwise).
//! Each key names a tenant (the `tenant` label of the tenant metrics), the highest priority
//! tier its requests get, and optional limits: requests and tokens per minute (token
//! buckets: a key may burst its whole minute, then refills steadily; 429 with
//! `Retry-After` when empty) and concurrent requests (429 while at the limit).

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use serde::{Deserialize, Serialize};
use switchyard_core::Priority;

use crate::openai::ApiError;
use crate::pipeline::Frontend;

/// `frontend.auth`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthConfig {
    /// Keys with no limits, tenant `default`, any priority.
    pub api_keys: Vec<String>,
    /// A TOML file of `[[keys]]` entries (see [`KeySpec`]).
    pub keys_file: Option<PathBuf>,
}

/// One key of a keys file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeySpec {
    pub key: String,
    #[serde(default = "default_tenant")]
    pub tenant: String,
    /// The highest tier the key's requests get: a request asking for more is lowered to it,
    /// one asking for nothing gets it.
    pub priority: Option<Priority>,
    pub requests_per_minute: Option<NonZeroU32>,
    /// Prompt tokens plus the completion tokens a request may generate (`max_tokens`).
    pub tokens_per_minute: Option<NonZeroU32>,
    pub max_concurrent: Option<NonZeroU32>,
}

fn default_tenant() -> String {
    "default".into()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct KeysFile {
    keys: Vec<KeySpec>,
}

/// A key's tenant, tier and limit state.
#[derive(Debug)]
pub struct KeyState {
    pub tenant: Arc<str>,
    pub priority: Option<Priority>,
    requests: Option<DefaultDirectRateLimiter>,
    tokens: Option<DefaultDirectRateLimiter>,
    tokens_per_minute: Option<NonZeroU32>,
    max_concurrent: Option<NonZeroU32>,
    active: AtomicU32,
}

/// The configured keys; empty means the API is open.
#[derive(Debug, Default)]
pub struct KeyTable {
    keys: HashMap<String, Arc<KeyState>>,
}

#[derive(Debug, thiserror::Error)]
pub enum AuthConfigError {
    #[error("cannot read the keys file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    Parse {
        path: PathBuf,
        source: toml::de::Error,
    },
    #[error("{origin}: an API key must not be empty")]
    Empty { origin: String },
    #[error("{origin}: the API key ending in `{tail}` is given twice")]
    Duplicate { origin: String, tail: String },
}

impl KeyTable {
    pub fn from_config(config: &AuthConfig) -> Result<Self, AuthConfigError> {
        let mut specs: Vec<(String, KeySpec)> = config
            .api_keys
            .iter()
            .map(|key| {
                let spec = KeySpec {
                    key: key.clone(),
                    tenant: default_tenant(),
                    priority: None,
                    requests_per_minute: None,
                    tokens_per_minute: None,
                    max_concurrent: None,
                };
                ("frontend.auth.api_keys".to_string(), spec)
            })
            .collect();
        if let Some(path) = &config.keys_file {
            let origin = path.display().to_string();
            specs.extend(
                read_keys_file(path)?
                    .into_iter()
                    .map(|k| (origin.clone(), k)),
            );
        }
        let mut keys = HashMap::with_capacity(specs.len());
        for (origin, spec) in specs {
            if spec.key.is_empty() {
                return Err(AuthConfigError::Empty { origin });
            }
            let state = KeyState::new(&spec);
            if keys.insert(spec.key.clone(), Arc::new(state)).is_some() {
                let tail: String = spec.key.chars().rev().take(4).collect();
                return Err(AuthConfigError::Duplicate {
                    origin,
                    tail: tail.chars().rev().collect(),
                });
            }
        }
        Ok(KeyTable { keys })
    }

    pub fn is_enabled(&self) -> bool {
        !self.keys.is_empty()
    }

    fn get(&self, key: &str) -> Option<&Arc<KeyState>> {
        self.keys.get(key)
    }
}

fn read_keys_file(path: &Path) -> Result<Vec<KeySpec>, AuthConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| AuthConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    let file: KeysFile = toml::from_str(&text).map_err(|source| AuthConfigError::Parse {
        path: path.to_owned(),
        source,
    })?;
    Ok(file.keys)
}

/// A bucket that holds a minute's worth and refills over the minute.
fn per_minute(n: NonZeroU32) -> DefaultDirectRateLimiter {
    RateLimiter::direct(Quota::per_minute(n).allow_burst(n))
}

impl KeyState {
    fn new(spec: &KeySpec) -> Self {
        KeyState {
            tenant: spec.tenant.as_str().into(),
            priority: spec.priority,
            requests: spec.requests_per_minute.map(per_minute),
            tokens: spec.tokens_per_minute.map(per_minute),
            tokens_per_minute: spec.tokens_per_minute,
            max_concurrent: spec.max_concurrent,
            active: AtomicU32::new(0),
        }
    }

    /// The tier a request asking for `asked` gets.
    pub fn priority(&self, asked: Option<Priority>) -> Priority {
        match (asked, self.priority) {
            (Some(asked), Some(cap)) => asked.min(cap),
            (Some(asked), None) => asked,
            (None, Some(cap)) => cap,
            (None, None) => Priority::default(),
        }
    }

    /// Takes `tokens` from the key's token bucket, or says how long until it holds them.
    pub fn charge_tokens(&self, tokens: u32) -> Result<(), ApiError> {
        let (Some(bucket), Some(per_minute)) = (&self.tokens, self.tokens_per_minute) else {
            return Ok(());
        };
        let Some(n) = NonZeroU32::new(tokens) else {
            return Ok(());
        };
        match bucket.check_n(n) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(not_until)) => Err(limited(
                "tokens_per_minute",
                not_until.wait_time_from(DefaultClock::default().now()),
            )),
            Err(_) => Err(ApiError::invalid(format!(
                "This request may use {tokens} tokens, more than this API key's limit of \
                 {per_minute} tokens per minute; lower `max_tokens` or `n`, or shorten the prompt."
            ))),
        }
    }
}

fn limited(limit: &str, wait: Duration) -> ApiError {
    // Retry-After is in whole seconds: round up, so a client that waits that long finds room.
    let wait = Duration::from_secs(wait.as_secs() + u64::from(wait.subsec_nanos() > 0));
    ApiError::rate_limited(format!("This API key is over its {limit}."), wait)
}

/// What the middleware hands to the handlers of an authenticated request.
#[derive(Debug, Clone)]
pub struct Grant(pub Arc<KeyState>);

/// Frees a concurrency slot when the response (its body included) is done.
#[derive(Debug)]
struct Slot(Arc<KeyState>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The middleware in front of the public `/v1/*` routes.
pub async fn authenticate(
    State(frontend): State<Arc<Frontend>>,
    mut request: Request,
    next: Next,
) -> Response {
    let keys = &frontend.keys;
    if !keys.is_enabled() {
        return next.run(request).await;
    }
    let presented = request
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim);
    let Some(state) = presented.and_then(|key| keys.get(key)).cloned() else {
        frontend.metrics.count_tenant("", "unauthorized");
        let message = if presented.is_some() {
            "Incorrect API key provided."
        } else {
            "You didn't provide an API key: send it as `Authorization: Bearer KEY`."
        };
        return ApiError::unauthorized(message).into_response();
    };
    let slot = match state.max_concurrent {
        Some(max) => {
            let before = state.active.fetch_add(1, Ordering::AcqRel);
            let slot = Slot(Arc::clone(&state));
            if before >= max.get() {
                frontend
                    .metrics
                    .count_tenant(&state.tenant, "max_concurrent");
                return ApiError::rate_limited(
                    format!("This API key already has {max} requests in flight, its limit."),
                    Duration::from_secs(1),
                )
                .into_response();
            }
            Some(slot)
        }
        None => None,
    };
    // After the concurrency check: a request refused for one limit spends no other's
    // budget (the slot it took is freed with it).
    if let Some(bucket) = &state.requests
        && let Err(not_until) = bucket.check()
    {
        frontend
            .metrics
            .count_tenant(&state.tenant, "requests_per_minute");
        let wait = not_until.wait_time_from(DefaultClock::default().now());
        return limited("requests_per_minute", wait).into_response();
    }
    request.extensions_mut().insert(Grant(Arc::clone(&state)));
    let response = next.run(request).await;
    frontend.metrics.count_tenant(
        &state.tenant,
        if response.status().is_success() {
            "accepted"
        } else {
            "refused"
        },
    );
    match slot {
        None => response,
        // The slot lives as long as the body: a stream holds it until it ends.
        Some(slot) => response.map(|body| {
            axum::body::Body::from_stream(futures::StreamExt::map(
                body.into_data_stream(),
                move |chunk| {
                    let _held = &slot;
                    chunk
                },
            ))
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(priority: Option<Priority>) -> KeySpec {
        KeySpec {
            key: "k".into(),
            tenant: "t".into(),
            priority,
            requests_per_minute: None,
            tokens_per_minute: NonZeroU32::new(10),
            max_concurrent: None,
        }
    }

    #[test]
    fn a_key_tier_caps_and_defaults_the_priority() {
        let capped = KeyState::new(&spec(Some(Priority::Standard)));
        assert_eq!(capped.priority(Some(Priority::Premium)), Priority::Standard);
        assert_eq!(
            capped.priority(Some(Priority::BestEffort)),
            Priority::BestEffort
        );
        assert_eq!(capped.priority(None), Priority::Standard);
        let open = KeyState::new(&spec(None));
        assert_eq!(open.priority(Some(Priority::Premium)), Priority::Premium);
        assert_eq!(open.priority(None), Priority::default());
    }

    #[test]
    fn the_token_bucket_holds_a_minute_and_refuses_what_never_fits() {
        let key = KeyState::new(&spec(None));
        assert!(key.charge_tokens(6).is_ok());
        assert!(key.charge_tokens(4).is_ok());
        let over = key.charge_tokens(1).unwrap_err();
        assert_eq!(over.status.as_u16(), 429);
        let never = key.charge_tokens(11).unwrap_err();
        assert_eq!(never.status.as_u16(), 400);
    }

    #[test]
    fn duplicate_and_empty_keys_are_configuration_errors() {
        let config = AuthConfig {
            api_keys: vec!["sk-same".into(), "sk-same".into()],
            keys_file: None,
        };
        let error = KeyTable::from_config(&config).unwrap_err().to_string();
        assert!(
            error.contains("given twice") && error.contains("same"),
            "{error}"
        );
        assert!(
            !error.contains("sk-same"),
            "the key itself is not echoed: {error}"
        );
        let config = AuthConfig {
            api_keys: vec![String::new()],
            keys_file: None,
        };
        assert!(KeyTable::from_config(&config).is_err());
        assert!(
            !KeyTable::from_config(&AuthConfig::default())
                .unwrap()
                .is_enabled()
        );
    }
}
