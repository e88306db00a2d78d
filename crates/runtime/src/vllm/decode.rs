//! Decoding vLLM's KV event batches (MessagePack, as msgspec writes them).
//!
//! vLLM's structs are `array_like` with `omit_defaults`: a batch is `[ts, events, dp_rank]`
//! (the rank left out when it is none) and an event is `[tag, field, ...]` with trailing
//! defaults left out. Publishers configured otherwise (and SGLang's) write maps instead:
//! `{"ts", "events", "data_parallel_rank"}` and `{"type": tag, field: value, ...}`. Both
//! are accepted, field by field, so a newer vLLM with more trailing fields still decodes.
//!
//! Block hashes are the engine's own (an integer, or the bytes of a SHA-256): they become
//! opaque sequence hashes (bytes through XXH3). The local hashes the router matches
//! prompts against are computed here from the event's token ids, block by block, under the
//! LoRA adapter's seed, exactly as a frontend hashes a prompt.

use rmpv::Value;
use switchyard_core::hash::{HashSeed, local_block_hash};
use switchyard_core::{KvEventData, SequenceHash, StorageTier, StoredBlock};
use thiserror::Error;

/// One batch of a vLLM publisher, decoded.
#[derive(Debug, Clone, PartialEq)]
pub struct DecodedBatch {
    /// The data-parallel rank that published it (0 when it does not say).
    pub dp_rank: u32,
    /// Its events, in order, each with the storage tier it concerns.
    pub events: Vec<(StorageTier, KvEventData)>,
    /// Types of events skipped as unknown (a newer engine's): they say nothing of the
    /// blocks the index tracks.
    pub skipped: Vec<String>,
}

#[derive(Debug, Error)]
pub enum DecodeError {
    #[error("not MessagePack: {0}")]
    Msgpack(#[source] rmpv::decode::Error),
    #[error("a batch must be an array [ts, events, dp_rank] or a map, got {0}")]
    Batch(&'static str),
    #[error("event {index}: {source}")]
    Event {
        index: usize,
        #[source]
        source: EventError,
    },
}

/// What is wrong with one event of a batch.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum EventError {
    #[error("an array event must start with its type name")]
    ArrayWithoutType,
    #[error("a map event needs a \"type\"")]
    MapWithoutType,
    #[error("an event must be an array or a map, got {0}")]
    NotAnEvent(&'static str),
    #[error("BlockStored needs a block_size")]
    NoBlockSize,
    #[error(
        "the engine's blocks hold {engine} tokens but the worker was registered with {worker} \
         (set the worker's block size to the engine's)"
    )]
    BlockSize { engine: u64, worker: u32 },
    #[error("{hashes} block hashes need {needed} token ids, got {got}")]
    TokenCount {
        hashes: usize,
        needed: usize,
        got: usize,
    },
    #[error("a block hash does not fit in 64 bits")]
    WideHash,
    #[error("a block hash must be an integer or bytes, got {0}")]
    HashKind(&'static str),
    #[error("{name} must be an array, got {kind}")]
    NotAnArray {
        name: &'static str,
        kind: &'static str,
    },
    #[error("{0} is missing")]
    Missing(&'static str),
    /// The value, as MessagePack's text form writes it.
    #[error("a token id must be a u32, got {0}")]
    TokenId(String),
    #[error("medium must be a string, got {0}")]
    Medium(&'static str),
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Nil => "nil",
        Value::Boolean(_) => "a boolean",
        Value::Integer(_) => "an integer",
        Value::F32(_) | Value::F64(_) => "a float",
        Value::String(_) => "a string",
        Value::Binary(_) => "bytes",
        Value::Array(_) => "an array",
        Value::Map(_) => "a map",
        Value::Ext(..) => "an extension",
    }
}

/// Decodes one batch payload. `block_size` is the worker's (what it registered); events
/// of another block size are refused, since their blocks would never match a prompt.
pub fn decode_batch(payload: &[u8], block_size: u32) -> Result<DecodedBatch, DecodeError> {
    let value = rmpv::decode::read_value(&mut &payload[..]).map_err(DecodeError::Msgpack)?;
    let (events, dp_rank) = match &value {
        Value::Array(items) => (items.get(1), items.get(2)),
        Value::Map(_) => (
            field(&value, "events"),
            field(&value, "data_parallel_rank").or_else(|| field(&value, "dp_rank")),
        ),
        other => return Err(DecodeError::Batch(kind(other))),
    };
    let Some(Value::Array(events)) = events else {
        return Err(DecodeError::Batch("one without an events array"));
    };
    let dp_rank = match dp_rank {
        None | Some(Value::Nil) => 0,
        Some(v) => v
            .as_u64()
            .and_then(|r| u32::try_from(r).ok())
            .ok_or(DecodeError::Batch(
                "one whose dp_rank is not a small integer",
            ))?,
    };
    let mut decoded = DecodedBatch {
        dp_rank,
        events: Vec::with_capacity(events.len()),
        skipped: Vec::new(),
    };
    for (index, event) in events.iter().enumerate() {
        match decode_event(event, block_size)
            .map_err(|source| DecodeError::Event { index, source })?
        {
            Decoded::Event(tier, data) => decoded.events.push((tier, data)),
            Decoded::Unknown(tag) => decoded.skipped.push(tag),
        }
    }
    Ok(decoded)
}

/// A map's value under a string key.
fn field<'a>(map: &'a Value, key: &str) -> Option<&'a Value> {
    map.as_map()?
        .iter()
        .find(|(k, _)| k.as_str() == Some(key))
        .map(|(_, v)| v)
}

