//! A batch of KV events as MessagePack `Vec<KvEvent>` (what `/v1/internal/kv/events` serves and
//! what a `WorkerEvent::Kv` carries), decoded and applied to the radix-tree indexer: the tree
//! must stay consistent (`Indexer::validate`) after every event, however wrong the stream
//! (unknown parents, reused hashes, stale ids, other tiers), and every worker's dump must
//! restore to the same state.
#![no_main]

use libfuzzer_sys::fuzz_target;
use switchyard_core::event::from_msgpack;
use switchyard_core::{KvEvent, StorageTier};
use switchyard_fuzz::{apply_and_check, msgpack_round_trip, samples, seed};
use switchyard_router::{Indexer, IndexerConfig};

fuzz_target!(
    init: seed(samples::msgpack(&[samples::kv_events()])),
    |data: &[u8]| {
        let Ok(events) = from_msgpack::<Vec<KvEvent>>(data) else {
            return;
        };
        msgpack_round_trip(&events);
        let mut indexer = Indexer::new(IndexerConfig::default());
        apply_and_check(&mut indexer, &events);
        // An indexer of another tier sees the same ids and skips the data.
        let mut host = Indexer::new(IndexerConfig {
            tier: StorageTier::Host,
        });
        apply_and_check(&mut host, &events);
    }
);
