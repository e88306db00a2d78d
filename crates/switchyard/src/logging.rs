//! Logging and tracing setup for the commands that run services.
//!
//! Nothing logs prompt or completion text at `info` or above (a test checks it): logs go to
//! collectors that are not meant to hold users' data. The same holds for span fields, which
//! `log.otlp_endpoint` exports (builds with the `otel` feature).

use anyhow::{Context, Result};
use switchyard::config::{LogConfig, LogFormat};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// Keep it until the process ends: dropping it flushes the spans not yet exported.
#[derive(Debug, Default)]
#[must_use = "dropping it stops span export"]
pub struct Telemetry {
    #[cfg(feature = "otel")]
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

/// Logs to stderr with the configured filter and format (from the configuration, not the
/// environment); exports spans when `log.otlp_endpoint` is set, as `service`.
pub fn init(config: &LogConfig, service: &str) -> Result<Telemetry> {
    let filter = EnvFilter::try_new(&config.level)
        .with_context(|| format!("invalid log filter {:?}", config.level))?;
    let telemetry = Telemetry::start(config, service)?;
    tracing_subscriber::registry()
        .with(fmt_layer(config.format).with_filter(filter))
        .with(telemetry.layer())
        .try_init()
        .ok();
    Ok(telemetry)
}

fn fmt_layer<S>(format: LogFormat) -> Box<dyn Layer<S> + Send + Sync>
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    let layer = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    match format {
        // One JSON object per line: timestamp, level, target, fields (message included),
        // the span the event happened in.
        LogFormat::Json => Box::new(layer.json().with_current_span(true).with_span_list(false)),
        // Colours on a terminal only, not in log files.
        LogFormat::Text => {
            Box::new(layer.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())))
        }
    }
}

impl Telemetry {
    #[cfg(feature = "otel")]
    fn start(config: &LogConfig, service: &str) -> Result<Self> {
        let provider = match &config.otlp_endpoint {
            Some(endpoint) => {
                let provider = switchyard::otel::provider(endpoint, service)?;
                switchyard_runtime::trace_context::enable();
                Some(provider)
            }
            None => None,
        };
        Ok(Telemetry { provider })
    }

    /// The request spans (INFO and above, Switchyard's own), to the exporter.
    #[cfg(feature = "otel")]
    fn layer<S>(&self) -> Option<Box<dyn Layer<S> + Send + Sync>>
    where
        S: tracing::Subscriber + for<'a> LookupSpan<'a> + Send + Sync,
    {
        use opentelemetry::trace::TracerProvider as _;
        let tracer = self.provider.as_ref()?.tracer("switchyard");
        let spans = tracing_subscriber::filter::Targets::new()
            .with_target("switchyard", tracing::Level::INFO)
            .with_target("switchyard_frontend", tracing::Level::INFO)
            .with_target("switchyard_runtime", tracing::Level::INFO)
            .with_target("switchyard_worker", tracing::Level::INFO);
        Some(Box::new(
            tracing_opentelemetry::layer()
                .with_tracer(tracer)
                .with_filter(spans),
        ))
    }

    #[cfg(not(feature = "otel"))]
    fn start(config: &LogConfig, _service: &str) -> Result<Self> {
        anyhow::ensure!(
            config.otlp_endpoint.is_none(),
            "log.otlp_endpoint needs a build with `--features otel` (cargo build --release --features otel)"
        );
        Ok(Telemetry::default())
    }

    #[cfg(not(feature = "otel"))]
    fn layer<S>(&self) -> Option<Box<dyn Layer<S> + Send + Sync>>
    where
        S: tracing::Subscriber + for<'a> LookupSpan<'a> + Send + Sync,
    {
        None
    }
}

#[cfg(feature = "otel")]
impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take()
            && let Err(e) = provider.shutdown()
        {
            eprintln!("warning: flushing the last spans failed: {e}");
        }
    }
}
