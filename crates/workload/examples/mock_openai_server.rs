//! A local OpenAI-compatible server with a fixed latency profile and optional faults, to try
//! `switchyard bench` without a GPU:
//!
//! ```sh
//! cargo run -p switchyard-workload --example mock_openai_server -- --port 8000 --ttft-ms 50 --itl-ms 10
//! ```
//!
//! It generates `max_tokens` tokens for every request (as with `ignore_eos`), reports usage
//! (prompt words, plus a chat-template overhead on the chat endpoint) and stops on Ctrl-C.

#[allow(dead_code)]
#[path = "../tests/support/mock_server.rs"]
mod mock_server;

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use mock_server::{Profile, Stats};

#[derive(Debug, Parser)]
struct Args {
    /// Address to listen on; loopback unless you mean otherwise.
    #[arg(long, default_value = "127.0.0.1")]
    host: IpAddr,
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// Time to first token.
    #[arg(long, default_value_t = 50)]
    ttft_ms: u64,
    /// Time between tokens.
    #[arg(long, default_value_t = 10)]
    itl_ms: u64,
    /// Answer every n-th request with HTTP 500.
    #[arg(long)]
    fail_every: Option<usize>,
    /// Drop the connection halfway through every n-th streamed response.
    #[arg(long)]
    drop_every: Option<usize>,
    /// Send no usage.
    #[arg(long)]
    no_usage: bool,
    /// Tokens the chat endpoint adds to the prompt's word count.
    #[arg(long, default_value_t = 7)]
    chat_template_tokens: u64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let profile = Profile {
        ttft: Duration::from_millis(args.ttft_ms),
        itl: Duration::from_millis(args.itl_ms),
        fail_every: args.fail_every.filter(|&n| n > 0),
        drop_every: args.drop_every.filter(|&n| n > 0),
        send_usage: !args.no_usage,
        chat_template_tokens: args.chat_template_tokens,
    };
    let listener = tokio::net::TcpListener::bind((args.host, args.port))
        .await
        .with_context(|| format!("cannot listen on {}:{}", args.host, args.port))?;
    eprintln!(
        "mock OpenAI server on http://{} (TTFT {} ms, ITL {} ms); Ctrl-C stops it",
        listener.local_addr()?,
        args.ttft_ms,
        args.itl_ms
    );
    let stats = Arc::new(Stats::default());
    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    mock_server::serve(listener, profile, Arc::clone(&stats), shutdown).await?;
    eprintln!(
        "served {} requests",
        stats.requests.load(std::sync::atomic::Ordering::SeqCst)
    );
    Ok(())
}
