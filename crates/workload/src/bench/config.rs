//! What a benchmark sends, how fast, and when it stops.

use std::time::Duration;

use reqwest::Url;
use serde_json::{Map, Value};
use switchyard_core::trace::MooncakeRecord;

use super::BenchError;

/// Extra JSON fields for every request body.
pub type ExtraBody = Map<String, Value>;

/// The OpenAI API the requests go to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `/v1/chat/completions`, the prompt as one user message.
    Chat,
    /// `/v1/completions`, the prompt as is.
    Completions,
}

/// When requests are sent.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LoadShape {
    /// Open loop at the trace's timestamps divided by `speedup`.
    Replay { speedup: f64 },
    /// Open loop with exponential gaps: `rate` requests per second on average.
    Poisson { rate: f64 },
    /// Closed loop: `clients` requests in flight, each sent when the previous one ends.
    Concurrency { clients: usize },
}

/// Where prompts and output lengths come from.
#[derive(Debug, Clone)]
pub enum RequestSource {
    /// Mooncake rows: prompts synthesised from hash ids (`block_size` tokens each), output
    /// lengths from `output_length`. Poisson and concurrency runs longer than the trace
    /// start over from its first row.
    Trace {
        records: Vec<MooncakeRecord>,
        block_size: u32,
    },
    /// Every request a fresh prompt of `input_tokens`, asking for `output_tokens`.
    Synthetic {
        input_tokens: u64,
        output_tokens: u64,
    },
}

/// Service-level objectives for goodput: a request counts when it succeeded and met each
/// objective that is set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Slo {
    /// Time to first token.
    pub ttft: Option<Duration>,
    /// Mean inter-token latency of the request.
    pub itl: Option<Duration>,
}

impl Slo {
    pub fn is_set(&self) -> bool {
        self.ttft.is_some() || self.itl.is_some()
    }
}

/// A whole benchmark run.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    /// Server base URL (`http://host:8000` or `…/v1`), or a full `…/completions` URL.
    pub url: String,
    pub model: String,
    pub endpoint: Endpoint,
    /// Ask for a server-sent-event stream (needed for TTFT and ITL).
    pub stream: bool,
    pub source: RequestSource,
    pub shape: LoadShape,
    /// Send at most this many requests.
    pub max_requests: Option<usize>,
    /// Send no request after this long; requests in flight then still finish.
    pub duration: Option<Duration>,
    pub slo: Slo,
    /// Deadline of one request, from connecting to the last byte.
    pub request_timeout: Duration,
    pub api_key: Option<String>,
    /// Add `"ignore_eos": true` (vLLM, SGLang) so outputs reach their requested length.
    pub ignore_eos: bool,
    /// Extra JSON fields merged into every request body (they win over ours).
    pub extra_body: ExtraBody,
    /// Salts prompt text (the same seed gives the same text for the same hash ids) and
    /// seeds Poisson arrivals.
    pub seed: u64,
    /// Draw a progress bar (only ever on a terminal).
    pub show_progress: bool,
}

/// Requests sent when neither a count nor a duration bounds a run with no natural end.
pub const DEFAULT_MAX_REQUESTS: usize = 100;

