//! W3C trace context (`traceparent`, `tracestate`) across the request plane, so a worker's
//! span of a request is a child of the frontend's. Empty and inert without the `otel`
//! feature or without an OpenTelemetry layer installed.

use std::collections::HashMap;

/// The headers that carry it.
pub const FIELDS: [&str; 2] = ["traceparent", "tracestate"];

/// Whether this process exports spans (set once by the logging setup): propagation is
/// skipped otherwise, so a build with the feature but no exporter sends and reads exactly
/// what a build without it does.
static ENABLED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Turns propagation on: call it when a span exporter is installed.
pub fn enable() {
    ENABLED.store(true, std::sync::atomic::Ordering::Relaxed);
}

#[cfg(feature = "otel")]
fn enabled() -> bool {
    ENABLED.load(std::sync::atomic::Ordering::Relaxed)
}

/// The current span's context, as headers; empty outside a span or without OpenTelemetry.
#[cfg(feature = "otel")]
pub fn current() -> HashMap<String, String> {
    use opentelemetry::propagation::TextMapPropagator;
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    let mut carrier: HashMap<String, String> = HashMap::new();
    if !enabled() {
        return carrier;
    }
    opentelemetry_sdk::propagation::TraceContextPropagator::new()
        .inject_context(&tracing::Span::current().context(), &mut carrier);
    carrier.retain(|_, value| !value.is_empty());
    carrier
}

#[cfg(not(feature = "otel"))]
pub fn current() -> HashMap<String, String> {
    HashMap::new()
}

/// Makes `span` a child of the remote span the headers name. Call it before `span` is
/// first entered.
#[cfg(feature = "otel")]
pub fn set_parent(span: &tracing::Span, carrier: &HashMap<String, String>) {
    use opentelemetry::propagation::TextMapPropagator;
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    if carrier.is_empty() || !enabled() {
        return;
    }
    let parent = opentelemetry_sdk::propagation::TraceContextPropagator::new().extract(carrier);
    // Fails only without an OpenTelemetry layer, or for a span already started: then the
    // worker's span is a root, which loses the link but nothing else.
    let _ = span.set_parent(parent);
}

#[cfg(not(feature = "otel"))]
pub fn set_parent(_span: &tracing::Span, _carrier: &HashMap<String, String>) {}

/// The trace context headers of a request.
pub fn from_headers(headers: &axum::http::HeaderMap) -> HashMap<String, String> {
    FIELDS
        .into_iter()
        .filter_map(|k| Some((k.to_owned(), headers.get(k)?.to_str().ok()?.to_owned())))
        .collect()
}
