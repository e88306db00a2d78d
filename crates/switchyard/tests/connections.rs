//! Slow, idle and too many client connections cannot take the server down.

#![allow(clippy::unwrap_used)]

mod support;

use std::time::{Duration, Instant};

use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const MODEL: &str = "switchyard-mock";

const LIMITS: &[(&str, &str)] = &[
    ("FRONTEND__CONNECTIONS__HEADER_READ_TIMEOUT", "400ms"),
    ("FRONTEND__CONNECTIONS__BODY_READ_TIMEOUT", "400ms"),
    ("FRONTEND__CONNECTIONS__MIN_BODY_RATE", "1000"),
    ("FRONTEND__CONNECTIONS__MAX_CONNECTIONS", "64"),
];

/// Sends `request` on a new connection and reads the whole answer (`Connection: close`).
async fn once(d: &switchyard::deploy::Deployment, request: &str) -> String {
    let mut stream = TcpStream::connect(d.address).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    read_until_closed(&mut stream, Duration::from_secs(3))
        .await
        .0
}

const HEALTH: &str = "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";

/// Reads until the server closes the connection (or `within` passes); returns what was
/// read and whether it closed.
async fn read_until_closed(stream: &mut TcpStream, within: Duration) -> (String, bool) {
    let mut received = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return (String::from_utf8_lossy(&received).into(), true),
            Ok(Ok(n)) => received.extend_from_slice(&buf[..n]),
            Err(_) => return (String::from_utf8_lossy(&received).into(), false),
        }
    }
}

