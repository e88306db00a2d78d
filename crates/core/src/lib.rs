//! Switchyard's shared vocabulary: no I/O, no clocks, no policy.
//!
//! - [`builtin_vocab`]: the built-in byte-level vocabulary (`serve` without model files).
//! - [`hash`]: local block hashes and chained sequence hashes, compatible with Dynamo
//!   (XXH3-64, seed 1337, token ids as u32 little-endian).
//! - [`blocks`]: a token sequence cut into fixed-size blocks, with the partial last block
//!   kept apart (it is not cacheable until it fills), and [`blocks_for`], the one way a
//!   prompt (tokens, media spans, LoRA adapter) becomes blocks.
//! - [`worker`]: worker identity (`WorkerId` plus data-parallel rank) and roles.
//! - [`load`]: what an engine reports about its load.
//! - [`perf`]: the step timing models (polynomial defaults, or a measured profile) the
//!   mocker runs and the router predicts with.
//! - [`protocol`]: the engine protocol: requests (prompts with media spans, resumed,
//!   prefill-only and remote-KV requests), output streams, and typed errors that say
//!   whether another worker can help.
//! - [`request`]: request identity.
//! - [`trace`]: Mooncake trace rows and their mapping onto engine blocks.
//! - [`event`]: the KV cache event model engines publish and the indexer consumes, with
//!   JSON and MessagePack encodings.

pub mod blocks;
pub mod builtin_vocab;
pub mod event;
pub mod hash;
pub mod load;
pub mod perf;
pub mod protocol;
pub mod request;
pub mod trace;
pub mod worker;

pub use blocks::{InvalidPrompt, TokenBlocks, blocks_for};
pub use event::{KvEvent, KvEventData, StorageTier, StoredBlock};
pub use hash::{HashSeed, LocalBlockHash, SequenceHash};
pub use load::LoadSnapshot;
pub use protocol::{EngineError, MediaSpan, Modalities, Modality, Prompt};
pub use request::{Priority, RequestId};
pub use worker::{WorkerId, WorkerKey, WorkerRole};

/// A token id as engines see it.
pub type Token = u32;
