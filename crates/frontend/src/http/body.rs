//! Request bodies: size limit and JSON parsing, with OpenAI-style errors (axum's own
//! rejections are plain text).

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use serde::de::DeserializeOwned;

use crate::openai::ApiError;

/// Parses a JSON body, or says precisely what is wrong with it.
pub fn parse<T: DeserializeOwned>(
    body: Result<Bytes, BytesRejection>,
    limit: usize,
) -> Result<T, ApiError> {
    let bytes = body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::too_large(limit)
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
    let value = serde_path_to_error::deserialize(&mut deserializer).map_err(|e| {
        let inner = e.inner();
        if inner.is_syntax() || inner.is_eof() {
            ApiError::invalid(format!("The request body is not valid JSON: {inner}"))
        } else {
            let path = e.path().to_string();
            if path == "." {
                ApiError::invalid(format!("Invalid request: {inner}"))
            } else {
                ApiError::invalid_param(&path, format!("Invalid value for `{path}`: {inner}"))
            }
        }
    })?;
    deserializer
        .end()
        .map_err(|e| ApiError::invalid(format!("The request body is not valid JSON: {e}")))?;
    Ok(value)
}
