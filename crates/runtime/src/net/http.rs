//! The request plane over HTTP/2: the frontend POSTs a MessagePack `GenerateRequest` to the
//! worker's `/v1/internal/generate` and reads back length-prefixed MessagePack frames (a
//! 4-byte big-endian length, then the frame), one per `GenerateOutput`.
//!
//! One HTTP/2 connection per worker carries every request, multiplexed. Dropping the
//! response stream resets its HTTP/2 stream; the worker drops the engine's stream, which
//! cancels the request. A response that ends without its `Finished` frame, or whose
//! connection breaks, ends with [`RequestPlaneError::Disconnected`].

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use bytes::{Buf, BufMut, BytesMut};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use switchyard_core::protocol::{GenerateOutput, GenerateRequest};

use crate::discovery::WorkerInstance;
use crate::request::{EngineService, RequestPlane, RequestPlaneError, ResponseStream};

pub const GENERATE_PATH: &str = "/v1/internal/generate";

/// One frame on the wire.
#[derive(Debug, Serialize, Deserialize)]
enum Frame {
    Output(GenerateOutput),
    Error(String),
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
        .with_state(service)
}

async fn generate(State(service): State<Arc<dyn EngineService>>, body: Bytes) -> Response {
    let request: GenerateRequest = match rmp_serde::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            return (
                StatusCode::BAD_REQUEST,
                format!("invalid generate request: {e}"),
            )
                .into_response();
        }
    };
    match service.generate(request).await {
        Ok(stream) => {
            let frames = stream.map(|item| {
                let frame = match item {
                    Ok(output) => Frame::Output(output),
                    Err(e) => Frame::Error(e.to_string()),
                };
                Ok::<_, Infallible>(encode(&frame))
            });
            Body::from_stream(frames).into_response()
        }
        Err(RequestPlaneError::Rejected(message)) => {
            (StatusCode::UNPROCESSABLE_ENTITY, message).into_response()
        }
        Err(other) => (StatusCode::SERVICE_UNAVAILABLE, other.to_string()).into_response(),
    }
}

/// The frontend's side.
#[derive(Debug, Clone)]
pub struct HttpRequestPlane {
    client: reqwest::Client,
}

impl HttpRequestPlane {
    pub fn new() -> Result<Self, RequestPlaneError> {
        let client = reqwest::Client::builder()
            .http2_prior_knowledge()
            .tcp_nodelay(true)
            .connect_timeout(Duration::from_secs(2))
            .http2_keep_alive_interval(Duration::from_secs(5))
            .http2_keep_alive_timeout(Duration::from_secs(5))
            .http2_keep_alive_while_idle(true)
            .build()
            .map_err(|e| RequestPlaneError::Unavailable(e.to_string()))?;
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

impl Decoder {
    fn next_frame(&mut self) -> Option<Result<Frame, RequestPlaneError>> {
        if self.buffer.len() < 4 {
            return None;
        }
        let len = u32::from_be_bytes([
            self.buffer[0],
            self.buffer[1],
            self.buffer[2],
            self.buffer[3],
        ]) as usize;
        if self.buffer.len() < 4 + len {
            return None;
        }
        self.buffer.advance(4);
        let payload = self.buffer.split_to(len);
        Some(rmp_serde::from_slice(&payload).map_err(|_| RequestPlaneError::Disconnected))
    }

    async fn next(mut self) -> Option<(Result<GenerateOutput, RequestPlaneError>, Self)> {
        loop {
            if self.done {
                return None;
            }
            match self.next_frame() {
                Some(Ok(Frame::Output(output))) => {
                    self.finished |= matches!(output, GenerateOutput::Finished { .. });
                    return Some((Ok(output), self));
                }
                Some(Ok(Frame::Error(message))) => {
                    self.done = true;
                    return Some((Err(RequestPlaneError::Unavailable(message)), self));
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
                    return Some((Err(RequestPlaneError::Disconnected), self));
                }
                None => {
                    self.done = true;
                    if self.finished {
                        return None;
                    }
                    return Some((Err(RequestPlaneError::Disconnected), self));
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
    ) -> Result<ResponseStream, RequestPlaneError> {
        let address = worker.address.as_deref().ok_or_else(|| {
            RequestPlaneError::UnknownWorker(format!(
                "{} has no request-plane address",
                worker.worker_id
            ))
        })?;
        let body =
            rmp_serde::to_vec(&request).map_err(|e| RequestPlaneError::Rejected(e.to_string()))?;
        let response = self
            .client
            .post(format!("http://{address}{GENERATE_PATH}"))
            .body(body)
            .send()
            .await
            .map_err(|e| RequestPlaneError::Unavailable(format!("{address}: {e}")))?;
        match response.status() {
            StatusCode::OK => {}
            StatusCode::UNPROCESSABLE_ENTITY => {
                return Err(RequestPlaneError::Rejected(
                    response.text().await.unwrap_or_default(),
                ));
            }
            status => {
                return Err(RequestPlaneError::Unavailable(format!(
                    "{address} answered {status}"
                )));
            }
        }
        let decoder = Decoder {
            body: response.bytes_stream().boxed(),
            buffer: BytesMut::new(),
            finished: false,
            done: false,
        };
        Ok(futures::stream::unfold(decoder, Decoder::next).boxed())
    }
}