/// An event's fields by name, whichever encoding it came in.
struct Fields<'a> {
    tag: &'a str,
    array: Option<&'a [Value]>,
    map: Option<&'a Value>,
}

impl<'a> Fields<'a> {
    fn of(event: &'a Value) -> Result<Self, EventError> {
        match event {
            Value::Array(items) => {
                let tag = items
                    .first()
                    .and_then(Value::as_str)
                    .ok_or(EventError::ArrayWithoutType)?;
                Ok(Fields {
                    tag,
                    array: Some(&items[1..]),
                    map: None,
                })
            }
            Value::Map(_) => {
                let tag = field(event, "type")
                    .and_then(Value::as_str)
                    .ok_or(EventError::MapWithoutType)?;
                Ok(Fields {
                    tag,
                    array: None,
                    map: Some(event),
                })
            }
            other => Err(EventError::NotAnEvent(kind(other))),
        }
    }

    /// The field at `position` (after the tag) of an array event, or named `name` in a map;
    /// none when absent or nil.
    fn get(&self, position: usize, name: &str) -> Option<&'a Value> {
        let value = match (self.array, self.map) {
            (Some(items), _) => items.get(position),
            (None, Some(map)) => field(map, name),
            (None, None) => None,
        };
        value.filter(|v| !v.is_nil())
    }
}

// Field positions (after the tag), as vLLM declares them.
const STORED_HASHES: usize = 0;
const STORED_PARENT: usize = 1;
const STORED_TOKENS: usize = 2;
const STORED_BLOCK_SIZE: usize = 3;
const STORED_LORA_ID: usize = 4;
const STORED_MEDIUM: usize = 5;
const STORED_LORA_NAME: usize = 6;
const REMOVED_HASHES: usize = 0;
const REMOVED_MEDIUM: usize = 1;

/// One event: a known one, or the type of one this decoder does not know.
enum Decoded {
    Event(StorageTier, KvEventData),
    Unknown(String),
}

fn decode_event(event: &Value, block_size: u32) -> Result<Decoded, EventError> {
    let fields = Fields::of(event)?;
    match fields.tag {
        "BlockStored" => {
            let hashes = hash_list(fields.get(STORED_HASHES, "block_hashes"), "block_hashes")?;
            let parent = fields
                .get(STORED_PARENT, "parent_block_hash")
                .map(block_hash)
                .transpose()?;
            let tokens = token_list(fields.get(STORED_TOKENS, "token_ids"))?;
            let event_block_size = fields
                .get(STORED_BLOCK_SIZE, "block_size")
                .and_then(Value::as_u64)
                .ok_or(EventError::NoBlockSize)?;
            if event_block_size != u64::from(block_size) {
                return Err(EventError::BlockSize {
                    engine: event_block_size,
                    worker: block_size,
                });
            }
            if tokens.len() != hashes.len() * block_size as usize {
                return Err(EventError::TokenCount {
                    hashes: hashes.len(),
                    needed: hashes.len() * block_size as usize,
                    got: tokens.len(),
                });
            }
            let lora_name = fields
                .get(STORED_LORA_NAME, "lora_name")
                .and_then(Value::as_str)
                .map(str::to_owned)
                .or_else(|| {
                    fields
                        .get(STORED_LORA_ID, "lora_id")
                        .and_then(Value::as_i64)
                        .map(|id| id.to_string())
                });
            let seed = HashSeed::for_lora(lora_name.as_deref());
            let blocks = hashes
                .into_iter()
                .zip(tokens.chunks_exact(block_size as usize))
                .map(|(seq_hash, tokens)| StoredBlock {
                    seq_hash,
                    local_hash: local_block_hash(tokens, seed),
                })
                .collect();
            let tier = medium(fields.get(STORED_MEDIUM, "medium"))?;
            Ok(Decoded::Event(tier, KvEventData::Stored { parent, blocks }))
        }
        "BlockRemoved" => {
            let seq_hashes = hash_list(fields.get(REMOVED_HASHES, "block_hashes"), "block_hashes")?;
            let tier = medium(fields.get(REMOVED_MEDIUM, "medium"))?;
            Ok(Decoded::Event(tier, KvEventData::Removed { seq_hashes }))
        }
        "AllBlocksCleared" => Ok(Decoded::Event(StorageTier::Device, KvEventData::Cleared)),
        other => Ok(Decoded::Unknown(other.to_owned())),
    }
}

