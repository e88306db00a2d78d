//! The frontend's side of the request plane, end to end through its public API:
//! `HttpRequestPlane::generate` (crates/runtime/src/net/http.rs) POSTs to a loopback HTTP/2
//! server that answers with the fuzzer's bytes, and the response is decoded by the private
//! frame decoder (`Decoder::next_frame`, 4-byte big-endian length then a MessagePack frame)
//! or, for a refusal, by `error_of`.
//!
//! Input: byte 0 picks the status (200 three times in four), byte 1 the size of the body's
//! chunks (0: one chunk), the rest is the body. The stream must be what the protocol says
//! (a reference decoder below, from the module's documentation): the outputs of the whole
//! frames in order; after an error frame, an oversized or undecodable frame, nothing more;
//! and a stream that ends without a `Finished` output ends with `Disconnected`. It must not
//! depend on how the body was cut into chunks, and must end.
#![no_main]

use std::convert::Infallible;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use futures::StreamExt;
use libfuzzer_sys::fuzz_target;
use serde::{Deserialize, Serialize};
use switchyard_core::protocol::{GenerateOutput, GenerateRequest};
use switchyard_core::{EngineError, RequestId, WorkerId};
use switchyard_fuzz::{same, samples, seed};
use switchyard_runtime::net::http::{GENERATE_PATH, HttpRequestPlane, MAX_FRAME_BYTES};
use switchyard_runtime::net::server::{ServerLimits, serve};
use switchyard_runtime::{RequestPlane, WorkerInstance};

/// The wire frame, as crates/runtime/src/net/http.rs defines it (privately).
#[derive(Debug, Serialize, Deserialize)]
enum Frame {
    Output(GenerateOutput),
    Error(EngineError),
}

const STATUSES: [u16; 8] = [400, 401, 413, 422, 429, 500, 503, 404];

#[derive(Default)]
struct Reply {
    status: u16,
    chunks: Vec<Bytes>,
}

struct Harness {
    runtime: tokio::runtime::Runtime,
    plane: HttpRequestPlane,
    worker: WorkerInstance,
    reply: Arc<Mutex<Reply>>,
}

async fn answer(State(reply): State<Arc<Mutex<Reply>>>) -> Response {
    let (status, chunks) = {
        let reply = reply.lock().expect("not poisoned");
        (reply.status, reply.chunks.clone())
    };
    let body = Body::from_stream(futures::stream::iter(chunks.into_iter().map(Ok::<_, Infallible>)));
    let mut response = Response::new(body);
    *response.status_mut() = StatusCode::from_u16(status).expect("a valid status");
    response
}

fn harness() -> &'static Harness {
    static HARNESS: OnceLock<Harness> = OnceLock::new();
    HARNESS.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let reply = Arc::new(Mutex::new(Reply::default()));
        let app = Router::new()
            .route(GENERATE_PATH, axum::routing::post(answer))
            .with_state(Arc::clone(&reply));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("binds");
        listener.set_nonblocking(true).expect("non-blocking");
        let address = listener.local_addr().expect("an address");
        runtime.spawn(async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("a listener");
            serve(listener, app, ServerLimits::REQUEST_PLANE, std::future::pending()).await
        });
        let plane = runtime.block_on(async { HttpRequestPlane::new() }).expect("a client");
        let mut worker = WorkerInstance::new(WorkerId(1), "m");
        worker.address = Some(address.to_string());
        Harness {
            runtime,
            plane,
            worker,
            reply,
        }
    })
}

/// What the frontend must make of a 200 response's body.
fn expected_stream(body: &[u8]) -> Vec<Result<GenerateOutput, EngineError>> {
    let mut out = Vec::new();
    let mut rest = body;
    let mut finished = false;
    while rest.len() >= 4 {
        let len = u32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        if len > MAX_FRAME_BYTES {
            out.push(Err(EngineError::Internal("oversized".into())));
            return out;
        }
        if rest.len() < 4 + len {
            break;
        }
        match rmp_serde::from_slice::<Frame>(&rest[4..4 + len]) {
            Ok(Frame::Output(output)) => {
                finished |= matches!(output, GenerateOutput::Finished { .. });
                out.push(Ok(output));
            }
            Ok(Frame::Error(e)) => {
                out.push(Err(e));
                return out;
            }
            Err(_) => {
                out.push(Err(EngineError::Internal("undecodable".into())));
                return out;
            }
        }
        rest = &rest[4 + len..];
    }
    if !finished {
        out.push(Err(EngineError::Disconnected));
    }
    out
}

