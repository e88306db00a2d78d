//! Request bodies: size limit and JSON parsing, with OpenAI-style errors (axum's own
//! rejections are plain text).

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, StatusCode, header};
use serde::de::DeserializeOwned;

use crate::openai::ApiError;

/// Parses a JSON body, or says precisely what is wrong with it. The body must be declared
/// as JSON: a form or a text body posted by a web page to a local server is refused (415)
/// rather than parsed.
pub fn parse<T: DeserializeOwned>(
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
    limit: usize,
) -> Result<T, ApiError> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    if !content_type.as_deref().is_some_and(is_json) {
        return Err(ApiError::not_json(content_type.as_deref()));
    }
    let bytes = body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::too_large(limit)
        } else if timed_out(&rejection) {
            ApiError::body_timeout()
        } else {
            ApiError::invalid(format!("Cannot read the request body: {rejection}"))
        }
    })?;
    if bytes.is_empty() {
        return Err(ApiError::invalid(
            "The request body is empty; expected a JSON object.",
        ));
    }
    let mut deserializer = serde_json::Deserializer::from_slice(&bytes);
    let value = serde_path_to_error::deserialize(&mut deserializer).map_err(described)?;
    deserializer
        .end()
        .map_err(|e| ApiError::invalid(format!("The request body is not valid JSON: {e}")))?;
    Ok(value)
}

/// Reads a part of a body already parsed as JSON, with the errors of [`parse`].
pub fn from_value<T: DeserializeOwned>(value: serde_json::Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(value).map_err(described)
}

/// What is wrong with a body, naming the parameter where there is one.
fn described(e: serde_path_to_error::Error<serde_json::Error>) -> ApiError {
    let inner = e.inner();
    if inner.is_syntax() || inner.is_eof() {
        return ApiError::invalid(format!("The request body is not valid JSON: {inner}"));
    }
    let path = e.path().to_string();
    if inner.to_string().starts_with("unknown field `") {
        // The path already ends with the unknown key.
        ApiError::invalid_param(
            &path,
            format!(
                "Unrecognized request argument: `{path}`. Remove it, or see /openapi.json for \
                 the accepted parameters."
            ),
        )
    } else if path == "." {
        ApiError::invalid(format!("Invalid request: {inner}"))
    } else {
        ApiError::invalid_param(&path, format!("Invalid value for `{path}`: {inner}"))
    }
}

/// Whether reading the body failed because the client was too slow (see
/// `connections.body_read_timeout`).
fn timed_out(rejection: &BytesRejection) -> bool {
    switchyard_runtime::net::deadline::is_too_slow(rejection)
}

/// `application/json`, with parameters or not, any case; a charset, if given, is UTF-8 (the
/// only one JSON may use, RFC 8259).
fn is_json(content_type: &str) -> bool {
    let mut parts = content_type.split(';');
    let json = parts
        .next()
        .is_some_and(|essence| essence.trim().eq_ignore_ascii_case("application/json"));
    json && parts.all(|parameter| match parameter.split_once('=') {
        Some((name, value)) if name.trim().eq_ignore_ascii_case("charset") => {
            let value = value.trim().trim_matches('"');
            value.eq_ignore_ascii_case("utf-8") || value.eq_ignore_ascii_case("utf8")
        }
        _ => true,
    })
}
