//! OpenAI-style errors: `{"error": {"message", "type", "code", "param"}}` with the right
//! HTTP status.

use std::time::Duration;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

/// An error answered to the client.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    pub code: Option<&'static str>,
    pub param: Option<String>,
    /// Sent as `Retry-After` (seconds, rounded up).
    pub retry_after: Option<Duration>,
}

/// The error body every failure answers with (OpenAI's shape).
#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = ApiErrorBody)]
pub(crate) struct Body<'a> {
    error: Inner<'a>,
}

#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = ApiErrorDetail)]
pub(crate) struct Inner<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
    code: Option<&'a str>,
    param: Option<&'a str>,
}

impl ApiError {
    fn new(
        status: StatusCode,
        kind: &'static str,
        code: Option<&'static str>,
        message: impl Into<String>,
    ) -> Self {
        ApiError {
            status,
            message: message.into(),
            kind,
            code,
            param: None,
            retry_after: None,
        }
    }

    /// 400: the request is malformed or has invalid values.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            None,
            message,
        )
    }

    /// 400 naming the offending parameter.
    pub fn invalid_param(param: &str, message: impl Into<String>) -> Self {
        ApiError {
            param: Some(param.to_string()),
            ..Self::invalid(message)
        }
    }

    /// 400: prompt plus completion exceed the model's context.
    pub fn context_length(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            Some("context_length_exceeded"),
            message,
        )
    }

    /// 404: no such model.
    pub fn model_not_found(model: &str) -> Self {
        ApiError {
            param: Some("model".into()),
            ..Self::new(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                Some("model_not_found"),
                format!("The model `{}` does not exist", echo(model)),
            )
        }
    }

    /// 404: no stored response `id` (never stored, expired, evicted, deleted, or stored by
    /// another frontend); `param` names where it was sent, if in a body.
    pub fn response_not_found(id: &str, param: Option<&str>) -> Self {
        ApiError {
            param: param.map(str::to_string),
            ..Self::new(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                Some("response_not_found"),
                format!(
                    "No response `{}` is stored on this frontend: it was stored with `store: false`, expired, was evicted or deleted, or was created by another frontend (stored responses live in the memory of the frontend that answered them)",
                    echo(id)
                ),
            )
        }
    }

    /// 404: no such route.
    pub fn not_found(path: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            Some("not_found"),
            format!("No route for {}", echo(path)),
        )
    }

    /// 405.
    pub fn method_not_allowed() -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
            Some("method_not_allowed"),
            "Method not allowed",
        )
    }

    /// 413: the body is over the limit.
    pub fn too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            Some("request_too_large"),
            format!("The request body exceeds {limit} bytes"),
        )
    }

    /// 415: the body is not declared as JSON.
    pub fn not_json(content_type: Option<&str>) -> Self {
        let declared = content_type.map_or_else(
            || "no Content-Type".to_string(),
            |t| format!("Content-Type `{}`", echo(t)),
        );
        Self::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "invalid_request_error",
            Some("unsupported_media_type"),
            format!("The request has {declared}; send the body as `application/json`, in UTF-8"),
        )
    }

    /// 408: the client did not send the whole body in time.
    pub fn body_timeout() -> Self {
        Self::new(
            StatusCode::REQUEST_TIMEOUT,
            "invalid_request_error",
            Some("request_timeout"),
            "The request body did not arrive in time",
        )
    }

    /// 429: shed under load; retry later.
    pub fn overloaded(message: impl Into<String>, retry_after: Duration) -> Self {
        ApiError {
            retry_after: Some(retry_after),
            ..Self::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_error",
                Some("overloaded"),
                message,
            )
        }
    }

    /// 401: no API key, or an unknown one.
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "invalid_request_error",
            Some("invalid_api_key"),
            message,
        )
    }

    /// 429: the API key is over one of its limits.
    pub fn rate_limited(message: impl Into<String>, retry_after: Duration) -> Self {
        ApiError {
            retry_after: Some(retry_after),
            ..Self::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_error",
                Some("rate_limit_exceeded"),
                message,
            )
        }
    }

    /// 503: no capacity or no worker.
    pub fn unavailable(message: impl Into<String>, retry_after: Duration) -> Self {
        ApiError {
            retry_after: Some(retry_after),
            ..Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "service_unavailable",
                Some("unavailable"),
                message,
            )
        }
    }

    /// 400: every worker tried said it cannot serve this request (larger than its KV
    /// cache, a feature it lacks). Code `unsupported_request`.
    pub fn unservable(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            Some("unsupported_request"),
            message,
        )
    }

    /// A stream that cannot be completed (every worker that could continue it failed, or
    /// the migration budget is spent): the output so far is truncated. Code
    /// `stream_interrupted`; as an SSE event it is the stream's last (no `[DONE]` follows).
    pub fn interrupted(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            Some("stream_interrupted"),
            message,
        )
    }

    /// 500: something went wrong on our side.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            Some("internal_error"),
            message,
        )
    }

    /// The JSON body (also sent as an SSE event when a stream fails midway).
    pub fn body(&self) -> String {
        let body = Body {
            error: Inner {
                message: &self.message,
                kind: self.kind,
                code: self.code,
                param: self.param.as_deref(),
            },
        };
        serde_json::to_string(&body).unwrap_or_else(|_| {
            String::from(r#"{"error":{"message":"error","type":"server_error"}}"#)
        })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (
            self.status,
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            self.body(),
        )
            .into_response();
        if let Some(after) = self.retry_after {
            let secs = after.as_secs() + u64::from(after.subsec_nanos() > 0);
            if let Ok(value) = HeaderValue::from_str(&secs.max(1).to_string()) {
                response.headers_mut().insert(header::RETRY_AFTER, value);
            }
        }
        response
    }
}

/// Client input quoted back in an error message, cut to a sane length.
pub fn echo(input: &str) -> String {
    const MAX_CHARS: usize = 128;
    match input.char_indices().nth(MAX_CHARS) {
        Some((cut, _)) => format!("{}… ({} bytes)", &input[..cut], input.len()),
        None => input.to_string(),
    }
}