/// What the frontend must make of a refusal.
fn expected_refusal(status: u16, body: &[u8]) -> EngineError {
    if let Ok(error) = rmp_serde::from_slice::<EngineError>(body) {
        return error;
    }
    let text: String = String::from_utf8_lossy(body).chars().take(512).collect();
    match status {
        400 => EngineError::Invalid(text),
        413 => EngineError::Invalid(format!("the request is too large for the worker: {text}")),
        422 => EngineError::Unsupported(text),
        429 => EngineError::Overloaded(text),
        _ => EngineError::Unreachable(String::new()),
    }
}

/// Equal, except that the texts of `Internal` and `Unreachable` errors made up by the
/// frontend are not compared.
fn agrees(got: &Result<GenerateOutput, EngineError>, want: &Result<GenerateOutput, EngineError>) -> bool {
    match (got, want) {
        (Ok(a), Ok(b)) => same(a, b),
        (Err(EngineError::Internal(_)), Err(EngineError::Internal(w))) if w == "oversized" || w == "undecodable" => true,
        (Err(EngineError::Unreachable(_)), Err(EngineError::Unreachable(w))) if w.is_empty() => true,
        (Err(a), Err(b)) => a == b,
        _ => false,
    }
}

fn frames(items: &[Frame]) -> Vec<u8> {
    let mut out = Vec::new();
    for item in items {
        let payload = rmp_serde::to_vec(item).expect("encodes");
        out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        out.extend_from_slice(&payload);
    }
    out
}

fn seeds() -> Vec<Vec<u8>> {
    let outputs = samples::outputs();
    let all: Vec<Frame> = outputs.iter().cloned().map(Frame::Output).collect();
    let unfinished: Vec<Frame> = outputs[..2].iter().cloned().map(Frame::Output).collect();
    let failed = vec![
        Frame::Output(outputs[0].clone()),
        Frame::Error(EngineError::Internal("engine died".into())),
    ];
    let mut out = Vec::new();
    for (chunk, body) in [
        (0u8, frames(&all)),
        (3, frames(&all)),
        (0, frames(&unfinished)),
        (0, frames(&failed)),
        (0, (MAX_FRAME_BYTES as u32 + 1).to_be_bytes().to_vec()),
    ] {
        out.push([vec![0, chunk], body].concat());
    }
    for (i, error) in samples::errors().iter().enumerate() {
        out.push([vec![0xc0 + i as u8, 0], rmp_serde::to_vec(error).expect("encodes")].concat());
    }
    out.push([vec![0xc0, 0], b"plain text".to_vec()].concat());
    out
}

fuzz_target!(
    init: seed(seeds()),
    |data: &[u8]| {
        if data.len() < 2 {
            return;
        }
        let status = match data[0] {
            0..=0xbf => 200,
            b => STATUSES[usize::from(b) % STATUSES.len()],
        };
        let body = &data[2..];
        let chunks: Vec<Bytes> = match usize::from(data[1]) {
            0 => vec![Bytes::copy_from_slice(body)],
            n => body.chunks(n).map(Bytes::copy_from_slice).collect(),
        };
        let h = harness();
        *h.reply.lock().expect("not poisoned") = Reply { status, chunks };
        let request = GenerateRequest::text(RequestId(1), vec![1, 2, 3], 4);
        let got = h.runtime.block_on(async {
            tokio::time::timeout(Duration::from_secs(20), async {
                match h.plane.generate(&h.worker, request).await {
                    Ok(stream) => Ok(stream.collect::<Vec<_>>().await),
                    Err(e) => Err(e),
                }
            })
            .await
        });
        let Ok(got) = got else {
            panic!("the response stream did not end (status {status}, {} body bytes)", body.len());
        };
        if status == 200 {
            let got = match got {
                Ok(items) => items,
                Err(e) => panic!("a 200 response was refused: {e:?}"),
            };
            let want = expected_stream(body);
            assert!(
                got.len() == want.len() && got.iter().zip(&want).all(|(g, w)| agrees(g, w)),
                "the stream differs from the protocol's\n got: {got:?}\nwant: {want:?}"
            );
        } else {
            let want = expected_refusal(status, body);
            match got {
                Ok(items) => panic!("a {status} response was streamed: {items:?}"),
                Err(e) => assert!(
                    agrees(&Err(e.clone()), &Err(want.clone())),
                    "a {status} refusal decoded as {e:?}, not {want:?}"
                ),
            }
        }
    }
);
