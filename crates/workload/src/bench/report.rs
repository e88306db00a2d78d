//! A finished run: setup, summary and records; the terminal summary and the JSON file.

use std::fmt;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::BenchError;
use super::config::{BenchConfig, Endpoint, LoadShape, RequestSource};
use super::plots;
use super::record::RequestRecord;
use super::summary::BenchSummary;
use crate::stats::Summary;
use crate::units::{format_duration, ms, thousands};

/// What was run, for the reader of a report.
#[derive(Debug, Clone, Serialize)]
pub struct RunSetup {
    pub url: String,
    pub model: String,
    pub endpoint: &'static str,
    pub stream: bool,
    /// The load shape in words, e.g. `Poisson, 5 req/s`.
    pub load: String,
    pub request_limit: Option<usize>,
    pub duration_limit_ms: Option<f64>,
}

/// Everything a run produced. `Display` is the terminal summary.
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    pub setup: RunSetup,
    pub summary: BenchSummary,
    /// A session trace's sessions (replayed closed loop).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sessions: Option<super::sessions::SessionTurns>,
    pub requests: Vec<RequestRecord>,
}

impl BenchReport {
    pub fn new(config: &BenchConfig, records: Vec<RequestRecord>) -> Self {
        let url = config
            .endpoint_url()
            .map_or_else(|_| config.url.clone(), |u| u.to_string());
        let source = match &config.source {
            RequestSource::Trace { records, .. } => {
                format!("{} trace rows", thousands(records.len() as u64))
            }
            RequestSource::Synthetic {
                input_tokens,
                output_tokens,
            } => format!("{input_tokens} input / {output_tokens} output tokens"),
        };
        let sessions = match &config.source {
            RequestSource::Trace { records: rows, .. } => {
                super::sessions::SessionTurns::of(rows, &records)
            }
            RequestSource::Synthetic { .. } => None,
        };
        let shape = match config.shape {
            LoadShape::Replay { speedup } if sessions.is_some() => {
                format!("sessions replayed closed loop at {speedup}x")
            }
            LoadShape::Replay { speedup } => format!("trace replay at {speedup}x"),
            LoadShape::Poisson { rate } => format!("Poisson, {rate} req/s"),
            LoadShape::Concurrency { clients } => format!("concurrency {clients}"),
        };
        Self {
            setup: RunSetup {
                url,
                model: config.model.clone(),
                endpoint: match config.endpoint {
                    Endpoint::Chat => "chat",
                    Endpoint::Completions => "completions",
                },
                stream: config.stream,
                load: format!("{shape}, {source}"),
                request_limit: config.request_limit(),
                duration_limit_ms: config.duration.map(ms),
            },
            summary: BenchSummary::of(&records, &config.slo),
            sessions,
            requests: records,
        }
    }

    /// Writes the setup, summary and every request record as JSON (times in ms), creating
    /// the parent directory if needed. Setup and summary are indented; each request is one
    /// line, so a long run stays readable and greppable.
    pub fn write_json(&self, path: &Path) -> Result<(), BenchError> {
        let write_err = |source| BenchError::Write {
            path: path.to_path_buf(),
            source,
        };
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(write_err)?;
        }
        let mut out = BufWriter::new(File::create(path).map_err(write_err)?);
        self.write_json_to(&mut out).map_err(write_err)?;
        out.flush().map_err(write_err)
    }

    fn write_json_to(&self, out: &mut impl Write) -> std::io::Result<()> {
        write!(
            out,
            "{{\n  \"setup\": {},\n  \"summary\": {},\n  \"requests\": [",
            indented(&self.setup)?,
            indented(&self.summary)?
        )?;
        for (i, record) in self.requests.iter().enumerate() {
            out.write_all(if i == 0 { b"\n    " } else { b",\n    " })?;
            serde_json::to_writer(&mut *out, record).map_err(std::io::Error::other)?;
        }
        out.write_all(b"\n  ]\n}\n")
    }

    /// Draws the plots (TTFT and ITL CDFs, latency and throughput over time) as PNG and SVG
    /// into `dir`, creating it; returns the files written. A plot with no data (TTFT
    /// without streaming) is skipped.
    pub fn write_plots(&self, dir: &Path) -> Result<Vec<PathBuf>, BenchError> {
        std::fs::create_dir_all(dir).map_err(|source| BenchError::Write {
            path: dir.to_path_buf(),
            source,
        })?;
        plots::write_all(dir, &self.requests)
    }
}

