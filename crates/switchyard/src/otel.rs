//! Span export over OTLP/HTTP (protobuf), for `log.otlp_endpoint` (feature `otel`).

use std::time::Duration;

use anyhow::{Context, Result};
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{BatchSpanProcessor, SdkTracerProvider};

/// A tracer provider exporting to `endpoint` (the whole URL, `http://host:4318/v1/traces`)
/// in batches, from its own thread, as service `service`. Shut it down at exit: that
/// flushes what is left.
pub fn provider(endpoint: &str, service: &str) -> Result<SdkTracerProvider> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(endpoint)
        // Under the provider's 5 s flush and shutdown waits.
        .with_timeout(Duration::from_secs(3))
        .build()
        .with_context(|| format!("cannot export spans to {endpoint}"))?;
    Ok(SdkTracerProvider::builder()
        .with_span_processor(BatchSpanProcessor::builder(exporter).build())
        .with_resource(
            Resource::builder()
                .with_service_name(service.to_owned())
                .build(),
        )
        .build())
}
