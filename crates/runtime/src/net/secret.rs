//! The request plane's shared secret: workers refuse frontends that do not present it.
//!
//! Off unless configured (`runtime.request_secret`, or `SWITCHYARD_RUNTIME__REQUEST_SECRET`).
//! With it, a frontend sends it on every request to a worker (generation and KV dumps) in
//! [`SECRET_HEADER`], and a worker answers 401 to any request without it; the comparison
//! takes the same time whatever the bytes.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header::InvalidHeaderValue;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;
use thiserror::Error;

/// The header that carries the secret.
pub const SECRET_HEADER: &str = "x-switchyard-secret";

/// A secret that cannot be sent in a header.
#[derive(Debug, Error)]
#[error("the request-plane secret must be visible ASCII")]
pub struct InvalidSecret(#[source] InvalidHeaderValue);

/// Default headers for a client of the request plane: the secret, if any, marked sensitive
/// so it never shows in debug output.
pub fn client_headers(secret: Option<&str>) -> Result<HeaderMap, InvalidSecret> {
    let mut headers = HeaderMap::new();
    if let Some(secret) = secret {
        let mut value = HeaderValue::from_str(secret).map_err(InvalidSecret)?;
        value.set_sensitive(true);
        headers.insert(SECRET_HEADER, value);
    }
    Ok(headers)
}

/// Worker side: wrap a router with `axum::middleware::from_fn_with_state(secret, require)`.
pub async fn require(State(secret): State<Arc<str>>, request: Request, next: Next) -> Response {
    let presented = request
        .headers()
        .get(SECRET_HEADER)
        .map(HeaderValue::as_bytes)
        .unwrap_or_default();
    if bool::from(presented.ct_eq(secret.as_bytes())) {
        next.run(request).await
    } else {
        (
            StatusCode::UNAUTHORIZED,
            "this worker requires the deployment's request-plane secret",
        )
            .into_response()
    }
}
