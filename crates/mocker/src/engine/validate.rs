//! [`MockEngine::validate`]: the block accounting checked against the sequences, and what
//! a broken invariant looks like ([`Inconsistency`]).

use switchyard_core::RequestId;
use thiserror::Error;

use super::MockEngine;
use crate::blocks::BlockId;

/// Block accounting that does not add up, as [`MockEngine::validate`] finds it.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum Inconsistency {
    #[error("{in_use} in use + {cached} cached + {free} free != {capacity}")]
    BlockCount {
        in_use: usize,
        cached: usize,
        free: usize,
        capacity: usize,
    },
    #[error("waiting request {0} holds blocks")]
    WaitingHoldsBlocks(RequestId),
    #[error("request {request} computed {computed} tokens but holds {held} blocks")]
    TooFewBlocks {
        request: RequestId,
        computed: u32,
        held: usize,
    },
    #[error("request {request} block {index} partial/full mismatch")]
    PartialMismatch { request: RequestId, index: usize },
    #[error("request {request} block {index} holds other content")]
    OtherContent { request: RequestId, index: usize },
    #[error("{held} partial blocks held but the manager counts {counted}")]
    PartialCount { held: usize, counted: usize },
    #[error("sequences hold {held} blocks but {in_use} are in use")]
    InUseCount { held: usize, in_use: usize },
    #[error("block {block} has refcount {refcount} but {holders} holders")]
    RefCount {
        block: BlockId,
        refcount: u32,
        holders: u32,
    },
}

impl MockEngine {
    /// Checks the block accounting against the sequences; for tests.
    pub fn validate(&self) -> Result<(), Inconsistency> {
        let blocks = &self.blocks;
        if blocks.in_use() + blocks.inactive() + blocks.free() != blocks.capacity() {
            return Err(Inconsistency::BlockCount {
                in_use: blocks.in_use(),
                cached: blocks.inactive(),
                free: blocks.free(),
                capacity: blocks.capacity(),
            });
        }
        if let Some(seq) = self.waiting.iter().find(|s| !s.blocks.is_empty()) {
            return Err(Inconsistency::WaitingHoldsBlocks(seq.id));
        }
        let mut refs: rustc_hash::FxHashMap<BlockId, u32> = Default::default();
        let mut partial = 0;
        for seq in &self.running {
            let needed = seq.computed.max(1).div_ceil(self.args.block_size) as usize;
            if seq.blocks.len() < needed {
                return Err(Inconsistency::TooFewBlocks {
                    request: seq.id,
                    computed: seq.computed,
                    held: seq.blocks.len(),
                });
            }
            for (i, &id) in seq.blocks.iter().enumerate() {
                *refs.entry(id).or_insert(0) += 1;
                let full = i < seq.full_held as usize;
                if full == blocks.is_partial(id) {
                    return Err(Inconsistency::PartialMismatch {
                        request: seq.id,
                        index: i,
                    });
                }
                if full
                    && blocks.prefix_caching()
                    && blocks.hash_of(id) != Some(seq.tokens.sequence_hashes()[i])
                {
                    return Err(Inconsistency::OtherContent {
                        request: seq.id,
                        index: i,
                    });
                }
                partial += usize::from(!full);
            }
        }
        if partial != blocks.partial_blocks() {
            return Err(Inconsistency::PartialCount {
                held: partial,
                counted: blocks.partial_blocks(),
            });
        }
        if refs.len() != blocks.in_use() {
            return Err(Inconsistency::InUseCount {
                held: refs.len(),
                in_use: blocks.in_use(),
            });
        }
        for (id, count) in refs {
            if blocks.refcount(id) != count {
                return Err(Inconsistency::RefCount {
                    block: id,
                    refcount: blocks.refcount(id),
                    holders: count,
                });
            }
        }
        Ok(())
    }
}
