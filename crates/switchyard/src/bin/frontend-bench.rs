//! Frontend overhead: Switchyard with an instant engine against a minimal axum SSE server
//! that streams the same bytes, at several concurrencies, in one run.
//!
//! `cargo run --release -p switchyard --bin frontend-bench -- [--seconds 5] [--concurrency 1,64,1024] [--tokenizer smollm2|bytes] [--json]`

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use axum::response::sse::{Event, Sse};
use clap::Parser;
use futures::StreamExt;
use serde::Serialize;
use switchyard::config;
use switchyard::deploy;

#[derive(Debug, Parser)]
struct Args {
    /// Seconds measured per server and concurrency (after a one-second warm-up).
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Concurrent streams.
    #[arg(long, value_delimiter = ',', default_value = "1,64,1024")]
    concurrency: Vec<usize>,
    /// Tokens per response.
    #[arg(long, default_value_t = 16)]
    max_tokens: u32,
    /// Threads of the servers' runtime (the client gets its own).
    #[arg(long, default_value_t = 1)]
    server_threads: usize,
    #[arg(long, default_value_t = 1)]
    client_threads: usize,
    #[arg(long)]
    json: bool,
    /// The built-in tokenizer Switchyard uses: `smollm2` (the default, a real BPE) or
    /// `bytes` (one token per byte: the frontend's own overhead without tokenizer cost).
    #[arg(long, default_value = "smollm2")]
    tokenizer: String,
}

#[derive(Debug, Clone, Copy, Serialize)]
struct Measure {
    requests_per_sec: f64,
    p50_ms: f64,
    p99_ms: f64,
    errors: u64,
}

#[derive(Debug, Serialize)]
struct Row {
    concurrency: usize,
    reference: Measure,
    switchyard: Measure,
    throughput_ratio: f64,
    added_p50_ms: f64,
    added_p99_ms: f64,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let servers = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.server_threads.max(1))
        .enable_all()
        .build()?;
    let client = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.client_threads.max(1))
        .enable_all()
        .build()?;

    // Switchyard: one echo worker with no delays, a built-in tokenizer.
    let env = [
        ("SWITCHYARD_FRONTEND__PORT", "0"),
        ("SWITCHYARD_WORKERS__ENGINE", "echo"),
        ("SWITCHYARD_WORKERS__COUNT", "1"),
        ("SWITCHYARD_LOG__LEVEL", "warn"),
        (
            "SWITCHYARD_FRONTEND__BUILTIN_TOKENIZER",
            args.tokenizer.as_str(),
        ),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let config = config::load(None, &env, toml::Table::new())?;
    let deployment = servers.block_on(deploy::start_local(config))?;
    let ours = deployment.address;

    let body = serde_json::json!({
        "model": "switchyard-mock",
        "messages": [{"role": "user", "content": "The quick brown fox jumps over the lazy dog. How fast is it?"}],
        "max_tokens": args.max_tokens,
        "stream": true,
    })
    .to_string();

    // The reference streams exactly the events Switchyard sent for this request.
    let events = client.block_on(fetch_events(ours, &body))?;
    if events.len() < 3 {
        bail!("unexpected response from Switchyard: {events:?}");
    }
    let reference = servers.block_on(start_reference(events.clone()))?;

    let mut rows = Vec::new();
    for &c in &args.concurrency {
        let duration = Duration::from_secs_f64(args.seconds);
        // Alternate the two servers to share any drift of the machine.
        let r1 = client.block_on(load(reference, &body, c, duration))?;
        let s1 = client.block_on(load(ours, &body, c, duration))?;
        let r2 = client.block_on(load(reference, &body, c, duration))?;
        let s2 = client.block_on(load(ours, &body, c, duration))?;
        let (r, s) = (r1.merge(&r2), s1.merge(&s2));
        rows.push(Row {
            concurrency: c,
            reference: r.summary(),
            switchyard: s.summary(),
            throughput_ratio: s.summary().requests_per_sec / r.summary().requests_per_sec,
            added_p50_ms: s.summary().p50_ms - r.summary().p50_ms,
            added_p99_ms: s.summary().p99_ms - r.summary().p99_ms,
        });
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    } else {
        println!(
            "{} events per response ({} tokens); {} server thread(s), {} client thread(s)",
            events.len(),
            args.max_tokens,
            args.server_threads,
            args.client_threads
        );
        println!(
            "{:>6} | {:>10} {:>8} {:>8} | {:>10} {:>8} {:>8} | {:>6} {:>9} {:>9}",
            "conc",
            "ref req/s",
            "p50 ms",
            "p99 ms",
            "sy req/s",
            "p50 ms",
            "p99 ms",
            "ratio",
            "+p50 ms",
            "+p99 ms"
        );
        for r in &rows {
            println!(
                "{:>6} | {:>10.0} {:>8.3} {:>8.3} | {:>10.0} {:>8.3} {:>8.3} | {:>6.2} {:>9.3} {:>9.3}",
                r.concurrency,
                r.reference.requests_per_sec,
                r.reference.p50_ms,
                r.reference.p99_ms,
                r.switchyard.requests_per_sec,
                r.switchyard.p50_ms,
                r.switchyard.p99_ms,
                r.throughput_ratio,
                r.added_p50_ms,
                r.added_p99_ms
            );
        }
    }
    servers.block_on(deployment.shutdown(switchyard::deploy::SHUTDOWN_GRACE))?;
    Ok(())
}

