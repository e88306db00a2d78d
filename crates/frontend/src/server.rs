//! Running the frontend: its background tasks and its HTTP server.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use switchyard_runtime::net::deadline::BodyDeadline;
use switchyard_runtime::net::server::{Overflow, ServerLimits};
use switchyard_runtime::{
    Discovery, EventPlane, EventPlaneError, ReplicaEvent, ReplicaMessage, ReplicaPlane,
};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
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

/// Publishes the frontend's traffic counters ([`ReplicaEvent::Traffic`]) every `interval`
/// until cancelled, for planners that watch the planes rather than a frontend.
pub async fn publish_traffic(
    frontend: Arc<Frontend>,
    plane: Arc<dyn ReplicaPlane>,
    interval: Duration,
    cancel: CancellationToken,
) {
    let id: u64 = rand::random();
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        let queued = frontend.routing.queued().iter().sum::<usize>() as u64;
        let message = ReplicaMessage {
            frontend: id,
            events: vec![ReplicaEvent::Traffic(frontend.metrics.traffic(queued))],
        };
        if let Err(e) = plane
            .publish_replica(frontend.routing.model(), &message)
            .await
        {
            tracing::debug!(error = %e, "cannot publish the traffic counters");
        }
    }
}

/// Serves HTTP on an already-bound listener until `shutdown` resolves, then finishes the
/// responses in flight (see [`switchyard_runtime::net::server`]). Bodies must arrive within
/// `connections.body_read_timeout` plus their size at `connections.min_body_rate` (408
/// after).
pub async fn serve(
    listener: TcpListener,
    frontend: Arc<Frontend>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = crate::http::router(Arc::clone(&frontend));
    serve_app(listener, app, &frontend, shutdown).await
}

/// Serves the admin routes ([`crate::http::admin_router`]) on their own listener.
pub async fn serve_admin(
    listener: TcpListener,
    frontend: Arc<Frontend>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = crate::http::admin_router(Arc::clone(&frontend));
    serve_app(listener, app, &frontend, shutdown).await
}

async fn serve_app(
    listener: TcpListener,
    app: axum::Router,
    frontend: &Arc<Frontend>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let connections = frontend.config.connections;
    let deadline = BodyDeadline {
        grace: connections.body_read_timeout,
        min_rate: connections.min_body_rate,
    };
    let app = app.layer(deadline.layer());
    let limits = ServerLimits {
        header_read_timeout: connections.header_read_timeout,
        max_connections: connections.max_connections,
        ..ServerLimits::PUBLIC
    };
    let overflow = Overflow {
        probes: crate::http::probes_router(Arc::clone(frontend)),
    };
    switchyard_runtime::net::server::serve_with(listener, app, limits, Some(overflow), shutdown)
        .await
}
