//! Running the frontend: its background tasks and its HTTP server.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::serve::ListenerExt;
use switchyard_runtime::{Discovery, EventPlane, EventPlaneError};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::pipeline::Frontend;
use crate::routing;

/// Starts the tasks that keep the routing state current: discovery, events, expiry.
pub async fn start_background(
    frontend: &Arc<Frontend>,
    discovery: &dyn Discovery,
    events: &dyn EventPlane,
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
/// (40 ms on Linux).
pub async fn serve(
    listener: TcpListener,
    frontend: Arc<Frontend>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = crate::http::router(frontend);
    let listener = listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY");
        }
    });
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}
