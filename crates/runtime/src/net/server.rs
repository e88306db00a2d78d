//! The HTTP server loop shared by the frontend (the OpenAI API) and workers (the request
//! plane): HTTP/1.1 and HTTP/2 on one port, bounded connections, graceful shutdown.
//!
//! - Every connection gets `TCP_NODELAY`: streamed responses are many small writes, and
//!   with Nagle's algorithm each one after the first would wait for the peer's delayed ACK
//!   (40 ms on Linux).
//! - A connection must send a whole request head within
//!   [`ServerLimits::header_read_timeout`] of its accept, and of the end of its previous
//!   response: one that sends nothing, or its headers slowly, or idles between requests, is
//!   closed then ([`super::conns`]). Request bodies have their own deadline
//!   ([`super::deadline`]).
//! - Past [`ServerLimits::max_connections`], the connection idle the longest is closed to
//!   make room; when none is idle, a new connection goes to a small overflow lane that
//!   answers only the probes (`/health`, `/live`: [`ServerLimits::probes`]), once, then
//!   closes; beyond that lane, new connections are closed as soon as they are accepted.
//! - Headers are bounded: [`ServerLimits::max_header_bytes`] for HTTP/1.1's read buffer and
//!   HTTP/2's header list, at most 100 HTTP/1.1 header lines.
//! - HTTP/2 protects itself from "rapid reset" floods (CVE-2023-44487) by closing a
//!   connection whose peer cancels too many streams the server has not picked up yet. h2's
//!   default allows 20, sized for browsers. A frontend multiplexes every request to a worker
//!   over one connection and cancels a stream each time a request moves away or its client
//!   goes, so a worker busy for a moment would take a burst of cancellations for an attack
//!   and drop every request on that connection. [`ServerLimits::max_concurrent_streams`]
//!   bounds both, and the streams the server itself resets for errors.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use super::conns::{Conn, Registry, tracked};

/// Bounds on what clients may hold open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerLimits {
    /// Longest a connection may take to send a request's head, from its accept or from the
    /// end of its previous response (so also the longest it may idle); also the HTTP/2 ping
    /// interval and ping timeout.
    pub header_read_timeout: Duration,
    /// Open connections at most (the overflow lane aside).
    pub max_connections: usize,
    /// Streams one HTTP/2 connection may carry at once, and cancelled streams not yet
    /// picked up it may hold before the connection is closed as abusive.
    pub max_concurrent_streams: u32,
    /// Largest request head: HTTP/1.1's read buffer, HTTP/2's header list.
    pub max_header_bytes: u32,
    /// Connections of the overflow lane at most (0: none).
    pub probes: usize,
}

impl ServerLimits {
    /// A public API: many clients, each with a few streams.
    pub const PUBLIC: ServerLimits = ServerLimits {
        header_read_timeout: Duration::from_secs(10),
        max_connections: 8192,
        max_concurrent_streams: 256,
        max_header_bytes: 64 * 1024,
        probes: 64,
    };

    /// A worker's request plane: a few frontends, each multiplexing every request it sends
    /// this worker over one connection.
    pub const REQUEST_PLANE: ServerLimits = ServerLimits {
        header_read_timeout: Duration::from_secs(30),
        max_connections: 1024,
        max_concurrent_streams: 16_384,
        max_header_bytes: 64 * 1024,
        probes: 0,
    };
}

/// What serves connections past the limit: `probes` answers (`/health`, `/live`); anything
/// else should be a 503.
#[derive(Debug, Clone)]
pub struct Overflow {
    pub probes: Router,
}

/// Connections the kernel queues before they are accepted (capped by
/// `net.core.somaxconn`): a burst of connections, such as clients reconnecting after a
/// flood of idle ones was closed, is not met with dropped SYNs (a second's wait each).
pub const BACKLOG: u32 = 4096;

/// A listener on `address` (resolved; the first address that binds) with a
/// [`BACKLOG`]-deep accept queue.
pub async fn bind(address: impl tokio::net::ToSocketAddrs) -> std::io::Result<TcpListener> {
    let mut last = None;
    for address in tokio::net::lookup_host(address).await? {
        let socket = if address.is_ipv4() {
            tokio::net::TcpSocket::new_v4()?
        } else {
            tokio::net::TcpSocket::new_v6()?
        };
        socket.set_reuseaddr(true)?;
        match socket.bind(address).and_then(|()| socket.listen(BACKLOG)) {
            Ok(listener) => return Ok(listener),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, "no address to listen on")
    }))
}

/// Serves `app` on an already-bound listener until `shutdown` resolves, then finishes the
/// responses in flight.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ServerLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_with(listener, app, limits, None, shutdown).await
}