/// An engine block hash: an integer (signed or not, as Python wrote it) or bytes.
fn block_hash(value: &Value) -> Result<SequenceHash, EventError> {
    match value {
        Value::Integer(i) => i
            .as_u64()
            // Python's built-in hash is signed: the same 64 bits either way.
            .or_else(|| i.as_i64().map(|v| v as u64))
            .map(SequenceHash)
            .ok_or(EventError::WideHash),
        Value::Binary(bytes) => Ok(SequenceHash(xxhash_rust::xxh3::xxh3_64(bytes))),
        other => Err(EventError::HashKind(kind(other))),
    }
}

fn hash_list(value: Option<&Value>, name: &'static str) -> Result<Vec<SequenceHash>, EventError> {
    match value {
        Some(Value::Array(items)) => items.iter().map(block_hash).collect(),
        Some(other) => Err(EventError::NotAnArray {
            name,
            kind: kind(other),
        }),
        None => Err(EventError::Missing(name)),
    }
}

fn token_list(value: Option<&Value>) -> Result<Vec<u32>, EventError> {
    match value {
        Some(Value::Array(items)) => items
            .iter()
            .map(|t| {
                t.as_u64()
                    .and_then(|t| u32::try_from(t).ok())
                    .ok_or_else(|| EventError::TokenId(t.to_string()))
            })
            .collect(),
        Some(other) => Err(EventError::NotAnArray {
            name: "token_ids",
            kind: kind(other),
        }),
        None => Err(EventError::Missing("token_ids")),
    }
}

