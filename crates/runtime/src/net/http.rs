//! The request plane over HTTP/2: the frontend POSTs a MessagePack `GenerateRequest` to the
//! worker's `/v1/internal/generate` and reads back length-prefixed MessagePack frames (a
//! 4-byte big-endian length, then the frame), one per `GenerateOutput`. The request is
//! encoded with field names, so optional fields may be left out and a worker of another
//! version reads what it knows; frames, one per token, are compact.
//!
//! One HTTP/2 connection per worker carries every request, multiplexed. Dropping the
//! response stream resets its HTTP/2 stream; the worker drops the engine's stream, which
//! cancels the request. A response that ends without its `Finished` frame, or whose
//! connection breaks, ends with [`EngineError::Disconnected`].
//!
//! Errors are typed end to end: a request refused before streaming is answered with a
//! status that matches the error and the MessagePack [`EngineError`] as body; a failure
//! mid-stream is an error frame. Sizes are bounded both ways: a request body over
//! [`MAX_REQUEST_BYTES`] is refused with 413, and a frame over [`MAX_FRAME_BYTES`] ends the
//! stream rather than buffering without bound.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use bytes::{Buf, BufMut, BytesMut};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use switchyard_core::protocol::{GenerateOutput, GenerateRequest};
use switchyard_core::{RequestId, SequenceHash};

use crate::discovery::WorkerInstance;
use crate::request::{EngineError, EngineService, RequestPlane, ResponseStream};

pub const GENERATE_PATH: &str = "/v1/internal/generate";
/// Which of a list of KV blocks the worker holds: a MessagePack list of sequence hashes
/// in, the number held from the first out.
pub const HELD_BLOCKS_PATH: &str = "/v1/internal/kv/held";
/// Where a frontend tells a worker that a request's media are encoded.
pub const MEDIA_READY_PATH: &str = "/v1/internal/media/ready";
/// Largest generate request a worker accepts (a prompt of several million tokens).
pub const MAX_REQUEST_BYTES: usize = 64 << 20;
/// Largest response frame a frontend accepts.
pub const MAX_FRAME_BYTES: usize = 16 << 20;

/// One frame on the wire.
#[derive(Debug, Serialize, Deserialize)]
enum Frame {
    Output(GenerateOutput),
    Error(EngineError),
}

/// The status a refusal is answered with.
fn status_of(error: &EngineError) -> StatusCode {
    match error {
        EngineError::Invalid(_) => StatusCode::BAD_REQUEST,
        EngineError::Unsupported(_) => StatusCode::UNPROCESSABLE_ENTITY,
        EngineError::KvLost(_) => StatusCode::GONE,
        EngineError::OutOfMemory(_) => StatusCode::INSUFFICIENT_STORAGE,
        EngineError::Overloaded(_) => StatusCode::TOO_MANY_REQUESTS,
        EngineError::Stopping => StatusCode::SERVICE_UNAVAILABLE,
        EngineError::Unreachable(_) | EngineError::Disconnected | EngineError::Internal(_) => {
            StatusCode::INTERNAL_SERVER_ERROR
        }
    }
}

/// The error a refusal stands for: its body when it is one, else what its status says.
fn error_of(status: StatusCode, body: &[u8], address: &str) -> EngineError {
    if let Ok(error) = rmp_serde::from_slice::<EngineError>(body) {
        return error;
    }
    let text = String::from_utf8_lossy(body)
        .chars()
        .take(512)
        .collect::<String>();
    match status {
        StatusCode::BAD_REQUEST => EngineError::Invalid(text),
        StatusCode::PAYLOAD_TOO_LARGE => {
            EngineError::Invalid(format!("the request is too large for the worker: {text}"))
        }
        StatusCode::UNPROCESSABLE_ENTITY => EngineError::Unsupported(text),
        StatusCode::TOO_MANY_REQUESTS => EngineError::Overloaded(text),
        StatusCode::INSUFFICIENT_STORAGE => EngineError::OutOfMemory(text),
        StatusCode::UNAUTHORIZED => EngineError::Unreachable(format!(
            "{address} refused this frontend's request-plane secret: {text}"
        )),
        _ => EngineError::Unreachable(format!("{address} answered {status}")),
    }
}

fn refusal(error: &EngineError) -> Response {
    let body = rmp_serde::to_vec(error).unwrap_or_default();
    (status_of(error), body).into_response()
}

fn encode(frame: &Frame) -> Bytes {
    let payload = rmp_serde::to_vec(frame).unwrap_or_default();
    let mut out = BytesMut::with_capacity(4 + payload.len());
    out.put_u32(payload.len() as u32);
    out.put_slice(&payload);
    out.freeze()
}

/// The worker's side: serves its engine.
pub fn routes(service: Arc<dyn EngineService>) -> Router {
    Router::new()
        .route(GENERATE_PATH, axum::routing::post(generate))
        .route(HELD_BLOCKS_PATH, axum::routing::post(held_blocks))
        .route(MEDIA_READY_PATH, axum::routing::post(media_ready))
        .layer(DefaultBodyLimit::max(MAX_REQUEST_BYTES))
        .with_state(service)
}