impl BenchConfig {
    /// A config with defaults for everything but where to send.
    pub fn new(url: impl Into<String>, model: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            model: model.into(),
            endpoint: Endpoint::Chat,
            stream: true,
            source: RequestSource::Synthetic {
                input_tokens: 512,
                output_tokens: 128,
            },
            shape: LoadShape::Concurrency { clients: 1 },
            max_requests: None,
            duration: None,
            slo: Slo::default(),
            request_timeout: Duration::from_secs(600),
            api_key: None,
            ignore_eos: false,
            extra_body: Map::new(),
            seed: 0,
            show_progress: false,
        }
    }

    /// The request count bound in force: the one given; else, with no duration either, one
    /// pass over the trace or [`DEFAULT_MAX_REQUESTS`]; else none. A replay never goes past
    /// the end of its trace.
    pub fn request_limit(&self) -> Option<usize> {
        let trace_len = match &self.source {
            RequestSource::Trace { records, .. } => Some(records.len()),
            RequestSource::Synthetic { .. } => None,
        };
        let replay_len = match self.shape {
            LoadShape::Replay { .. } => trace_len,
            _ => None,
        };
        let limit = match (self.max_requests, self.duration) {
            (Some(n), _) => Some(n),
            (None, Some(_)) => None,
            (None, None) => Some(trace_len.unwrap_or(DEFAULT_MAX_REQUESTS)),
        };
        match (limit, replay_len) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The endpoint URL requests are posted to.
    pub fn endpoint_url(&self) -> Result<Url, BenchError> {
        let mut url = Url::parse(&self.url)
            .map_err(|e| invalid(format!("--url {:?} is not a URL: {e}", self.url)))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(invalid(format!(
                "--url {:?} must be http:// or https://",
                self.url
            )));
        }
        let path = url.path().trim_end_matches('/').to_string();
        if path.ends_with("/completions") {
            return Ok(url);
        }
        let tail = match self.endpoint {
            Endpoint::Chat => "chat/completions",
            Endpoint::Completions => "completions",
        };
        let full = if path.ends_with("/v1") {
            format!("{path}/{tail}")
        } else {
            format!("{path}/v1/{tail}")
        };
        url.set_path(&full);
        Ok(url)
    }

    /// Rejects settings that cannot give a meaningful run, naming the CLI flag.
    pub fn validate(&self) -> Result<(), BenchError> {
        self.endpoint_url()?;
        if self.model.trim().is_empty() {
            return Err(invalid("--model must not be empty"));
        }
        match self.shape {
            LoadShape::Replay { speedup } => {
                if !matches!(self.source, RequestSource::Trace { .. }) {
                    return Err(invalid(
                        "trace replay needs --trace; without one, set --rate or --concurrency",
                    ));
                }
                positive("--speedup", speedup)?;
            }
            LoadShape::Poisson { rate } => positive("--rate", rate)?,
            LoadShape::Concurrency { clients: 0 } => {
                return Err(invalid("--concurrency must be at least 1"));
            }
            LoadShape::Concurrency { .. } => {}
        }
        match &self.source {
            RequestSource::Trace {
                records,
                block_size,
            } => {
                if records.is_empty() {
                    return Err(invalid("the trace holds no requests"));
                }
                if switchyard_core::trace::session::has_sessions(records) {
                    if !matches!(self.shape, LoadShape::Replay { .. }) {
                        return Err(invalid(
                            "a session trace (rows with session_id or wait_for) sends each turn \
                             when the one before it ends: drop --rate and --concurrency",
                        ));
                    }
                    switchyard_core::trace::session::resolve(records)
                        .map_err(|e| invalid(e.to_string()))?;
                }
                if *block_size == 0 {
                    return Err(invalid("--trace-block-size must be at least 1"));
                }
            }
            RequestSource::Synthetic {
                input_tokens,
                output_tokens,
            } => {
                if *input_tokens == 0 || *output_tokens == 0 {
                    return Err(invalid(
                        "--input-tokens and --output-tokens must be at least 1",
                    ));
                }
            }
        }
        if self.max_requests == Some(0) {
            return Err(invalid("--num-requests must be at least 1"));
        }
        if self.duration.is_some_and(|d| d.is_zero()) {
            return Err(invalid("--duration must be longer than 0"));
        }
        if self.request_timeout.is_zero() {
            return Err(invalid("--timeout must be longer than 0"));
        }
        if self.slo.is_set() && !self.stream {
            return Err(invalid(
                "--slo-ttft-ms and --slo-itl-ms need streaming (drop --no-stream): \
                 TTFT and ITL are measured on the token stream",
            ));
        }
        Ok(())
    }
}

/// Why an `--extra-body` text is not a body to merge ([`parse_extra_body`]).
#[derive(Debug, thiserror::Error)]
pub enum ExtraBodyError {
    #[error("must be a JSON object, e.g. '{{\"temperature\": 0}}'")]
    NotAnObject,
    #[error("not valid JSON: {0}")]
    Json(#[source] serde_json::Error),
}

/// Parses `--extra-body`: a JSON object merged into every request.
pub fn parse_extra_body(text: &str) -> Result<ExtraBody, ExtraBodyError> {
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(ExtraBodyError::NotAnObject),
        Err(e) => Err(ExtraBodyError::Json(e)),
    }
}