/// vLLM's `medium` ("GPU", "CPU", "DISK", or a connector's name) as a storage tier.
fn medium(value: Option<&Value>) -> Result<StorageTier, EventError> {
    let Some(value) = value else {
        return Ok(StorageTier::Device);
    };
    let name = value
        .as_str()
        .ok_or_else(|| EventError::Medium(kind(value)))?;
    Ok(match name.to_ascii_uppercase().as_str() {
        "GPU" | "DEVICE" | "HBM" => StorageTier::Device,
        "CPU" | "HOST" | "CPU_TIER" => StorageTier::Host,
        "DISK" | "SSD" | "NVME" => StorageTier::Disk,
        _ => StorageTier::External,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_core::hash::sequence_hashes;

    fn encode(value: &Value) -> Vec<u8> {
        let mut out = Vec::new();
        rmpv::encode::write_value(&mut out, value).unwrap();
        out
    }

    fn s(text: &str) -> Value {
        Value::from(text)
    }

    fn ints(values: &[u64]) -> Value {
        Value::Array(values.iter().map(|&v| Value::from(v)).collect())
    }

    #[test]
    fn array_encoding_with_trailing_fields_left_out() {
        let tokens: Vec<u64> = (1..=8).collect();
        let stored = Value::Array(vec![
            s("BlockStored"),
            ints(&[11, 12]),
            Value::Nil,
            ints(&tokens),
            Value::from(4),
        ]);
        let removed = Value::Array(vec![s("BlockRemoved"), ints(&[11]), s("CPU")]);
        let cleared = Value::Array(vec![s("AllBlocksCleared")]);
        let batch = Value::Array(vec![
            Value::F64(1.5),
            Value::Array(vec![stored, removed, cleared]),
        ]);
        let decoded = decode_batch(&encode(&batch), 4).unwrap();
        assert_eq!(decoded.dp_rank, 0);
        let seed = HashSeed::default();
        let locals = [
            local_block_hash(&[1, 2, 3, 4], seed),
            local_block_hash(&[5, 6, 7, 8], seed),
        ];
        assert_eq!(
            decoded.events,
            vec![
                (
                    StorageTier::Device,
                    KvEventData::Stored {
                        parent: None,
                        blocks: vec![
                            StoredBlock {
                                seq_hash: SequenceHash(11),
                                local_hash: locals[0],
                            },
                            StoredBlock {
                                seq_hash: SequenceHash(12),
                                local_hash: locals[1],
                            },
                        ],
                    }
                ),
                (
                    StorageTier::Host,
                    KvEventData::Removed {
                        seq_hashes: vec![SequenceHash(11)]
                    }
                ),
                (StorageTier::Device, KvEventData::Cleared),
            ]
        );
        // The local hashes are the ones a frontend computes for the same prompt.
        assert_eq!(sequence_hashes(&locals).len(), 2);
    }

    #[test]
    fn map_encoding_with_bytes_hashes_lora_and_rank() {
        let sha = Value::Binary(vec![0xab; 32]);
        let parent = Value::Binary(vec![0xcd; 32]);
        let stored = Value::Map(vec![
            (s("type"), s("BlockStored")),
            (s("block_hashes"), Value::Array(vec![sha.clone()])),
            (s("parent_block_hash"), parent),
            (s("token_ids"), ints(&[9, 9, 9, 9])),
            (s("block_size"), Value::from(4)),
            (s("lora_id"), Value::from(3)),
            (s("medium"), s("GPU")),
            (s("lora_name"), s("sql")),
            (s("extra_keys"), Value::Nil),
        ]);
        let batch = Value::Map(vec![
            (s("ts"), Value::F64(2.0)),
            (s("events"), Value::Array(vec![stored])),
            (s("data_parallel_rank"), Value::from(2)),
        ]);
        let decoded = decode_batch(&encode(&batch), 4).unwrap();
        assert_eq!(decoded.dp_rank, 2);
        let (tier, KvEventData::Stored { parent, blocks }) = &decoded.events[0] else {
            panic!("not a store: {decoded:?}");
        };
        assert_eq!(*tier, StorageTier::Device);
        assert_eq!(
            *parent,
            Some(SequenceHash(xxhash_rust::xxh3::xxh3_64(&[0xcd; 32])))
        );
        assert_eq!(
            blocks[0].seq_hash,
            SequenceHash(xxhash_rust::xxh3::xxh3_64(&[0xab; 32]))
        );
        // The adapter's name seeds the local hash, as for a request naming it.
        assert_eq!(
            blocks[0].local_hash,
            local_block_hash(&[9; 4], HashSeed::for_lora(Some("sql")))
        );
        assert_ne!(
            blocks[0].local_hash,
            local_block_hash(&[9; 4], HashSeed::default())
        );
    }

    #[test]
    fn signed_python_hashes_keep_their_bits() {
        let stored = Value::Array(vec![
            s("BlockRemoved"),
            Value::Array(vec![Value::from(-2i64)]),
        ]);
        let batch = Value::Array(vec![
            Value::F64(0.0),
            Value::Array(vec![stored]),
            Value::from(1),
        ]);
        let decoded = decode_batch(&encode(&batch), 16).unwrap();
        assert_eq!(decoded.dp_rank, 1);
        assert_eq!(
            decoded.events[0].1,
            KvEventData::Removed {
                seq_hashes: vec![SequenceHash(u64::MAX - 1)]
            }
        );
    }

    #[test]
    fn bad_batches_are_errors_naming_the_problem() {
        assert!(matches!(
            decode_batch(&[0x92, 0x01], 16),
            Err(DecodeError::Msgpack(_))
        ));
        assert!(matches!(
            decode_batch(&encode(&Value::from(3)), 16),
            Err(DecodeError::Batch(_))
        ));
        let wrong_size = Value::Array(vec![
            Value::F64(0.0),
            Value::Array(vec![Value::Array(vec![
                s("BlockStored"),
                ints(&[1]),
                Value::Nil,
                ints(&[1; 32]),
                Value::from(32),
            ])]),
        ]);
        let err = decode_batch(&encode(&wrong_size), 16).unwrap_err();
        assert!(err.to_string().contains("hold 32 tokens"), "{err}");
        let short = Value::Array(vec![
            Value::F64(0.0),
            Value::Array(vec![Value::Array(vec![
                s("BlockStored"),
                ints(&[1, 2]),
                Value::Nil,
                ints(&[1; 16]),
                Value::from(16),
            ])]),
        ]);
        let err = decode_batch(&encode(&short), 16).unwrap_err();
        assert!(err.to_string().contains("need 32 token ids"), "{err}");
        // An event type this decoder does not know (a newer engine's) is skipped, the
        // others decoded.
        let unknown = Value::Array(vec![
            Value::F64(0.0),
            Value::Array(vec![
                Value::Array(vec![s("BlockMoved")]),
                Value::Array(vec![s("AllBlocksCleared")]),
            ]),
        ]);
        let decoded = decode_batch(&encode(&unknown), 16).unwrap();
        assert_eq!(decoded.skipped, vec!["BlockMoved".to_owned()]);
        assert_eq!(
            decoded.events,
            vec![(StorageTier::Device, KvEventData::Cleared)]
        );
    }
}