/// [`serve`], with an overflow lane past the connection limit.
pub async fn serve_with(
    listener: TcpListener,
    app: Router,
    limits: ServerLimits,
    overflow: Option<Overflow>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let builder = builder(limits, true);
    let lane_builder = builder_for_lane(limits);
    let registry = Arc::new(Registry::default());
    let open = Arc::new(AtomicUsize::new(0));
    let lane = Arc::new(AtomicUsize::new(0));
    let (stop, stopping) = watch::channel(false);
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
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY");
        }
        let room =
            open.load(Ordering::Relaxed) < limits.max_connections || registry.evict_oldest_idle();
        if room {
            open.fetch_add(1, Ordering::Relaxed);
            let conn = registry.open(Instant::now());
            let task = Connection {
                builder: builder.clone(),
                app: app.clone(),
                conn,
                limits,
                stopping: stopping.clone(),
            };
            let open = Arc::clone(&open);
            tokio::spawn(async move {
                task.run(tcp).await;
                open.fetch_sub(1, Ordering::Relaxed);
            });
        } else if let Some(overflow) = &overflow
            && lane.fetch_add(1, Ordering::Relaxed) < limits.probes
        {
            let (builder, probes, lane) = (
                lane_builder.clone(),
                overflow.probes.clone(),
                Arc::clone(&lane),
            );
            let timeout = limits.header_read_timeout;
            tokio::spawn(async move {
                let service = TowerToHyperService::new(probes);
                let connection = builder.serve_connection(TokioIo::new(tcp), service);
                let _ = tokio::time::timeout(timeout, connection).await;
                lane.fetch_sub(1, Ordering::Relaxed);
            });
        } else {
            if overflow.is_some() {
                lane.fetch_sub(1, Ordering::Relaxed);
            }
            tracing::debug!("connection limit reached; closing a new connection");
            drop(tcp);
        }
    }
    drop(listener);
    // Finishes the responses in flight; idle connections close at once.
    let _ = stop.send(true);
    while open.load(Ordering::Relaxed) > 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

fn builder(limits: ServerLimits, keep_alive: bool) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .keep_alive(keep_alive)
        .header_read_timeout(limits.header_read_timeout)
        .max_buf_size(limits.max_header_bytes.max(8192) as usize)
        .max_headers(100);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.max_concurrent_streams)
        .max_pending_accept_reset_streams(limits.max_concurrent_streams as usize)
        .max_local_error_reset_streams(limits.max_concurrent_streams as usize)
        .max_header_list_size(limits.max_header_bytes)
        .keep_alive_interval(limits.header_read_timeout)
        .keep_alive_timeout(limits.header_read_timeout);
    builder
}

/// The overflow lane's connections: one request each, HTTP/1.1 only.
fn builder_for_lane(limits: ServerLimits) -> auto::Builder<TokioExecutor> {
    let mut builder = builder(limits, false);
    builder = builder.http1_only();
    builder
}

/// One connection's task: serves it, closes it at its idle deadline or when evicted, and
/// finishes its responses on shutdown.
struct Connection {
    builder: auto::Builder<TokioExecutor>,
    app: Router,
    conn: Arc<Conn>,
    limits: ServerLimits,
    stopping: watch::Receiver<bool>,
}

/// How long a connection asked to close (evicted, idle past its deadline, or idle while
/// the server drains) may take to finish its writes before it is dropped.
const CLOSE_GRACE: Duration = Duration::from_millis(250);

impl Connection {
    async fn run(mut self, tcp: TcpStream) {
        let service = TowerToHyperService::new(tracked(self.app.clone(), Arc::clone(&self.conn)));
        let connection = self
            .builder
            .serve_connection_with_upgrades(TokioIo::new(tcp), service);
        let mut connection = std::pin::pin!(connection);
        // Told to finish (`graceful_shutdown`: no new request; for HTTP/2 a GOAWAY), and
        // when it is dropped if it has not closed by then.
        let mut shut = false;
        let mut close_by: Option<Instant> = None;
        let mut draining = false;
        loop {
            let (idle_since, evicted) = self.conn.idle_since();
            if close_by.is_none() && (evicted || (draining && idle_since.is_some())) {
                close_by = Some(Instant::now() + CLOSE_GRACE);
            }
            if (draining || close_by.is_some()) && !shut {
                connection.as_mut().graceful_shutdown();
                shut = true;
            }
            let wake_at = close_by
                .or_else(|| idle_since.map(|since| since + self.limits.header_read_timeout));
            let wake = async {
                match wake_at {
                    Some(at) => tokio::time::sleep_until(at.into()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                result = connection.as_mut() => {
                    if let Err(e) = result {
                        tracing::debug!(error = %e, "connection ended with an error");
                    }
                    break;
                }
                () = self.conn.woken.notified() => {}
                () = wake => {
                    if close_by.is_some() {
                        // Its writes had their time.
                        break;
                    }
                    // Still idle at its deadline (a request that began since woke it).
                    if self.conn.idle_since().0.is_some() {
                        close_by = Some(Instant::now() + CLOSE_GRACE);
                    }
                }
                changed = self.stopping.changed(), if !draining => {
                    draining = changed.is_err() || *self.stopping.borrow();
                }
            }
        }
        self.conn.close();
    }
}
