//! Shared pieces of the fuzz targets: round-trip checks, and valid sample messages that seed
//! each target's corpus (written by the target itself at start-up, so the seeds always follow
//! the current encoding).

use std::fmt::Debug;
use std::hash::{DefaultHasher, Hasher};
use std::path::PathBuf;

use serde::Serialize;
use serde::de::DeserializeOwned;
use switchyard_core::protocol::{
    FinishReason, GenerateOutput, GenerateRequest, KvHandle, Phase, Resume, SamplingParams,
};
use switchyard_core::{
    EngineError, KvEvent, KvEventData, LoadSnapshot, LocalBlockHash, MediaSpan, Modality,
    RequestId, SequenceHash, StorageTier, StoredBlock, WorkerId, WorkerKey,
};
use switchyard_router::{Indexer, IndexerConfig, WorkerSnapshot};
use switchyard_runtime::{ReplicaEvent, ReplicaMessage, TrafficCounters, WorkerEvent};

/// Writes `samples` into the corpus directory libFuzzer was given (the first directory among
/// the command-line arguments), named by content, unless already there. Called from a
/// target's `init`, which libFuzzer runs before it reads the corpus.
pub fn seed(samples: impl IntoIterator<Item = Vec<u8>>) {
    let Some(dir) = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .map(PathBuf::from)
        .find(|p| p.is_dir())
    else {
        return;
    };
    for sample in samples {
        let mut hasher = DefaultHasher::new();
        hasher.write(&sample);
        let path = dir.join(format!("seed-{:016x}", hasher.finish()));
        if !path.exists() {
            // Best effort: a read-only corpus still fuzzes, only without these seeds.
            let _ = std::fs::write(path, sample);
        }
    }
}

/// Equality through `Debug`: the same as `==` for these types, except that NaN equals NaN
/// (sampling parameters and profiles are floats).
pub fn same<T: Debug>(a: &T, b: &T) -> bool {
    format!("{a:?}") == format!("{b:?}")
}

/// A value decoded from MessagePack must encode again, compact and with field names, and
/// both encodings must decode back to it; the compact encoding of the copy must be the same
/// bytes (the encoding is canonical).
pub fn msgpack_round_trip<T: Serialize + DeserializeOwned + Debug>(value: &T) {
    let compact = rmp_serde::to_vec(value).expect("a decoded value encodes");
    let back: T = rmp_serde::from_slice(&compact)
        .unwrap_or_else(|e| panic!("its compact encoding does not decode: {e}\n{value:?}"));
    assert!(same(value, &back), "compact round trip changed\n{value:?}\ninto\n{back:?}");
    assert_eq!(
        rmp_serde::to_vec(&back).expect("encodes"),
        compact,
        "compact encoding is not canonical"
    );
    named_round_trip(value);
}

/// The named-fields half of [`msgpack_round_trip`], alone for types whose compact encoding is
/// not meant to be read back (fields skipped when empty, as in a generate request).
pub fn named_round_trip<T: Serialize + DeserializeOwned + Debug>(value: &T) {
    let named = rmp_serde::to_vec_named(value).expect("a decoded value encodes with names");
    let back: T = rmp_serde::from_slice(&named)
        .unwrap_or_else(|e| panic!("its named encoding does not decode: {e}\n{value:?}"));
    assert!(same(value, &back), "named round trip changed\n{value:?}\ninto\n{back:?}");
    assert_eq!(
        rmp_serde::to_vec_named(&back).expect("encodes"),
        named,
        "named encoding is not canonical"
    );
}

/// JSON: decode(encode(v)) == v, and encode is canonical.
pub fn json_round_trip<T: Serialize + DeserializeOwned + Debug>(value: &T) {
    let text = serde_json::to_string(value).expect("a decoded value encodes as JSON");
    let back: T = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("its JSON does not decode: {e}\n{text}"));
    assert!(same(value, &back), "JSON round trip changed\n{value:?}\ninto\n{back:?}\nvia {text}");
    assert_eq!(serde_json::to_string(&back).expect("encodes"), text, "JSON is not canonical");
}

/// Applies `events` one by one, checking the tree after each; then checks that every
/// worker's dump restores, into an empty indexer, to the same state.
pub fn apply_and_check(indexer: &mut Indexer, events: &[KvEvent]) {
    for event in events {
        indexer.apply(event);
        if let Err(e) = indexer.validate() {
            panic!("the index is inconsistent after {event:?}: {e}");
        }
    }
    check_dump_restores(indexer);
}

