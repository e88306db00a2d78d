//! Trace requests, and their prompts as engine blocks.
//!
//! A Mooncake request names its prompt by hash ids of trace blocks (512 tokens by default);
//! each trace block becomes `trace_block_size / engine_block_size` engine blocks hashed from
//! the id and position, so shared trace prefixes stay shared engine prefixes. A request with
//! no hash ids (the Azure traces) gets blocks of its own, shared with no other request.
//! Tokens of the partial last block are synthesised deterministically.

use std::time::Duration;

use switchyard_core::hash::sequence_hashes;
use switchyard_core::trace::MooncakeRecord;
use switchyard_core::{HashSeed, LocalBlockHash, Token, TokenBlocks};
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// One request of a trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceRequest {
    pub arrival: Duration,
    pub input_tokens: u32,
    pub output_tokens: u32,
    /// Hash ids of the prompt's trace blocks; empty when the trace has no prefix information.
    pub hash_ids: Vec<u64>,
}

impl TraceRequest {
    pub fn from_mooncake(record: &MooncakeRecord) -> Self {
        TraceRequest {
            arrival: Duration::from_millis(record.timestamp),
            input_tokens: record.input_length.min(u64::from(u32::MAX)) as u32,
            output_tokens: record.output_length.min(u64::from(u32::MAX)) as u32,
            hash_ids: record.hash_ids.clone(),
        }
    }
}

/// A trace ready to simulate: arrivals (scaled), prompts cut into engine blocks.
#[derive(Debug, Clone)]
pub struct PreparedWorkload {
    pub block_size: u32,
    pub requests: Vec<PreparedRequest>,
}

#[derive(Debug, Clone)]
pub struct PreparedRequest {
    pub arrival: Duration,
    pub prompt: TokenBlocks,
    pub output_tokens: u32,
}

impl PreparedWorkload {
    /// Cuts every prompt into `block_size`-token blocks. Arrivals are divided by `speedup`
    /// and shifted so the first request arrives at 0.
    pub fn prepare(
        requests: &[TraceRequest],
        trace_block_size: u32,
        block_size: u32,
        speedup: f64,
    ) -> Self {
        let start = requests.iter().map(|r| r.arrival).min().unwrap_or_default();
        let speedup = if speedup.is_finite() && speedup > 0.0 {
            speedup
        } else {
            1.0
        };
        let prepared = requests
            .iter()
            .enumerate()
            .map(|(i, r)| PreparedRequest {
                arrival: (r.arrival - start).div_f64(speedup),
                prompt: prompt_blocks(i as u64, r, trace_block_size, block_size),
                output_tokens: r.output_tokens.max(1),
            })
            .collect();
        PreparedWorkload {
            block_size,
            requests: prepared,
        }
    }

    pub fn total_prompt_tokens(&self) -> u64 {
        self.requests
            .iter()
            .map(|r| r.prompt.total_tokens() as u64)
            .sum()
    }
}

fn prompt_blocks(
    index: u64,
    request: &TraceRequest,
    trace_block_size: u32,
    block_size: u32,
) -> TokenBlocks {
    let input = request.input_tokens.max(1);
    let locals: Vec<LocalBlockHash> = if request.hash_ids.is_empty() {
        (0..input / block_size)
            .map(|b| LocalBlockHash(mix(index, u64::from(b))))
            .collect()
    } else {
        let record = MooncakeRecord {
            timestamp: 0,
            input_length: u64::from(input),
            output_length: 0,
            hash_ids: request.hash_ids.clone(),
        };
        record.engine_block_hashes(trace_block_size, block_size)
    };
    let full = locals.len() as u32;
    let tail_len = input.saturating_sub(full * block_size).min(block_size - 1);
    let tail: Vec<Token> = (0..tail_len)
        .map(|t| (mix(index, u64::from(t) | 1 << 40) % 32_000) as Token)
        .collect();
    let seqs = sequence_hashes(&locals);
    TokenBlocks::from_parts(block_size, HashSeed::default(), locals, seqs, tail)
        .unwrap_or_else(|_| unreachable!("parts are built to fit"))
}

fn mix(a: u64, b: u64) -> u64 {
    let mut key = [0u8; 16];
    key[..8].copy_from_slice(&a.to_le_bytes());
    key[8..].copy_from_slice(&b.to_le_bytes());
    xxh3_64_with_seed(&key, 0x51_4d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_trace_prefixes_share_engine_blocks_and_lengths_are_kept() {
        let a = TraceRequest {
            arrival: Duration::from_millis(1000),
            input_tokens: 1100,
            output_tokens: 5,
            hash_ids: vec![1, 2, 3],
        };
        let b = TraceRequest {
            arrival: Duration::from_millis(3000),
            input_tokens: 700,
            output_tokens: 0,
            hash_ids: vec![1, 9],
        };
        let w = PreparedWorkload::prepare(&[a, b], 512, 16, 2.0);
        let (pa, pb) = (&w.requests[0].prompt, &w.requests[1].prompt);
        assert_eq!(pa.total_tokens(), 1100);
        assert_eq!(pb.total_tokens(), 700);
        assert_eq!(pa.sequence_hashes()[..32], pb.sequence_hashes()[..32]);
        assert_ne!(pa.sequence_hashes()[32], pb.sequence_hashes()[32]);
        assert_eq!(w.requests[0].arrival, Duration::ZERO);
        assert_eq!(w.requests[1].arrival, Duration::from_millis(1000));
        assert_eq!(w.requests[1].output_tokens, 1, "at least one output token");
    }

    #[test]
    fn requests_without_prefix_information_share_nothing() {
        let r = TraceRequest {
            arrival: Duration::ZERO,
            input_tokens: 64,
            output_tokens: 1,
            hash_ids: vec![],
        };
        let w = PreparedWorkload::prepare(&[r.clone(), r], 512, 16, 1.0);
        assert_eq!(w.requests[0].prompt.full_blocks(), 4);
        assert_ne!(
            w.requests[0].prompt.sequence_hashes()[0],
            w.requests[1].prompt.sequence_hashes()[0]
        );
    }
}
