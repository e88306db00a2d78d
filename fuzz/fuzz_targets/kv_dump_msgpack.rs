//! A worker's KV dump, MessagePack `Vec<WorkerSnapshot>` (crates/runtime/src/net/kv.rs,
//! `KvDumpClient::snapshot`), restored into the indexer as a frontend's resync does
//! (crates/frontend/src/routing/sync.rs): the tree must stay consistent, and dumping the
//! restored state and restoring that again must give the same state.
#![no_main]

use libfuzzer_sys::fuzz_target;
use switchyard_core::event::from_msgpack;
use switchyard_fuzz::{check_dump_restores, msgpack_round_trip, samples, seed};
use switchyard_router::{Indexer, IndexerConfig, WorkerSnapshot};

fuzz_target!(
    init: seed(samples::msgpack(&[samples::snapshots()])),
    |data: &[u8]| {
        let Ok(snapshots) = from_msgpack::<Vec<WorkerSnapshot>>(data) else {
            return;
        };
        msgpack_round_trip(&snapshots);
        let mut indexer = Indexer::new(IndexerConfig::default());
        for snapshot in &snapshots {
            indexer.restore(snapshot);
            if let Err(e) = indexer.validate() {
                panic!("the index is inconsistent after restoring {snapshot:?}: {e}");
            }
        }
        check_dump_restores(&indexer);
    }
);