/// Every worker's dump, restored into an empty indexer, gives the same blocks, the same
/// last event id and the same prefix matches.
pub fn check_dump_restores(indexer: &Indexer) {
    let workers: Vec<WorkerKey> = indexer.workers().collect();
    for worker in workers {
        let Some(snapshot) = indexer.dump_worker(worker) else {
            panic!("{worker:?} is listed but has no dump");
        };
        let mut copy = Indexer::new(IndexerConfig {
            tier: snapshot.tier,
        });
        copy.restore(&snapshot);
        if let Err(e) = copy.validate() {
            panic!("restoring the dump of {worker:?} gives an inconsistent index: {e}\n{snapshot:?}");
        }
        let mut want = indexer.worker_hashes(worker);
        let mut got = copy.worker_hashes(worker);
        want.sort_unstable();
        got.sort_unstable();
        assert_eq!(got, want, "the dump of {worker:?} restores other blocks\n{snapshot:?}");
        assert_eq!(copy.cached_blocks(worker), indexer.cached_blocks(worker));
        assert_eq!(copy.last_event_id(worker), indexer.last_event_id(worker));
        // The same prefixes match: query with every chain of local hashes the dump stores.
        for data in &snapshot.events {
            if let KvEventData::Stored { blocks, .. } = data {
                let query: Vec<LocalBlockHash> = blocks.iter().map(|b| b.local_hash).collect();
                assert_eq!(
                    copy.find_matches(&query).score(worker),
                    indexer.find_matches(&query).score(worker),
                    "the dump of {worker:?} matches {query:?} differently"
                );
            }
        }
    }
}

/// Valid messages of every kind the targets decode.
pub mod samples {
    use super::*;

    pub fn kv_events() -> Vec<KvEvent> {
        let block = |s: u64, l: u64| StoredBlock {
            seq_hash: SequenceHash(s),
            local_hash: LocalBlockHash(l),
        };
        let event = |id: u64, data: KvEventData| KvEvent {
            worker_id: WorkerId(1),
            dp_rank: 0,
            event_id: id,
            tier: StorageTier::Device,
            data,
        };
        vec![
            event(
                1,
                KvEventData::Stored {
                    parent: None,
                    blocks: vec![block(10, 100), block(11, 101), block(12, 102)],
                },
            ),
            event(
                2,
                KvEventData::Stored {
                    parent: Some(SequenceHash(11)),
                    blocks: vec![block(13, 103)],
                },
            ),
            event(
                3,
                KvEventData::Removed {
                    seq_hashes: vec![SequenceHash(12), SequenceHash(99)],
                },
            ),
            KvEvent {
                worker_id: WorkerId(u64::MAX),
                dp_rank: 3,
                event_id: 7,
                tier: StorageTier::Host,
                data: KvEventData::Cleared,
            },
            event(5, KvEventData::Cleared),
        ]
    }

    /// Messages of the event plane (NATS), as published.
    pub fn worker_events() -> Vec<WorkerEvent> {
        vec![
            WorkerEvent::Kv(kv_events()),
            WorkerEvent::Kv(Vec::new()),
            WorkerEvent::Load {
                worker: WorkerKey::new(4, 1),
                load: LoadSnapshot {
                    waiting: 1,
                    running: 2,
                    active_blocks: 30,
                    cached_blocks: 40,
                    capacity_blocks: 1000,
                    active_prefill_tokens: 512,
                },
            },
            WorkerEvent::EventsLost,
        ]
    }

    pub fn replica_messages() -> Vec<ReplicaMessage> {
        vec![ReplicaMessage {
            frontend: 0xdead_beef,
            events: vec![
                ReplicaEvent::Routed {
                    request: RequestId(1),
                    worker: WorkerKey::new(2, 0),
                    prefill_tokens: 300,
                    seq_hashes: vec![SequenceHash(1), SequenceHash(2)],
                },
                ReplicaEvent::PrefillDone {
                    request: RequestId(1),
                },
                ReplicaEvent::Finished {
                    request: RequestId(1),
                },
                ReplicaEvent::Alive {
                    requests: vec![RequestId(3), RequestId(4)],
                },
                ReplicaEvent::Traffic(TrafficCounters {
                    requests: 12,
                    input_tokens: 4_000,
                    ttft_us_sum: 1_500_000,
                    ttft_count: 10,
                    queued: 2,
                    ..TrafficCounters::default()
                }),
            ],
        }]
    }

