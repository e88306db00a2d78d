//! The HTTP server loop shared by the frontend (the OpenAI API) and workers (the request
//! plane): HTTP/1.1 and HTTP/2 on one port, bounded connections, graceful shutdown.
//!
//! Every connection gets `TCP_NODELAY`: streamed responses are many small writes, and with
//! Nagle's algorithm each one after the first would wait for the peer's delayed ACK (40 ms
//! on Linux). A client must send each HTTP/1.1 request's headers within
//! [`ServerLimits::header_read_timeout`], which also closes kept-alive connections idle that
//! long; an HTTP/2 connection whose peer stops answering pings that long is closed. Past
//! [`ServerLimits::max_connections`] open connections, new ones are closed as soon as they
//! are accepted, so slow or idle clients cannot exhaust sockets or memory.
//!
//! HTTP/2 protects itself from "rapid reset" floods (CVE-2023-44487) by closing a
//! connection whose peer cancels too many streams the server has not picked up yet. h2's
//! default allows 20, sized for browsers. A frontend multiplexes every request to a worker
//! over one connection and cancels a stream each time a request moves away or its client
//! goes, so a worker busy for a moment would take a burst of cancellations for an attack and
//! drop every request on that connection. [`ServerLimits::max_concurrent_streams`] bounds
//! both.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// Bounds on what clients may hold open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerLimits {
    /// Longest a client may take to send an HTTP/1.1 request's headers, and longest a
    /// kept-alive connection may idle; also the HTTP/2 ping interval and ping timeout.
    pub header_read_timeout: Duration,
    /// Open connections at most.
    pub max_connections: usize,
    /// Streams one HTTP/2 connection may carry at once, and cancelled streams not yet
    /// picked up it may hold before the connection is closed as abusive.
    pub max_concurrent_streams: u32,
}

impl ServerLimits {
    /// A public API: many clients, each with a few streams.
    pub const PUBLIC: ServerLimits = ServerLimits {
        header_read_timeout: Duration::from_secs(10),
        max_connections: 8192,
        max_concurrent_streams: 256,
    };

    /// A worker's request plane: a few frontends, each multiplexing every request it sends
    /// this worker over one connection.
    pub const REQUEST_PLANE: ServerLimits = ServerLimits {
        header_read_timeout: Duration::from_secs(30),
        max_connections: 1024,
        max_concurrent_streams: 16_384,
    };
}

/// Serves `app` on an already-bound listener until `shutdown` resolves, then finishes the
/// responses in flight.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ServerLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.max_concurrent_streams)
        .max_pending_accept_reset_streams(limits.max_concurrent_streams as usize)
        .keep_alive_interval(limits.header_read_timeout)
        .keep_alive_timeout(limits.header_read_timeout);
    let graceful = GracefulShutdown::new();
    let open = Arc::new(Semaphore::new(limits.max_connections));
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (tcp, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors, most often: wait for connections to close
                    // rather than spin.
                    tracing::warn!(error = %e, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let Ok(permit) = Arc::clone(&open).try_acquire_owned() else {
            tracing::debug!("connection limit reached; closing a new connection");
            drop(tcp);
            continue;
        };
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY");
        }
        let service = TowerToHyperService::new(app.clone());
        let connection = builder
            .serve_connection_with_upgrades(TokioIo::new(tcp), service)
            .into_owned();
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "connection ended with an error");
            }
            drop(permit);
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}
