//! The prefix cache: full blocks' keys and values by sequence hash, least recently used
//! evicted first under the memory budget; a sequence copies its cached prefix in when it
//! starts and offers its newly filled blocks as it grows, each change a KV event.

use candle_core::Tensor;
use hashlink::LinkedHashMap;
use switchyard_core::{KvEvent, KvEventData, SequenceHash, StoredBlock};

use super::CandleEngine;
use super::sequence::Sequence;

/// A cached block: its keys and values for every layer, and its place in the chain.
pub(super) struct CachedBlock {
    kv: Vec<(Tensor, Tensor)>,
}

/// The prefix cache: blocks by sequence hash, least recently used first.
pub(super) struct PrefixCache {
    pub(super) blocks: LinkedHashMap<SequenceHash, CachedBlock>,
    pub(super) budget_blocks: usize,
}

impl PrefixCache {
    fn touch(&mut self, hash: SequenceHash) -> Option<&CachedBlock> {
        let block = self.blocks.remove(&hash)?;
        self.blocks.insert(hash, block);
        self.blocks.get(&hash)
    }

    /// Inserts a block (a no-op for one already held); returns the hashes evicted to make
    /// room.
    fn insert(&mut self, hash: SequenceHash, block: CachedBlock) -> Vec<SequenceHash> {
        if self.blocks.contains_key(&hash) || self.budget_blocks == 0 {
            return Vec::new();
        }
        let mut evicted = Vec::new();
        while self.blocks.len() >= self.budget_blocks {
            match self.blocks.pop_front() {
                Some((old, _)) => evicted.push(old),
                None => break,
            }
        }
        self.blocks.insert(hash, block);
        evicted
    }
}

impl CandleEngine {
    /// Starts a waiting sequence: copies its cached prefix blocks.
    pub(super) fn admit(&mut self, mut seq: Sequence) -> Result<Sequence, candle_core::Error> {
        let size = self.config.block_size as usize;
        // The last prompt token is always computed: its logits give the first output. A
        // prompt whose log probabilities are asked is computed whole (cached blocks have
        // no logits).
        let usable = if seq.prompt_logprobs.is_some() {
            0
        } else {
            (seq.prompt_len - 1) / size
        };
        let hashes: Vec<SequenceHash> =
            seq.blocks.sequence_hashes()[..usable.min(seq.blocks.full_blocks())].to_vec();
        let mut held = 0;
        for &hash in &hashes {
            if self.cache.touch(hash).is_none() {
                break;
            }
            held += 1;
        }
        // Room for the prompt and its first output at once; the output grows it by doubling.
        seq.kv.reserve(seq.prompt_len + 1)?;
        let blocks: Vec<&[(Tensor, Tensor)]> = hashes[..held]
            .iter()
            .filter_map(|h| self.cache.blocks.get(h).map(|b| b.kv.as_slice()))
            .collect();
        seq.kv.extend_from(&blocks, size)?;
        seq.cached_tokens = seq.kv.len() as u32;
        Ok(seq)
    }

    /// Offers a sequence's newly filled blocks to the cache.
    pub(super) fn offer_blocks(&mut self, index: usize, events: &mut Vec<KvEvent>) {
        let size = self.config.block_size as usize;
        let seq = &self.running[index];
        let full = (seq.kv.len() / size).min(seq.blocks.full_blocks());
        if full <= seq.offered {
            return;
        }
        let from = seq.offered;
        let hashes = seq.blocks.sequence_hashes()[from..full].to_vec();
        let locals = seq.blocks.local_hashes()[from..full].to_vec();
        let parent = from.checked_sub(1).map(|p| seq.blocks.sequence_hashes()[p]);
        let mut stored = Vec::new();
        let mut evicted = Vec::new();
        for (i, (&hash, &local)) in hashes.iter().zip(&locals).enumerate() {
            if self.cache.blocks.contains_key(&hash) {
                self.cache.touch(hash);
                continue;
            }
            let kv = match self.running[index].kv.slice((from + i) * size, size) {
                Ok(kv) => kv,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot copy a block into the prefix cache");
                    break;
                }
            };
            evicted.extend(self.cache.insert(hash, CachedBlock { kv }));
            stored.push((
                from + i,
                StoredBlock {
                    seq_hash: hash,
                    local_hash: local,
                },
            ));
        }
        self.running[index].offered = full;
        if !evicted.is_empty() {
            let event = self.event(KvEventData::Removed {
                seq_hashes: evicted,
            });
            events.push(event);
        }
        // Stored blocks as chains: a run of consecutive blocks is one event.
        let all = self.running[index].blocks.sequence_hashes().to_vec();
        let mut run: Vec<StoredBlock> = Vec::new();
        let mut run_parent = parent;
        let mut last: Option<usize> = None;
        for (position, block) in stored {
            if last.is_some_and(|l| l + 1 != position) && !run.is_empty() {
                let event = self.event(KvEventData::Stored {
                    parent: run_parent,
                    blocks: std::mem::take(&mut run),
                });
                events.push(event);
            }
            if run.is_empty() {
                run_parent = position.checked_sub(1).map(|p| all[p]);
            }
            run.push(block);
            last = Some(position);
        }
        if !run.is_empty() {
            let event = self.event(KvEventData::Stored {
                parent: run_parent,
                blocks: run,
            });
            events.push(event);
        }
    }
}