    /// A worker's dump, as `/v1/internal/kv/dump` serves it.
    pub fn snapshots() -> Vec<WorkerSnapshot> {
        let mut indexer = Indexer::new(IndexerConfig::default());
        for event in kv_events() {
            indexer.apply(&event);
        }
        indexer.dump()
    }

    pub fn generate_requests() -> Vec<GenerateRequest> {
        let plain = GenerateRequest::text(RequestId(7), vec![1, 2, 3], 16);
        let mut full = plain.clone();
        full.prompt.media.push(MediaSpan {
            modality: Modality::Image,
            media_hash: 42,
            offset: 1,
            length: 2,
        });
        full.prompt.lora = Some("adapter".into());
        full.sampling = SamplingParams {
            temperature: Some(0.7),
            top_p: Some(0.9),
            top_k: Some(40),
            seed: Some(5),
            stop_token_ids: vec![2],
            frequency_penalty: Some(0.5),
            presence_penalty: Some(-0.5),
            logit_bias: vec![(3, -100.0), (8, 2.5)],
            logprobs: Some(3),
            ..SamplingParams::default()
        };
        full.dp_rank = 1;
        full.resume = Some(Resume { generated: 3 });
        full.phase = Phase::Decode { kv: kv_handle() };
        let mut prefill = plain.clone();
        prefill.phase = Phase::PrefillOnly;
        vec![plain, full, prefill]
    }

    pub fn kv_handle() -> KvHandle {
        KvHandle {
            source: WorkerKey::new(3, 0),
            request: RequestId(6),
            blocks: vec![SequenceHash(9), SequenceHash(10)],
            tokens: 32,
            address: Some("127.0.0.1:7001".into()),
        }
    }

    pub fn outputs() -> Vec<GenerateOutput> {
        vec![
            GenerateOutput::Tokens {
                token_ids: vec![5, 6],
                cached_tokens: Some(16),
                logprobs: Vec::new(),
            },
            GenerateOutput::Tokens {
                token_ids: vec![7],
                cached_tokens: None,
                logprobs: vec![switchyard_core::protocol::TokenLogprobs {
                    logprob: -0.5,
                    top: vec![(7, -0.5), (9, -1.25)],
                }],
            },
            GenerateOutput::Text {
                text: "hé".into(),
                tokens: Some(1),
                cached_tokens: None,
                logprobs: vec![switchyard_core::protocol::TextLogprob {
                    token: "hé".into(),
                    logprob: -0.75,
                    top: vec![("hé".into(), -0.75), ("ha".into(), -1.0)],
                }],
            },
            GenerateOutput::PromptLogprobs {
                logprobs: vec![switchyard_core::protocol::TokenLogprobs {
                    logprob: -3.5,
                    top: vec![(4, -0.5), (9, -3.5)],
                }],
            },
            GenerateOutput::PrefillDone {
                first_token: 9,
                kv: kv_handle(),
                cached_tokens: 0,
                logprobs: Some(switchyard_core::protocol::TokenLogprobs {
                    logprob: -0.25,
                    top: vec![(9, -0.25)],
                }),
            },
            GenerateOutput::Finished {
                reason: FinishReason::Length,
                completion_tokens: 3,
                cached_tokens: Some(5),
            },
        ]
    }

    pub fn errors() -> Vec<EngineError> {
        vec![
            EngineError::Unreachable("x".into()),
            EngineError::Disconnected,
            EngineError::Stopping,
            EngineError::Overloaded("busy".into()),
            EngineError::Unsupported("too long".into()),
            EngineError::KvLost("source gone".into()),
            EngineError::Invalid("bad".into()),
            EngineError::Internal("oops".into()),
        ]
    }

    pub fn msgpack<T: Serialize>(values: &[T]) -> Vec<Vec<u8>> {
        values
            .iter()
            .flat_map(|v| {
                [
                    rmp_serde::to_vec(v).expect("encodes"),
                    rmp_serde::to_vec_named(v).expect("encodes"),
                ]
            })
            .collect()
    }
}
