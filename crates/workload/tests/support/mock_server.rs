//! An OpenAI-compatible test server with a known latency profile and injected faults.
//!
//! Shared by the integration tests and `examples/mock_openai_server.rs`. Tokens are
//! scheduled at absolute times (`ttft + i * itl` after the request arrived), so timer
//! jitter on one token does not push back the ones after it. Prompt usage counts words
//! (the benchmark's one-word-one-token assumption), plus a fixed chat-template overhead on
//! the chat endpoint so tests can tell server counts from client estimates.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Json, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::serve::ListenerExt;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::time::Instant;

/// How the server behaves.
#[derive(Debug, Clone)]
pub struct Profile {
    pub ttft: Duration,
    pub itl: Duration,
    /// Answer every n-th request (by arrival, from 1) with HTTP 500.
    pub fail_every: Option<usize>,
    /// Drop the connection halfway through the stream of every n-th request.
    pub drop_every: Option<usize>,
    /// Report `usage` (in the last stream chunk when the client asks for it).
    pub send_usage: bool,
    /// Added to the prompt's word count in chat usage, like a chat template.
    pub chat_template_tokens: u64,
}

impl Default for Profile {
    fn default() -> Self {
        Self {
            ttft: Duration::from_millis(50),
            itl: Duration::from_millis(10),
            fail_every: None,
            drop_every: None,
            send_usage: true,
            chat_template_tokens: 7,
        }
    }
}

/// What the server saw.
#[derive(Debug, Default)]
pub struct Stats {
    pub requests: AtomicUsize,
    pub in_flight: AtomicUsize,
    pub max_in_flight: AtomicUsize,
}

#[derive(Clone)]
struct Shared {
    profile: Arc<Profile>,
    stats: Arc<Stats>,
}

/// Serves on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    profile: Profile,
    stats: Arc<Stats>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let shared = Shared {
        profile: Arc::new(profile),
        stats,
    };
    let app = Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .with_state(shared);
    // Token chunks are small writes: without TCP_NODELAY, Nagle's algorithm and delayed
    // ACKs would add tens of milliseconds to the inter-token latency.
    let listener = listener.tap_io(|stream| {
        let _ = stream.set_nodelay(true);
    });
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}

/// A server on its own thread and runtime (like a real server process), stopped on drop.
pub struct MockServer {
    pub addr: SocketAddr,
    pub stats: Arc<Stats>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl MockServer {
    pub fn start(profile: Profile) -> io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?;
        let listener = runtime.block_on(TcpListener::bind("127.0.0.1:0"))?;
        let addr = listener.local_addr()?;
        let stats = Arc::new(Stats::default());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server_stats = Arc::clone(&stats);
        let thread = std::thread::spawn(move || {
            runtime.block_on(async move {
                // Stop at once on drop: tests need no graceful drain.
                tokio::select! {
                    _ = serve(listener, profile, server_stats, std::future::pending()) => {}
                    _ = stopped => {}
                }
            });
        });
        Ok(Self {
            addr,
            stats,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for MockServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn chat(State(shared): State<Shared>, Json(body): Json<Value>) -> Response {
    let words: u64 = body["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["content"].as_str())
        .map(|text| text.split_whitespace().count() as u64)
        .sum();
    let prompt_tokens = words + shared.profile.chat_template_tokens;
    respond(shared, body, prompt_tokens, true).await
}

async fn completions(State(shared): State<Shared>, Json(body): Json<Value>) -> Response {
    let words = body["prompt"]
        .as_str()
        .map_or(0, |text| text.split_whitespace().count() as u64);
    respond(shared, body, words, false).await
}

/// Counts the request as in flight until dropped (the response body ends or breaks).
struct InFlight(Arc<Stats>);

impl InFlight {
    fn new(stats: Arc<Stats>) -> Self {
        let now = stats.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        stats.max_in_flight.fetch_max(now, Ordering::SeqCst);
        Self(stats)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn respond(shared: Shared, body: Value, prompt_tokens: u64, chat: bool) -> Response {
    let arrived = Instant::now();
    let number = shared.stats.requests.fetch_add(1, Ordering::SeqCst) + 1;
    let profile = Arc::clone(&shared.profile);
    if profile.fail_every.is_some_and(|n| number.is_multiple_of(n)) {
        let error = json!({"error": {"message": "injected failure", "type": "server_error"}});
        return (StatusCode::INTERNAL_SERVER_ERROR, axum::Json(error)).into_response();
    }
    let max_tokens = body["max_tokens"].as_u64().unwrap_or(16).max(1);
    let usage = json!({
        "prompt_tokens": prompt_tokens,
        "completion_tokens": max_tokens,
        "total_tokens": prompt_tokens + max_tokens,
    });
    let in_flight = InFlight::new(Arc::clone(&shared.stats));
    if !body["stream"].as_bool().unwrap_or(false) {
        tokio::time::sleep_until(arrived + profile.ttft + profile.itl * (max_tokens as u32 - 1))
            .await;
        drop(in_flight);
        let text = vec!["tok"; max_tokens as usize].join(" ");
        let choice = if chat {
            json!({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"})
        } else {
            json!({"index": 0, "text": text, "finish_reason": "length"})
        };
        let mut answer = json!({"object": "completion", "choices": [choice]});
        if profile.send_usage {
            answer["usage"] = usage;
        }
        return axum::Json(answer).into_response();
    }
    let include_usage =
        profile.send_usage && body["stream_options"]["include_usage"].as_bool() == Some(true);
    let drop_after = profile
        .drop_every
        .filter(|&n| number.is_multiple_of(n))
        .map(|_| max_tokens / 2);
    let events = token_events(
        profile,
        arrived,
        max_tokens,
        chat,
        include_usage.then_some(usage),
        drop_after,
        in_flight,
    );
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .body(Body::from_stream(events))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

/// The SSE events of one streamed response, each released at its scheduled time.
fn token_events(
    profile: Arc<Profile>,
    arrived: Instant,
    max_tokens: u64,
    chat: bool,
    usage: Option<Value>,
    drop_after: Option<u64>,
    in_flight: InFlight,
) -> impl futures_util::Stream<Item = io::Result<Bytes>> + Send {
    futures_util::stream::unfold(0u64, move |sent| {
        let profile = Arc::clone(&profile);
        let usage = usage.clone();
        let _alive = &in_flight;
        async move {
            if drop_after == Some(sent) {
                // An error from the body stream makes the server abort the connection.
                return Some((Err(io::Error::other("injected drop")), u64::MAX));
            }
            if sent == u64::MAX || sent > max_tokens + 1 {
                return None;
            }
            let data = if sent < max_tokens {
                let at = arrived + profile.ttft + profile.itl * sent as u32;
                tokio::time::sleep_until(at).await;
                let last = sent + 1 == max_tokens;
                let finish = if last { json!("length") } else { Value::Null };
                let choice = if chat {
                    json!({"index": 0, "delta": {"content": " tok"}, "finish_reason": finish})
                } else {
                    json!({"index": 0, "text": " tok", "finish_reason": finish})
                };
                json!({"object": "chunk", "choices": [choice]}).to_string()
            } else if sent == max_tokens {
                match usage {
                    Some(usage) => {
                        json!({"object": "chunk", "choices": [], "usage": usage}).to_string()
                    }
                    None => return Some((Ok(Bytes::new()), sent + 1)),
                }
            } else {
                "[DONE]".to_string()
            };
            Some((Ok(Bytes::from(format!("data: {data}\n\n"))), sent + 1))
        }
    })
}
