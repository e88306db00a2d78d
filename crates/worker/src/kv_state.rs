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
use switchyard_runtime::net::kv::{DUMP_PATH, INDEX_PATH};

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
        let oldest = self.recent.front().map_or(since + 1, |e| e.event_id);
        if oldest > since + 1 {
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
        .with_state(state)
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
    }
}