fn invalid(message: impl Into<String>) -> BenchError {
    BenchError::InvalidConfig(message.into())
}

fn positive(flag: &str, value: f64) -> Result<(), BenchError> {
    if value.is_finite() && value > 0.0 {
        Ok(())
    } else {
        Err(invalid(format!(
            "{flag} must be a finite number above 0, got {value}"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trace(n: usize) -> RequestSource {
        RequestSource::Trace {
            records: (0..n)
                .map(|i| MooncakeRecord {
                    media: Vec::new(),
                    timestamp: i as u64,
                    input_length: 10,
                    output_length: 5,
                    hash_ids: vec![i as u64],
                    ..MooncakeRecord::default()
                })
                .collect(),
            block_size: 512,
        }
    }

    #[test]
    fn endpoint_url_accepts_base_v1_and_full_forms() {
        let mut config = BenchConfig::new("http://127.0.0.1:8000", "m");
        assert_eq!(
            config.endpoint_url().unwrap().as_str(),
            "http://127.0.0.1:8000/v1/chat/completions"
        );
        config.url = "http://h/v1/".into();
        config.endpoint = Endpoint::Completions;
        assert_eq!(
            config.endpoint_url().unwrap().as_str(),
            "http://h/v1/completions"
        );
        config.url = "https://h/api/v1/chat/completions".into();
        assert_eq!(
            config.endpoint_url().unwrap().as_str(),
            "https://h/api/v1/chat/completions"
        );
        config.url = "ftp://h".into();
        assert!(config.validate().is_err());
        config.url = "not a url".into();
        assert!(config.validate().unwrap_err().to_string().contains("--url"));
    }

    #[test]
    fn request_limit_follows_bounds_and_trace() {
        let mut config = BenchConfig::new("http://h", "m");
        assert_eq!(config.request_limit(), Some(DEFAULT_MAX_REQUESTS));
        config.duration = Some(Duration::from_secs(5));
        assert_eq!(config.request_limit(), None);
        config.source = trace(30);
        config.shape = LoadShape::Replay { speedup: 1.0 };
        assert_eq!(config.request_limit(), Some(30));
        config.max_requests = Some(50);
        assert_eq!(config.request_limit(), Some(30));
        config.shape = LoadShape::Poisson { rate: 1.0 };
        assert_eq!(config.request_limit(), Some(50));
        config.max_requests = None;
        config.duration = None;
        assert_eq!(config.request_limit(), Some(30));
    }

    #[test]
    fn invalid_settings_name_their_flag() {
        let mut config = BenchConfig::new("http://h", "m");
        config.shape = LoadShape::Replay { speedup: 1.0 };
        assert!(
            config
                .validate()
                .unwrap_err()
                .to_string()
                .contains("--trace")
        );
        config.shape = LoadShape::Poisson { rate: 0.0 };
        assert!(
            config
                .validate()
                .unwrap_err()
                .to_string()
                .contains("--rate")
        );
        config.shape = LoadShape::Concurrency { clients: 0 };
        assert!(
            config
                .validate()
                .unwrap_err()
                .to_string()
                .contains("--concurrency")
        );
        config.shape = LoadShape::Concurrency { clients: 2 };
        config.stream = false;
        config.slo.ttft = Some(Duration::from_millis(100));
        assert!(
            config
                .validate()
                .unwrap_err()
                .to_string()
                .contains("--no-stream")
        );
        config.stream = true;
        assert!(config.validate().is_ok());
    }

    #[test]
    fn extra_body_must_be_an_object() {
        assert_eq!(parse_extra_body("{\"top_p\": 1}").unwrap().len(), 1);
        assert!(
            parse_extra_body("[1]")
                .unwrap_err()
                .to_string()
                .contains("JSON object")
        );
        assert!(
            parse_extra_body("{")
                .unwrap_err()
                .to_string()
                .contains("not valid JSON")
        );
    }
}
