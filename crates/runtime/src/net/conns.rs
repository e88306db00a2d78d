//! The open connections a server holds: which are idle (no request in flight) and since
//! when, so that an idle one is closed at its deadline, and the oldest idle ones are the
//! first closed when the connection limit is reached.
//!
//! A connection is idle from its accept until its first request's head has arrived, and
//! again from the end of each response until the next head: a client sending its headers
//! slowly, or nothing, is idle all along.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use parking_lot::Mutex;
use tokio::sync::Notify;

/// One connection's state, shared by its task and its requests.
#[derive(Debug)]
pub struct Conn {
    id: u64,
    registry: Arc<Registry>,
    /// Wakes the connection's task: its state changed, or it is to close.
    pub(super) woken: Notify,
}

#[derive(Debug, Default)]
struct State {
    /// Requests in flight on the connection.
    in_flight: u32,
    /// Idle since (none while a request is in flight).
    idle_since: Option<Instant>,
    /// Asked to close (evicted).
    evicted: bool,
}

/// Every open connection, and the idle ones by how long they have been idle.
#[derive(Debug, Default)]
pub struct Registry {
    inner: Mutex<Inner>,
    next: AtomicU64,
}

#[derive(Debug, Default)]
struct Inner {
    states: HashMap<u64, State>,
    idle: BTreeMap<(Instant, u64), Arc<Conn>>,
}

impl Registry {
    /// A newly accepted connection, idle from `now`.
    pub fn open(self: &Arc<Self>, now: Instant) -> Arc<Conn> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let conn = Arc::new(Conn {
            id,
            registry: Arc::clone(self),
            woken: Notify::new(),
        });
        let mut inner = self.inner.lock();
        inner.states.insert(
            id,
            State {
                in_flight: 0,
                idle_since: Some(now),
                evicted: false,
            },
        );
        inner.idle.insert((now, id), Arc::clone(&conn));
        conn
    }

    /// Asks the connection idle the longest to close; whether there was one.
    pub fn evict_oldest_idle(&self) -> bool {
        let mut inner = self.inner.lock();
        let Some((_, conn)) = inner.idle.pop_first() else {
            return false;
        };
        if let Some(state) = inner.states.get_mut(&conn.id) {
            state.evicted = true;
            state.idle_since = None;
        }
        drop(inner);
        conn.woken.notify_one();
        true
    }

    /// Open connections, and the idle ones among them.
    pub fn counts(&self) -> (usize, usize) {
        let inner = self.inner.lock();
        (inner.states.len(), inner.idle.len())
    }
}

impl Conn {
    /// A request's head arrived: the connection is busy until the guard (held by its
    /// response body) drops.
    pub fn begin(self: &Arc<Self>) -> Busy {
        let mut inner = self.registry.inner.lock();
        if let Some(state) = inner.states.get_mut(&self.id) {
            state.in_flight += 1;
            if let Some(since) = state.idle_since.take() {
                inner.idle.remove(&(since, self.id));
            }
        }
        drop(inner);
        self.woken.notify_one();
        Busy(Arc::clone(self))
    }

    fn end(self: &Arc<Self>) {
        let now = Instant::now();
        let mut inner = self.registry.inner.lock();
        let Some(state) = inner.states.get_mut(&self.id) else {
            return;
        };
        state.in_flight = state.in_flight.saturating_sub(1);
        if state.in_flight == 0 && !state.evicted {
            state.idle_since = Some(now);
            inner.idle.insert((now, self.id), Arc::clone(self));
        }
        drop(inner);
        self.woken.notify_one();
    }

    /// Idle since when (none: a request is in flight), and whether it was evicted.
    pub fn idle_since(&self) -> (Option<Instant>, bool) {
        let inner = self.registry.inner.lock();
        inner
            .states
            .get(&self.id)
            .map_or((None, true), |s| (s.idle_since, s.evicted))
    }

    /// The connection closed: it is forgotten.
    pub fn close(&self) {
        let mut inner = self.registry.inner.lock();
        if let Some(state) = inner.states.remove(&self.id)
            && let Some(since) = state.idle_since
        {
            inner.idle.remove(&(since, self.id));
        }
    }
}

/// A request in flight on a connection.
#[derive(Debug)]
pub struct Busy(Arc<Conn>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.end();
    }
}

/// `app`'s service for one connection: each request keeps the connection busy until its
/// response body is dropped (sent whole, or abandoned).
pub fn tracked<B>(
    app: axum::Router,
    conn: Arc<Conn>,
) -> impl tower::Service<
    http::Request<B>,
    Response = Response,
    Error = std::convert::Infallible,
    Future = impl Future<Output = Result<Response, std::convert::Infallible>> + Send,
> + Clone
+ Send
where
    B: http_body::Body<Data = axum::body::Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    tower::service_fn(move |request: http::Request<B>| {
        let busy = conn.begin();
        let mut app = app.clone();
        let request: Request = request.map(Body::new);
        async move {
            let response = tower::Service::call(&mut app, request).await?;
            Ok(response.map(|body| Body::new(Held { body, _busy: busy })))
        }
    })
}

/// A response body that holds its connection busy while it is sent.
struct Held {
    body: Body,
    _busy: Busy,
}

impl http_body::Body for Held {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn the_oldest_idle_connection_is_evicted_and_busy_ones_never() {
        let registry = Arc::new(Registry::default());
        let t0 = Instant::now();
        let a = registry.open(t0);
        let b = registry.open(t0 + Duration::from_millis(1));
        let c = registry.open(t0 + Duration::from_millis(2));
        // `a` is busy: `b` is now the oldest idle.
        let busy = a.begin();
        assert_eq!(registry.counts(), (3, 2));
        assert!(registry.evict_oldest_idle());
        assert_eq!(b.idle_since(), (None, true));
        assert!(c.idle_since().0.is_some());
        assert!(registry.evict_oldest_idle());
        assert_eq!(c.idle_since(), (None, true));
        // Only the busy one is left, and it is not idle.
        assert!(!registry.evict_oldest_idle());
        // Once its response is sent it is idle again, and evictable.
        drop(busy);
        assert!(a.idle_since().0.is_some());
        assert!(registry.evict_oldest_idle());
        for conn in [&a, &b, &c] {
            conn.close();
        }
        assert_eq!(registry.counts(), (0, 0));
    }

    #[test]
    fn an_evicted_connection_does_not_become_idle_again() {
        let registry = Arc::new(Registry::default());
        let a = registry.open(Instant::now());
        let busy = a.begin();
        let second = a.begin();
        drop(busy);
        assert_eq!(a.idle_since().0, None, "one request is still in flight");
        drop(second);
        assert!(registry.evict_oldest_idle());
        let again = a.begin();
        drop(again);
        assert_eq!(a.idle_since(), (None, true));
        assert!(!registry.evict_oldest_idle());
    }
}