async fn generate(
    State(service): State<Arc<dyn EngineService>>,
    headers: axum::http::HeaderMap,
    body: Bytes,
) -> Response {
    let request: GenerateRequest = match rmp_serde::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            return refusal(&EngineError::Invalid(format!(
                "undecodable generate request: {e}"
            )));
        }
    };
    // The worker's side of the request's trace: from here to its last frame.
    let span = tracing::info_span!(
        "worker.generate",
        request_id = request.id.0,
        prompt_tokens = request.prompt.len(),
        max_tokens = request.max_tokens,
    );
    crate::trace_context::set_parent(&span, &crate::trace_context::from_headers(&headers));
    let started = tracing::Instrument::instrument(service.generate(request), span.clone()).await;
    match started {
        Ok(stream) => {
            let frames = stream.map(move |item| {
                let _in_span = span.enter();
                let frame = match item {
                    Ok(output) => Frame::Output(output),
                    Err(e) => Frame::Error(e),
                };
                Ok::<_, Infallible>(encode(&frame))
            });
            Body::from_stream(frames).into_response()
        }
        Err(error) => refusal(&error),
    }
}

async fn held_blocks(State(service): State<Arc<dyn EngineService>>, body: Bytes) -> Response {
    answer(
        &body,
        "block list",
        |blocks: Vec<SequenceHash>| async move { service.held_blocks(&blocks).await },
    )
    .await
}

async fn media_ready(State(service): State<Arc<dyn EngineService>>, body: Bytes) -> Response {
    answer(&body, "request id", |id: RequestId| async move {
        service.media_ready(id).await
    })
    .await
}

/// Answers a one-shot call: `body` decoded, `serve`'s answer encoded (MessagePack both).
async fn answer<B, A, F>(body: &[u8], what: &str, serve: impl FnOnce(B) -> F) -> Response
where
    B: serde::de::DeserializeOwned,
    A: serde::Serialize,
    F: std::future::Future<Output = Result<A, EngineError>>,
{
    let decoded: B = match rmp_serde::from_slice(body) {
        Ok(b) => b,
        Err(e) => {
            return refusal(&EngineError::Invalid(format!("undecodable {what}: {e}")));
        }
    };
    match serve(decoded).await {
        Ok(answer) => rmp_serde::to_vec(&answer)
            .unwrap_or_default()
            .into_response(),
        Err(error) => refusal(&error),
    }
}

/// The frontend's side.
#[derive(Debug, Clone)]
pub struct HttpRequestPlane {
    client: reqwest::Client,
}

impl HttpRequestPlane {
    /// A one-shot call on a worker: `body` and the answer in MessagePack; `what` names
    /// the body in errors.
    async fn call<B: serde::Serialize, A: serde::de::DeserializeOwned>(
        &self,
        worker: &WorkerInstance,
        path: &str,
        body: &B,
        what: &str,
    ) -> Result<A, EngineError> {
        let address = worker.address.as_deref().ok_or_else(|| {
            EngineError::Unreachable(format!("{} has no request-plane address", worker.worker_id))
        })?;
        let body = rmp_serde::to_vec(body)
            .map_err(|e| EngineError::Invalid(format!("cannot encode {what}: {e}")))?;
        let response = self
            .client
            .post(format!("http://{address}{path}"))
            .body(body)
            .send()
            .await
            .map_err(|e| EngineError::Unreachable(format!("{address}: {e}")))?;
        let status = response.status();
        let body = response
            .bytes()
            .await
            .map_err(|e| EngineError::Unreachable(format!("{address}: {e}")))?;
        if status != StatusCode::OK {
            return Err(error_of(status, &body, address));
        }
        rmp_serde::from_slice(&body)
            .map_err(|e| EngineError::Internal(format!("{address}: undecodable answer: {e}")))
    }

    pub fn new() -> Result<Self, EngineError> {
        Self::with_secret(None)
    }

    /// A client that presents the deployment's request-plane secret (see
    /// [`super::secret`]).
    pub fn with_secret(secret: Option<&str>) -> Result<Self, EngineError> {
        let headers = super::secret::client_headers(secret)
            .map_err(|e| EngineError::Internal(e.to_string()))?;
        let client = reqwest::Client::builder()
            .default_headers(headers)
            .http2_prior_knowledge()
            .tcp_nodelay(true)
            .connect_timeout(Duration::from_secs(2))
            .http2_keep_alive_interval(Duration::from_secs(5))
            .http2_keep_alive_timeout(Duration::from_secs(5))
            .http2_keep_alive_while_idle(true)
            .build()
            .map_err(|e| EngineError::Internal(format!("cannot build the HTTP client: {e}")))?;
        Ok(HttpRequestPlane { client })
    }
}

