//! vLLM's KV events over ZMQ, against a real ZMQ publisher (pyzmq, from the test virtualenv
//! `scripts/test` makes): both encodings, a gap filled from the replay socket, a gap that
//! cannot be filled, and a publisher restart.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use rmpv::Value;
use switchyard_core::hash::{HashSeed, local_block_hash};
use switchyard_core::{KvEventData, SequenceHash, StorageTier};
use switchyard_runtime::testing::VllmPublisher;
use switchyard_runtime::vllm::{Update, ZmqEventsConfig, ZmqStats, subscribe};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

const BLOCK: u32 = 4;

fn encode(value: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, value).unwrap();
    out
}

/// A batch storing one block (hash `hash`, tokens all `token`), array-encoded as vLLM's
/// msgspec structs are.
fn array_batch(hash: u64, token: u64) -> Vec<u8> {
    encode(&Value::Array(vec![
        Value::F64(1.0),
        Value::Array(vec![Value::Array(vec![
            Value::from("BlockStored"),
            Value::Array(vec![Value::from(hash)]),
            Value::Nil,
            Value::Array(vec![Value::from(token); BLOCK as usize]),
            Value::from(BLOCK),
            Value::Nil,
            Value::from("GPU"),
        ])]),
    ]))
}

/// The same, map-encoded, removing a block on the CPU tier, from data-parallel rank 1.
fn map_batch(hash: u64) -> Vec<u8> {
    encode(&Value::Map(vec![
        (Value::from("ts"), Value::F64(2.0)),
        (
            Value::from("events"),
            Value::Array(vec![Value::Map(vec![
                (Value::from("type"), Value::from("BlockRemoved")),
                (
                    Value::from("block_hashes"),
                    Value::Array(vec![Value::Binary(hash.to_be_bytes().to_vec())]),
                ),
                (Value::from("medium"), Value::from("CPU")),
            ])]),
        ),
        (Value::from("data_parallel_rank"), Value::from(1)),
    ]))
}

/// The block a store carries (its sequence hash, and the token that fills it).
fn stored(update: &Update) -> Option<(SequenceHash, u32)> {
    let Update::Batch(batch) = update else {
        return None;
    };
    match &batch.events[..] {
        [(StorageTier::Device, KvEventData::Stored { blocks, .. })] => {
            let token = (0..100).find(|&t| {
                blocks[0].local_hash == local_block_hash(&[t; BLOCK as usize], HashSeed::default())
            })?;
            Some((blocks[0].seq_hash, token))
        }
        _ => None,
    }
}

async fn next(updates: &mut mpsc::Receiver<Update>) -> Update {
    tokio::time::timeout(Duration::from_secs(10), updates.recv())
        .await
        .expect("no update within 10 s")
        .expect("the subscriber stopped")
}

/// Publishes `seq` again and again until the subscriber hands something on (a SUB socket
/// misses what is published before its subscription reaches the publisher).
async fn publish_until_seen(
    publisher: &mut VllmPublisher,
    seq: u64,
    payload: &[u8],
    updates: &mut mpsc::Receiver<Update>,
) -> Update {
    for _ in 0..100 {
        publisher.publish(seq, payload, true);
        if let Ok(Some(update)) =
            tokio::time::timeout(Duration::from_millis(100), updates.recv()).await
        {
            return update;
        }
    }
    panic!("the subscriber never received batch {seq}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follows_a_vllm_publisher_through_gaps_and_a_restart() {
    let mut publisher = VllmPublisher::start();
    let mut config =
        ZmqEventsConfig::parse(&publisher.url(), Some(&publisher.replay_url()), BLOCK).unwrap();
    config.replay_timeout = Duration::from_secs(2);
    let (tx, mut updates) = mpsc::channel(64);
    let stats = Arc::new(ZmqStats::default());
    let cancel = CancellationToken::new();
    let task = tokio::spawn(subscribe(config, tx, Arc::clone(&stats), cancel.clone()));

    // The array encoding (re-sent until the subscription is up; repeats are skipped).
    let first = publish_until_seen(&mut publisher, 0, &array_batch(100, 1), &mut updates).await;
    assert_eq!(stored(&first), Some((SequenceHash(100), 1)), "{first:?}");

    // The map encoding, bytes hashes, another tier and rank.
    publisher.publish(1, &map_batch(7), true);
    let Update::Batch(batch) = next(&mut updates).await else {
        panic!("not a batch");
    };
    assert_eq!(batch.dp_rank, 1);
    assert_eq!(
        batch.events,
        vec![(
            StorageTier::Host,
            KvEventData::Removed {
                seq_hashes: vec![SequenceHash(xxhash_rust::xxh3::xxh3_64(
                    &7u64.to_be_bytes()
                ))]
            }
        )]
    );

    // Batch 2 is lost on the way; batch 3 shows the gap, which the replay fills, in order.
    publisher.publish(2, &array_batch(102, 2), false);
    publisher.publish(3, &array_batch(103, 3), true);
    assert_eq!(
        stored(&next(&mut updates).await),
        Some((SequenceHash(102), 2))
    );
    assert_eq!(
        stored(&next(&mut updates).await),
        Some((SequenceHash(103), 3))
    );
    assert_eq!(ZmqStats::get(&stats.gaps), 1);
    assert_eq!(ZmqStats::get(&stats.replayed), 1);

    // Batch 4 is lost and the publisher no longer holds it: the view is lost, then 5 goes on.
    publisher.publish(4, &array_batch(104, 4), false);
    publisher.forget();
    publisher.publish(5, &array_batch(105, 5), true);
    assert!(matches!(next(&mut updates).await, Update::Lost { .. }));
    assert_eq!(
        stored(&next(&mut updates).await),
        Some((SequenceHash(105), 5))
    );

    // The publisher restarts (its numbers start again at 0): the subscriber reconnects,
    // and the old view is lost.
    publisher.restart();
    let update = publish_until_seen(&mut publisher, 0, &array_batch(200, 6), &mut updates).await;
    assert!(matches!(update, Update::Lost { .. }), "{update:?}");
    assert_eq!(
        stored(&next(&mut updates).await),
        Some((SequenceHash(200), 6))
    );
    assert_eq!(ZmqStats::get(&stats.restarts), 1);
    publisher.publish(1, &array_batch(201, 7), true);
    assert_eq!(
        stored(&next(&mut updates).await),
        Some((SequenceHash(201), 7))
    );

    // An undecodable batch is counted and, its events lost, the view is reset; the
    // stream goes on.
    publisher.publish(2, b"\x92\x01", true);
    publisher.publish(3, &array_batch(203, 8), true);
    let update = next(&mut updates).await;
    assert!(matches!(update, Update::Lost { .. }), "{update:?}");
    assert_eq!(
        stored(&next(&mut updates).await),
        Some((SequenceHash(203), 8))
    );
    assert_eq!(ZmqStats::get(&stats.decode_errors), 1);

    cancel.cancel();
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .unwrap()
        .unwrap();
}
