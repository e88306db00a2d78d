//! The worker's own record of its KV cache, for frontends that need to resynchronise: a
//! mirror indexer fed by the engine's events (its dump is the cache as events) and a ring
//! of recent events.

use std::collections::VecDeque;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use parking_lot::Mutex;
use switchyard_core::KvEvent;
use switchyard_router::{Indexer, IndexerConfig, WorkerSnapshot};
use switchyard_runtime::IndexView;
use switchyard_runtime::net::kv::{DUMP_PATH, EVENTS_PATH, INDEX_PATH};

/// Recent events kept for inspection and replay.
const RING: usize = 4096;

#[derive(Debug)]
pub struct KvState {
    mirror: Indexer,
    recent: VecDeque<KvEvent>,
}

impl Default for KvState {
    fn default() -> Self {
        KvState {
            mirror: Indexer::new(IndexerConfig::default()),
            recent: VecDeque::with_capacity(RING),
        }
    }
}

impl KvState {
    pub fn record(&mut self, events: &[KvEvent]) {
        for event in events {
            self.mirror.apply(event);
            if self.recent.len() == RING {
                self.recent.pop_front();
            }
            self.recent.push_back(event.clone());
        }
    }

    /// The whole cache, one snapshot per stream (data-parallel rank).
    pub fn dump(&self) -> Vec<WorkerSnapshot> {
        self.mirror.dump()
    }

    /// The cache as sorted hashes, to compare with a frontend's index.
    pub fn index(&self) -> IndexView {
        IndexView::of(&self.mirror)
    }

    /// Events after `since`, if the ring still holds all of them.
    pub fn events_since(&self, since: u64) -> Option<Vec<KvEvent>> {
        // Nothing can come after the largest id (and `since + 1` must not overflow).
        let Some(next) = since.checked_add(1) else {
            return Some(Vec::new());
        };
        let oldest = self.recent.front().map_or(next, |e| e.event_id);
        if oldest > next {
            return None;
        }
        Some(
            self.recent
                .iter()
                .filter(|e| e.event_id > since)
                .cloned()
                .collect(),
        )
    }
}

/// Routes serving the state to frontends.
pub fn routes(state: Arc<Mutex<KvState>>) -> Router {
    Router::new()
        .route(DUMP_PATH, axum::routing::get(dump))
        .route(INDEX_PATH, axum::routing::get(index))
        .route(EVENTS_PATH, axum::routing::get(events))
        .with_state(state)
}

#[derive(Debug, serde::Deserialize)]
struct Since {
    since: u64,
}

async fn events(
    State(state): State<Arc<Mutex<KvState>>>,
    axum::extract::Query(Since { since }): axum::extract::Query<Since>,
) -> Response {
    let Some(events) = state.lock().events_since(since) else {
        return (
            StatusCode::GONE,
            format!("events after {since} are no longer in the ring; fetch {DUMP_PATH}"),
        )
            .into_response();
    };
    match rmp_serde::to_vec(&events) {
        Ok(bytes) => bytes.into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

async fn index(State(state): State<Arc<Mutex<KvState>>>) -> axum::Json<IndexView> {
    axum::Json(state.lock().index())
}

async fn dump(State(state): State<Arc<Mutex<KvState>>>) -> Response {
    let snapshots = state.lock().dump();
    match rmp_serde::to_vec(&snapshots) {
        Ok(bytes) => bytes.into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_core::{
        KvEventData, LocalBlockHash, SequenceHash, StorageTier, StoredBlock, WorkerId,
    };

    fn stored(id: u64, hash: u64) -> KvEvent {
        KvEvent {
            worker_id: WorkerId(1),
            dp_rank: 0,
            event_id: id,
            tier: StorageTier::Device,
            data: KvEventData::Stored {
                parent: None,
                blocks: vec![StoredBlock {
                    seq_hash: SequenceHash(hash),
                    local_hash: LocalBlockHash(hash),
                }],
            },
        }
    }

    #[tokio::test]
    async fn the_routes_serve_dump_index_and_ring() {
        use axum::body::Body;
        use axum::http::Request;
        use tower::ServiceExt;

        let state = Arc::new(Mutex::new(KvState::default()));
        state
            .lock()
            .record(&[stored(1, 10), stored(2, 20), stored(3, 30)]);
        let get = |uri: &str| {
            let app = routes(Arc::clone(&state));
            let request = Request::get(uri).body(Body::empty()).unwrap();
            async move {
                let response = app.oneshot(request).await.unwrap();
                let status = response.status();
                let body = axum::body::to_bytes(response.into_body(), 1 << 20)
                    .await
                    .unwrap();
                (status, body)
            }
        };
        let (status, body) = get("/v1/internal/kv/events?since=1").await;
        assert_eq!(status, StatusCode::OK);
        let events: Vec<KvEvent> = rmp_serde::from_slice(&body).unwrap();
        assert_eq!(
            events.iter().map(|e| e.event_id).collect::<Vec<_>>(),
            [2, 3]
        );
        let (status, _) = get("/v1/internal/kv/events").await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "since is required");
        let (status, body) = get(DUMP_PATH).await;
        assert_eq!(status, StatusCode::OK);
        let dump: Vec<WorkerSnapshot> = rmp_serde::from_slice(&body).unwrap();
        assert_eq!(dump[0].last_event_id, Some(3));
        let (status, body) = get(INDEX_PATH).await;
        assert_eq!(status, StatusCode::OK);
        let view: IndexView = serde_json::from_slice(&body).unwrap();
        assert_eq!(view, state.lock().index());
        assert_eq!(view.streams[0].blocks.len(), 3);

        for id in 4..(RING as u64 + 10) {
            state.lock().record(&[stored(id, id)]);
        }
        let (status, body) = get("/v1/internal/kv/events?since=1").await;
        assert_eq!(status, StatusCode::GONE);
        assert!(String::from_utf8_lossy(&body).contains(DUMP_PATH));
    }

    #[test]
    fn the_dump_rebuilds_the_cache_and_the_ring_replays() {
        let mut state = KvState::default();
        state.record(&[stored(1, 10), stored(2, 20)]);
        let dump = state.dump();
        let mut rebuilt = Indexer::new(IndexerConfig::default());
        rebuilt.restore(&dump[0]);
        assert_eq!(rebuilt.find_matches(&[LocalBlockHash(20)]).best(), 1);
        assert_eq!(rebuilt.last_event_id(dump[0].worker), Some(2));
        assert_eq!(state.events_since(1).map(|e| e.len()), Some(1));
        assert_eq!(state.events_since(0).map(|e| e.len()), Some(2));
        for id in 3..(RING as u64 + 10) {
            state.record(&[stored(id, id)]);
        }
        assert!(state.events_since(1).is_none(), "too old for the ring");
        assert_eq!(
            state.events_since(u64::MAX),
            Some(Vec::new()),
            "the largest id has nothing after it, and does not overflow"
        );
    }
}