impl fmt::Display for BenchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (setup, s) = (&self.setup, &self.summary);
        writeln!(
            f,
            "Endpoint     POST {} (model {}, {})",
            setup.url,
            setup.model,
            if setup.stream {
                "streaming"
            } else {
                "not streaming"
            }
        )?;
        let bounds: Vec<String> = setup
            .request_limit
            .map(|n| format!("{} requests", thousands(n as u64)))
            .into_iter()
            .chain(
                setup
                    .duration_limit_ms
                    .map(|d| format_duration(std::time::Duration::from_secs_f64(d / 1e3))),
            )
            .collect();
        writeln!(
            f,
            "Load         {}; bounded by {}",
            setup.load,
            bounds.join(" and ")
        )?;
        let errors: Vec<String> = s.errors.iter().map(|(k, n)| format!("{k} {n}")).collect();
        write!(
            f,
            "Requests     {} sent: {} succeeded, {} failed",
            thousands(s.requests as u64),
            thousands(s.succeeded as u64),
            thousands(s.failed as u64)
        )?;
        if errors.is_empty() {
            writeln!(f)?;
        } else {
            writeln!(f, " ({})", errors.join(", "))?;
        }
        if let Some((index, error)) = self
            .requests
            .iter()
            .find_map(|r| r.error.as_ref().map(|e| (r.index, e)))
        {
            writeln!(
                f,
                "First error  request {index}: {}: {}",
                error.kind, error.message
            )?;
        }
        writeln!(f, "Duration     {}", format_duration(s.duration))?;
        writeln!(
            f,
            "Throughput   {:.2} req/s, {:.1} output tok/s, {:.1} total tok/s",
            s.request_throughput, s.output_token_throughput, s.total_token_throughput
        )?;
        if let Some(g) = &s.goodput {
            let objectives: Vec<String> = g
                .slo_ttft_ms
                .map(|t| format!("TTFT <= {t:.0} ms"))
                .into_iter()
                .chain(g.slo_itl_ms.map(|t| format!("mean ITL <= {t:.1} ms")))
                .collect();
            writeln!(
                f,
                "Goodput      {:.2} req/s: {} requests ({:.1}%) met {}",
                g.rate,
                thousands(g.requests as u64),
                g.fraction * 100.0,
                objectives.join(" and ")
            )?;
        }
        writeln!(
            f,
            "Token counts from server usage for {} of {} successful requests",
            thousands(s.usage_reported as u64),
            thousands(s.succeeded as u64)
        )?;
        if let Some((cached, rate)) = s.cached_tokens.zip(s.prompt_cache_hit_rate) {
            writeln!(
                f,
                "Prefix cache {:.1}% of prompt tokens served from the server's cache ({} tokens, \
                 where its usage says)",
                rate * 100.0,
                thousands(cached)
            )?;
        }
        if s.succeeded == 0 {
            return Ok(());
        }
        writeln!(f)?;
        writeln!(
            f,
            "{:<16}{:>10}{:>10}{:>10}{:>10}{:>10}",
            "", "mean", "p50", "p90", "p99", "max"
        )?;
        let rows = [
            ("TTFT (ms)", &s.ttft_ms),
            ("ITL (ms)", &s.itl_ms),
            ("TPOT (ms)", &s.tpot_ms),
            ("Latency (ms)", &s.latency_ms),
            ("Input tokens", &s.input_tokens),
            ("Output tokens", &s.output_tokens),
            ("Send lag (ms)", &s.send_lag_ms),
        ];
        for (name, summary) in rows {
            if let Some(summary) = summary {
                row(f, name, summary)?;
            }
        }
        if let Some(sessions) = &self.sessions {
            write!(f, "{sessions}")?;
        }
        Ok(())
    }
}

fn row(f: &mut fmt::Formatter<'_>, name: &str, s: &Summary) -> fmt::Result {
    writeln!(
        f,
        "{name:<16}{:>10.1}{:>10.1}{:>10.1}{:>10.1}{:>10.1}",
        s.mean, s.p50, s.p90, s.p99, s.max
    )
}

/// Pretty JSON indented to sit one level inside the report object.
fn indented<T: Serialize>(value: &T) -> std::io::Result<String> {
    let pretty = serde_json::to_string_pretty(value).map_err(std::io::Error::other)?;
    Ok(pretty.replace('\n', "\n  "))
}
