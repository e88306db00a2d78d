//! The KV cache event model.
//!
//! Engines publish what enters and leaves their KV cache; the router never infers cached
//! blocks from requests (engines evict on their own). Each (worker, dp rank) stream numbers
//! its events with a monotonically increasing `event_id` so a consumer can detect gaps and
//! ask for a replay or a dump.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::hash::{LocalBlockHash, SequenceHash};
use crate::worker::{WorkerId, WorkerKey};

/// Where a cached block lives. Only device blocks save prefill compute directly; the other
/// tiers can be loaded back at a cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StorageTier {
    #[default]
    Device,
    Host,
    Disk,
    External,
}

/// One block entering a cache: its (engine-chosen) sequence hash and its local hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct StoredBlock {
    pub seq_hash: SequenceHash,
    pub local_hash: LocalBlockHash,
}

/// What happened in a cache.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KvEventData {
    /// A chain of blocks was stored. `blocks[0]`'s parent is `parent` (`None`: the root);
    /// each later block's parent is the block before it.
    Stored {
        parent: Option<SequenceHash>,
        blocks: Vec<StoredBlock>,
    },
    /// Blocks were evicted.
    Removed { seq_hashes: Vec<SequenceHash> },
    /// The whole cache was dropped.
    Cleared,
}

/// An event from one worker's data-parallel rank.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvEvent {
    pub worker_id: WorkerId,
    #[serde(default)]
    pub dp_rank: u32,
    pub event_id: u64,
    #[serde(default)]
    pub tier: StorageTier,
    pub data: KvEventData,
}

impl KvEvent {
    /// The stream this event belongs to.
    pub fn worker(&self) -> WorkerKey {
        WorkerKey {
            worker_id: self.worker_id,
            dp_rank: self.dp_rank,
        }
    }

    /// Number of blocks the event names (0 for `Cleared`).
    pub fn block_count(&self) -> usize {
        match &self.data {
            KvEventData::Stored { blocks, .. } => blocks.len(),
            KvEventData::Removed { seq_hashes } => seq_hashes.len(),
            KvEventData::Cleared => 0,
        }
    }
}

/// An encoding or decoding failure.
#[derive(Debug, Error)]
pub enum CodecError {
    #[error("invalid JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("invalid MessagePack: {0}")]
    MsgpackDecode(#[from] rmp_serde::decode::Error),
    #[error("cannot encode MessagePack: {0}")]
    MsgpackEncode(#[from] rmp_serde::encode::Error),
}

/// Encodes a value as compact MessagePack (structs as arrays), the event plane's format.
pub fn to_msgpack<T: Serialize>(value: &T) -> Result<Vec<u8>, CodecError> {
    Ok(rmp_serde::to_vec(value)?)
}

/// Decodes MessagePack produced by [`to_msgpack`] (or with named fields).
pub fn from_msgpack<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, CodecError> {
    Ok(rmp_serde::from_slice(bytes)?)
}

/// Encodes a value as JSON.
pub fn to_json<T: Serialize>(value: &T) -> Result<String, CodecError> {
    Ok(serde_json::to_string(value)?)
}

/// Decodes JSON.
pub fn from_json<T: DeserializeOwned>(text: &str) -> Result<T, CodecError> {
    Ok(serde_json::from_str(text)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples() -> Vec<KvEvent> {
        let stored = KvEventData::Stored {
            parent: Some(SequenceHash(7)),
            blocks: vec![
                StoredBlock {
                    seq_hash: SequenceHash(u64::MAX),
                    local_hash: LocalBlockHash(1),
                },
                StoredBlock {
                    seq_hash: SequenceHash(3),
                    local_hash: LocalBlockHash(4),
                },
            ],
        };
        vec![
            KvEvent {
                worker_id: WorkerId(1),
                dp_rank: 2,
                event_id: 3,
                tier: StorageTier::Device,
                data: stored,
            },
            KvEvent {
                worker_id: WorkerId(u64::MAX),
                dp_rank: 0,
                event_id: 4,
                tier: StorageTier::Host,
                data: KvEventData::Removed {
                    seq_hashes: vec![SequenceHash(5)],
                },
            },
            KvEvent {
                worker_id: WorkerId(9),
                dp_rank: 1,
                event_id: 5,
                tier: StorageTier::Disk,
                data: KvEventData::Cleared,
            },
        ]
    }

    #[test]
    fn json_round_trip() {
        for event in samples() {
            let text = to_json(&event).unwrap();
            assert_eq!(from_json::<KvEvent>(&text).unwrap(), event);
        }
    }

    #[test]
    fn msgpack_round_trip() {
        for event in samples() {
            let bytes = to_msgpack(&event).unwrap();
            assert_eq!(from_msgpack::<KvEvent>(&bytes).unwrap(), event);
            let named = rmp_serde::to_vec_named(&event).unwrap();
            assert_eq!(from_msgpack::<KvEvent>(&named).unwrap(), event);
        }
    }

    #[test]
    fn json_shape_is_readable_and_defaults_apply() {
        let text = r#"{"worker_id":5,"event_id":1,"data":{"removed":{"seq_hashes":[1,2]}}}"#;
        let event: KvEvent = from_json(text).unwrap();
        assert_eq!(event.worker(), WorkerKey::new(5, 0));
        assert_eq!(event.tier, StorageTier::Device);
        assert_eq!(event.block_count(), 2);
        let cleared = to_json(&samples()[2]).unwrap();
        assert!(cleared.contains(r#""data":"cleared""#), "{cleared}");
        assert!(cleared.contains(r#""tier":"disk""#), "{cleared}");
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        assert!(from_msgpack::<KvEvent>(&[0xc1, 0x00, 0xff]).is_err());
        assert!(from_json::<KvEvent>("{\"worker_id\": -1}").is_err());
    }
}
