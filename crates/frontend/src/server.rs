//! Running the frontend: its background tasks and its HTTP server.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use switchyard_runtime::{Discovery, EventPlane, EventPlaneError, ReplicaEvent, ReplicaPlane};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::pipeline::Frontend;
use crate::routing;

/// Replica sync: the plane, and this frontend's events to publish on it (from
/// [`RoutingService::with_replicas`](crate::routing::RoutingService::with_replicas)).
pub type ReplicaSync = (Arc<dyn ReplicaPlane>, mpsc::Receiver<ReplicaEvent>);

/// Starts the tasks that keep the routing state current: discovery, events, expiry, and
/// replica sync when given.
pub async fn start_background(
    frontend: &Arc<Frontend>,
    discovery: &dyn Discovery,
    events: &dyn EventPlane,
    replicas: Option<ReplicaSync>,
    tracker: &TaskTracker,
    cancel: &CancellationToken,
) -> Result<(), EventPlaneError> {
    let routing = Arc::clone(&frontend.routing);
    tracker.spawn(routing::follow_discovery(
        Arc::clone(&routing),
        discovery.watch(),
        cancel.clone(),
    ));
    let subscription = events.subscribe(routing.model()).await?;
    tracker.spawn(routing::follow_events(
        Arc::clone(&routing),
        subscription,
        cancel.clone(),
    ));
    if let Some((plane, outbox)) = replicas {
        let messages = plane.subscribe_replicas(routing.model()).await?;
        tracker.spawn(routing::follow_replicas(
            Arc::clone(&routing),
            messages,
            cancel.clone(),
        ));
        tracker.spawn(routing::publish_replicas(
            Arc::clone(&routing),
            plane,
            outbox,
            cancel.clone(),
        ));
    }
    tracker.spawn(crate::pipeline::canary::run(
        Arc::clone(frontend),
        cancel.clone(),
    ));
    tracker.spawn(routing::expire_requests(
        routing,
        Duration::from_secs(30),
        cancel.clone(),
    ));
    Ok(())
}

/// Serves HTTP on an already-bound listener until `shutdown` resolves, then finishes the
/// responses in flight.
///
/// Connections get `TCP_NODELAY`: streamed responses are many small writes, and with
/// Nagle's algorithm each one after the first would wait for the client's delayed ACK
/// (40 ms on Linux). A client must send each request's headers within
/// `connections.header_read_timeout` (which also closes kept-alive connections idle that
/// long) and its body within `connections.body_read_timeout`; past
/// `connections.max_connections` open connections, new ones are closed at once, so slow or
/// idle clients cannot exhaust sockets or memory.
pub async fn serve(
    listener: TcpListener,
    frontend: Arc<Frontend>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let limits = frontend.config.connections;
    let app = crate::http::router(frontend).layer(
        tower_http::timeout::RequestBodyTimeoutLayer::new(limits.body_read_timeout),
    );
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
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