#[tokio::test]
async fn slow_headers_and_idle_connections_are_closed_and_health_still_answers() {
    let d = start(LIMITS).await;
    // Four times the connection limit, each stuck half-way through its headers.
    let mut slow = Vec::new();
    for _ in 0..256 {
        let Ok(mut stream) = TcpStream::connect(d.address).await else {
            continue;
        };
        let _ = stream
            .write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
            .await;
        slow.push(stream);
    }
    // Health answers within a few header timeouts, on a fresh connection each try.
    let started = Instant::now();
    let mut answered = false;
    while started.elapsed() < Duration::from_secs(5) {
        let response = reqwest::Client::builder()
            .timeout(Duration::from_secs(1))
            .build()
            .unwrap()
            .get(url(&d, "/health"))
            .send()
            .await;
        if response.is_ok_and(|r| r.status().is_success()) {
            answered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        answered,
        "health did not answer with slow clients holding connections"
    );
    // Every stuck client was cut off, by the header timeout or the connection limit.
    for stream in &mut slow {
        let (_, closed) = read_until_closed(stream, Duration::from_secs(3)).await;
        assert!(closed, "a connection with unfinished headers stayed open");
    }
    // A kept-alive connection idle past the header timeout is closed too.
    let mut idle = TcpStream::connect(d.address).await.unwrap();
    idle.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let started = Instant::now();
    let (text, closed) = read_until_closed(&mut idle, Duration::from_secs(3)).await;
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(closed, "an idle kept-alive connection stayed open");
    assert!(started.elapsed() >= Duration::from_millis(300));
    d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_body_that_never_finishes_gets_408_and_others_are_served() {
    let d = start(LIMITS).await;
    let mut stream = TcpStream::connect(d.address).await.unwrap();
    stream
        .write_all(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 200\r\n\r\n{\"model\":",
        )
        .await
        .unwrap();
    // Meanwhile a whole request is served.
    let response = client()
        .post(url(&d, "/v1/chat/completions"))
        .json(&chat(MODEL, "hi", 4))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let (text, _) = read_until_closed(&mut stream, Duration::from_secs(3)).await;
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(
        text.contains("\"error\""),
        "an OpenAI-style error body: {text}"
    );
    d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
        .await
        .unwrap();
}

/// A connection that never sends a byte is closed at the header timeout from its accept.
#[tokio::test]
async fn a_silent_connection_is_closed_from_its_accept() {
    let d = start(LIMITS).await;
    let mut silent = TcpStream::connect(d.address).await.unwrap();
    let started = Instant::now();
    let (text, closed) = read_until_closed(&mut silent, Duration::from_secs(3)).await;
    assert!(closed && text.is_empty(), "{text}");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(2),
        "{took:?}"
    );
    d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
        .await
        .unwrap();
}

/// A body trickled steadily (never stalling) below the minimum rate gets its 408 once its
/// deadline passes.
#[tokio::test]
async fn a_steadily_trickled_body_gets_408_at_its_deadline() {
    let d = start(LIMITS).await;
    let mut stream = TcpStream::connect(d.address).await.unwrap();
    stream
        .write_all(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n",
        )
        .await
        .unwrap();
    // A byte every 50 ms: 20 bytes/s, far below 1,000, with no pause near the 400 ms grace.
    let started = Instant::now();
    let writer = async {
        for _ in 0..100 {
            if stream.write_all(b" ").await.is_err() {
                break;
            }
            let mut buf = [0u8; 4096];
            if let Ok(Ok(n)) =
                tokio::time::timeout(Duration::from_millis(50), stream.read(&mut buf)).await
            {
                return String::from_utf8_lossy(&buf[..n]).into_owned();
            }
        }
        String::new()
    };
    let text = writer.await;
    assert!(text.starts_with("HTTP/1.1 408"), "{text:?}");
    let took = started.elapsed();
    assert!(took < Duration::from_secs(2), "{took:?}");
    d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
        .await
        .unwrap();
}

/// At the connection limit, the connection idle the longest is closed to let a new one in.
#[tokio::test]
async fn at_the_limit_the_oldest_idle_connection_makes_room() {
    let d = start(&[
        ("FRONTEND__CONNECTIONS__HEADER_READ_TIMEOUT", "20s"),
        ("FRONTEND__CONNECTIONS__MAX_CONNECTIONS", "8"),
    ])
    .await;
    // Eight kept-alive connections, each idle after one request, the first idle longest.
    let mut idle = Vec::new();
    for _ in 0..8 {
        let mut stream = TcpStream::connect(d.address).await.unwrap();
        stream
            .write_all(b"GET /live HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut buf = [0u8; 1024];
        let n = stream.read(&mut buf).await.unwrap();
        assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
        idle.push(stream);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A new client is served, and the first idle connection was the one closed.
    let text = once(&d, HEALTH).await;
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    let (_, closed) = read_until_closed(&mut idle[0], Duration::from_millis(500)).await;
    assert!(closed, "the oldest idle connection stayed open");
    for stream in &mut idle[1..] {
        let (_, closed) = read_until_closed(stream, Duration::from_millis(50)).await;
        assert!(!closed, "a younger idle connection was closed");
    }
    d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
        .await
        .unwrap();
}

/// With every connection busy, a new one still gets `/health` (and a 503 for anything else)
/// from the overflow lane.
#[tokio::test]
async fn health_answers_when_every_connection_is_busy() {
    let d = start(&[
        ("FRONTEND__CONNECTIONS__BODY_READ_TIMEOUT", "5s"),
        ("FRONTEND__CONNECTIONS__MAX_CONNECTIONS", "8"),
    ])
    .await;
    // Eight requests in flight, their bodies still coming.
    let mut busy = Vec::new();
    for _ in 0..8 {
        let mut stream = TcpStream::connect(d.address).await.unwrap();
        stream
            .write_all(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{",
            )
            .await
            .unwrap();
        busy.push(stream);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let text = once(&d, HEALTH).await;
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    let live = once(&d, "GET /live HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(live.starts_with("HTTP/1.1 200"), "{live}");
    let other = once(&d, "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(other.starts_with("HTTP/1.1 503"), "{other}");
    assert!(other.contains("connection limit"), "{other}");
    drop(busy);
    d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
        .await
        .unwrap();
}

/// Long prompts whose clients go before their turn at the tokenizer are never tokenized:
/// one large conversion per core at a time, and the waiting ones leave with their clients.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_prompts_of_clients_gone_are_not_tokenized() {
    let d = start(&[]).await;
    let prompt = "many words to tokenize here ".repeat(4_000);
    let request = serde_json::json!({"model": MODEL, "prompt": prompt, "max_tokens": 1});
    let body = serde_json::to_vec(&request).unwrap();
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    // One whole request, for the tokens one prompt makes.
    let before = metric(&d, "switchyard_tokenized_prompt_tokens").await;
    let (status, _, _) = post(&d, "/v1/completions", &request).await;
    assert_eq!(status, 200);
    let one = metric(&d, "switchyard_tokenized_prompt_tokens").await - before;
    assert!(one > 10_000.0, "{one}");
    // Twelve at once, each client gone as soon as its request is sent.
    let before = metric(&d, "switchyard_tokenized_prompt_tokens").await;
    let mut sent = Vec::new();
    for _ in 0..12 {
        let mut stream = TcpStream::connect(d.address).await.unwrap();
        stream.write_all(head.as_bytes()).await.unwrap();
        stream.write_all(&body).await.unwrap();
        sent.push(stream);
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    drop(sent);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let tokenized = (metric(&d, "switchyard_tokenized_prompt_tokens").await - before) / one;
    assert!(
        tokenized < 6.0,
        "{tokenized} of 12 gone clients' prompts were tokenized"
    );
    d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
        .await
        .unwrap();
}
