//! A batch of vLLM's KV events as it arrives on the ZMQ socket (`switchyard_runtime::vllm::
//! decode_batch`, crates/runtime/src/vllm/decode.rs), with the block size the worker
//! registered in the first byte: decoding is deterministic, and the events, numbered as the `openai` worker numbers them, keep the radix-tree
//! indexer consistent (`Indexer::validate`) after every event.
#![no_main]

use libfuzzer_sys::fuzz_target;
use switchyard_core::{KvEvent, WorkerId};
use switchyard_fuzz::{apply_and_check, seed};
use switchyard_router::{Indexer, IndexerConfig};
use switchyard_runtime::testing::{vllm_removed_batch, vllm_stored_batch};
use switchyard_runtime::vllm::decode_batch;

fn seeds() -> Vec<Vec<u8>> {
    let tokens: Vec<u32> = (0..8).collect();
    [
        vllm_stored_batch(&[1, 2], None, &tokens, 4),
        vllm_stored_batch(&[3], Some(2), &tokens[..4], 4),
        vllm_removed_batch(&[1, 3]),
    ]
    .into_iter()
    .map(|payload| [vec![3u8], payload].concat())
    .collect()
}

fuzz_target!(
    init: seed(seeds()),
    |data: &[u8]| {
        let Some((&size, payload)) = data.split_first() else {
            return;
        };
        let block_size = u32::from(size % 16) + 1;
        let Ok(batch) = decode_batch(payload, block_size) else {
            return;
        };
        assert_eq!(decode_batch(payload, block_size).ok().as_ref(), Some(&batch));
        let events: Vec<KvEvent> = batch
            .events
            .iter()
            .enumerate()
            .map(|(i, (tier, data))| KvEvent {
                    worker_id: WorkerId(1),
                    dp_rank: batch.dp_rank,
                    event_id: i as u64 + 1,
                    tier: *tier,
                    data: data.clone(),
            })
            .collect();
        let mut indexer = Indexer::new(IndexerConfig::default());
        apply_and_check(&mut indexer, &events);
    }
);