/// One response's SSE `data:` payloads.
async fn fetch_events(address: SocketAddr, body: &str) -> Result<Vec<String>> {
    let text = reqwest::Client::new()
        .post(format!("http://{address}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await?
        .text()
        .await?;
    Ok(text
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .map(str::to_string)
        .collect())
}

/// A minimal axum server answering every chat request with the given events.
async fn start_reference(events: Vec<String>) -> Result<SocketAddr> {
    let events = Arc::new(events);
    let app = axum::Router::new().route(
        "/v1/chat/completions",
        axum::routing::post(move |_body: axum::body::Bytes| {
            let events = Arc::clone(&events);
            async move {
                let stream = futures::stream::iter((0..events.len()).map(move |i| {
                    Ok::<_, std::convert::Infallible>(Event::default().data(events[i].as_str()))
                }));
                Sse::new(stream)
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .context("bind the reference server")?;
    let address = listener.local_addr()?;
    // The same socket setting as Switchyard's server.
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        let _ = tcp.set_nodelay(true);
    });
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(address)
}

#[derive(Debug, Default)]
struct Samples {
    latencies_us: Vec<u64>,
    errors: u64,
    seconds: f64,
}

impl Samples {
    fn merge(&self, other: &Samples) -> Samples {
        let mut latencies_us = self.latencies_us.clone();
        latencies_us.extend(&other.latencies_us);
        Samples {
            latencies_us,
            errors: self.errors + other.errors,
            seconds: self.seconds + other.seconds,
        }
    }

    fn summary(&self) -> Measure {
        let mut sorted = self.latencies_us.clone();
        sorted.sort_unstable();
        let at = |p: f64| {
            sorted
                .get(((sorted.len() as f64 * p) as usize).min(sorted.len().saturating_sub(1)))
                .copied()
                .unwrap_or(0) as f64
                / 1e3
        };
        Measure {
            requests_per_sec: sorted.len() as f64 / self.seconds,
            p50_ms: at(0.5),
            p99_ms: at(0.99),
            errors: self.errors,
        }
    }
}

/// `concurrency` clients each sending streamed requests back to back: a one-second warm-up,
/// then `duration` measured.
async fn load(
    address: SocketAddr,
    body: &str,
    concurrency: usize,
    duration: Duration,
) -> Result<Samples> {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(concurrency)
        .tcp_nodelay(true)
        .build()?;
    let url = format!("http://{address}/v1/chat/completions");
    let measuring = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (client, url, body) = (client.clone(), url.clone(), body.to_string());
        let (measuring, stop) = (Arc::clone(&measuring), Arc::clone(&stop));
        tasks.push(tokio::spawn(async move {
            let mut samples = Samples::default();
            while !stop.load(Ordering::Relaxed) {
                let started = Instant::now();
                let ok = match client
                    .post(&url)
                    .header("content-type", "application/json")
                    .body(body.clone())
                    .send()
                    .await
                {
                    Ok(response) if response.status().is_success() => {
                        let mut stream = response.bytes_stream();
                        let mut ok = true;
                        while let Some(chunk) = stream.next().await {
                            ok &= chunk.is_ok();
                        }
                        ok
                    }
                    _ => false,
                };
                if measuring.load(Ordering::Relaxed) && !stop.load(Ordering::Relaxed) {
                    if ok {
                        samples
                            .latencies_us
                            .push(started.elapsed().as_micros() as u64);
                    } else {
                        samples.errors += 1;
                    }
                }
            }
            samples
        }));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    measuring.store(true, Ordering::Relaxed);
    let start = Instant::now();
    tokio::time::sleep(duration).await;
    stop.store(true, Ordering::Relaxed);
    let seconds = start.elapsed().as_secs_f64();
    let mut all = Samples {
        seconds,
        ..Samples::default()
    };
    for task in tasks {
        let s = task.await?;
        all.latencies_us.extend(s.latencies_us);
        all.errors += s.errors;
    }
    Ok(all)
}