/// Decodes frames as bytes arrive.
struct Decoder {
    body: futures::stream::BoxStream<'static, Result<Bytes, reqwest::Error>>,
    buffer: BytesMut,
    finished: bool,
    done: bool,
}

/// Takes the next whole frame off the front of `buffer`: `None` while none is complete (the
/// buffer is left as it is); else the frame, or why the stream cannot go on (a frame over
/// [`MAX_FRAME_BYTES`], or one that does not decode).
fn next_frame(buffer: &mut BytesMut) -> Option<Result<Frame, EngineError>> {
    if buffer.len() < 4 {
        return None;
    }
    let len = u32::from_be_bytes([buffer[0], buffer[1], buffer[2], buffer[3]]) as usize;
    if len > MAX_FRAME_BYTES {
        return Some(Err(EngineError::Internal(format!(
            "a response frame of {len} bytes is over the {MAX_FRAME_BYTES}-byte limit"
        ))));
    }
    if buffer.len() < 4 + len {
        return None;
    }
    buffer.advance(4);
    let payload = buffer.split_to(len);
    Some(
        rmp_serde::from_slice(&payload)
            .map_err(|e| EngineError::Internal(format!("undecodable response frame: {e}"))),
    )
}

/// [`next_frame`] in public types, for the fuzz targets (fuzz/): `Ok(Ok(output))`,
/// `Ok(Err(the error the worker sent))`, or `Err(the stream must end)`.
#[doc(hidden)]
pub fn decode_frame(
    buffer: &mut BytesMut,
) -> Option<Result<Result<GenerateOutput, EngineError>, EngineError>> {
    next_frame(buffer).map(|frame| {
        frame.map(|frame| match frame {
            Frame::Output(output) => Ok(output),
            Frame::Error(error) => Err(error),
        })
    })
}

/// One response stream item as a frame, for the fuzz targets (fuzz/).
#[doc(hidden)]
pub fn encode_frame(item: &Result<GenerateOutput, EngineError>) -> Bytes {
    encode(&match item {
        Ok(output) => Frame::Output(output.clone()),
        Err(error) => Frame::Error(error.clone()),
    })
}

impl Decoder {
    async fn next(mut self) -> Option<(Result<GenerateOutput, EngineError>, Self)> {
        loop {
            if self.done {
                return None;
            }
            match next_frame(&mut self.buffer) {
                Some(Ok(Frame::Output(output))) => {
                    self.finished |= matches!(output, GenerateOutput::Finished { .. });
                    return Some((Ok(output), self));
                }
                Some(Ok(Frame::Error(error))) => {
                    self.done = true;
                    return Some((Err(error), self));
                }
                Some(Err(e)) => {
                    self.done = true;
                    return Some((Err(e), self));
                }
                None => {}
            }
            match self.body.next().await {
                Some(Ok(chunk)) => self.buffer.extend_from_slice(&chunk),
                Some(Err(_)) => {
                    self.done = true;
                    return Some((Err(EngineError::Disconnected), self));
                }
                None => {
                    self.done = true;
                    if self.finished {
                        return None;
                    }
                    return Some((Err(EngineError::Disconnected), self));
                }
            }
        }
    }
}

#[async_trait]
impl RequestPlane for HttpRequestPlane {
    async fn generate(
        &self,
        worker: &WorkerInstance,
        request: GenerateRequest,
    ) -> Result<ResponseStream, EngineError> {
        let address = worker.address.as_deref().ok_or_else(|| {
            EngineError::Unreachable(format!("{} has no request-plane address", worker.worker_id))
        })?;
        let body = rmp_serde::to_vec_named(&request)
            .map_err(|e| EngineError::Invalid(format!("cannot encode the request: {e}")))?;
        let mut post = self
            .client
            .post(format!("http://{address}{GENERATE_PATH}"))
            .body(body);
        for (name, value) in crate::trace_context::current() {
            post = post.header(name, value);
        }
        let response = post
            .send()
            .await
            .map_err(|e| EngineError::Unreachable(format!("{address}: {e}")))?;
        let status = response.status();
        if status != StatusCode::OK {
            let body = response.bytes().await.unwrap_or_default();
            return Err(error_of(status, &body, address));
        }
        let decoder = Decoder {
            body: response.bytes_stream().boxed(),
            buffer: BytesMut::new(),
            finished: false,
            done: false,
        };
        Ok(futures::stream::unfold(decoder, Decoder::next).boxed())
    }

    async fn held_blocks(
        &self,
        worker: &WorkerInstance,
        blocks: Vec<SequenceHash>,
    ) -> Result<u32, EngineError> {
        self.call(worker, HELD_BLOCKS_PATH, &blocks, "the block list")
            .await
    }

    async fn media_ready(
        &self,
        worker: &WorkerInstance,
        id: RequestId,
    ) -> Result<bool, EngineError> {
        self.call(worker, MEDIA_READY_PATH, &id, "the request id")
            .await
    }
}
