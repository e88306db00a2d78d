//! Trace requests, and their prompts as engine blocks.
//!
//! Every prompt becomes blocks the way it does in the servers: through
//! [`switchyard_core::blocks_for`]. A trace that gives prompts as hash ids (Mooncake: each id
//! stands for `trace_block_size` tokens of shared content) gets tokens synthesised from the
//! ids, so equal ids make equal tokens and shared trace prefixes stay shared engine
//! prefixes at any engine block size; a request without hash ids (the Azure traces) gets
//! tokens of its own, shared with no other request. A workload can also be given as real
//! prompts ([`PreparedWorkload::from_prompts`]), as the servers would receive them.

use std::time::Duration;

use switchyard_core::MediaSpan;
use switchyard_core::protocol::Prompt;
use switchyard_core::trace::session::{self, SessionError, Turn};
use switchyard_core::trace::{MediaRecord, MooncakeRecord};
use switchyard_core::{InvalidPrompt, Priority, Token, TokenBlocks, blocks_for};

/// Size of the vocabulary synthesised tokens are drawn from.
const VOCAB: u64 = 32_000;

/// One request of a trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceRequest {
    pub arrival: Duration,
    pub input_tokens: u32,
    pub output_tokens: u32,
    /// Hash ids of the prompt's trace blocks; empty when the trace has no prefix information.
    pub hash_ids: Vec<u64>,
    /// Media items in the prompt (a multimodal trace).
    pub media: Vec<MediaRecord>,
    /// Its session, and the requests whose completions release it (a session trace: it is
    /// then sent closed loop, not at `arrival`); none: a flat trace's row.
    pub turn: Option<Turn>,
}

impl TraceRequest {
    /// A trace's rows, their sessions resolved when it has any.
    pub fn from_trace(records: &[MooncakeRecord]) -> Result<Vec<Self>, SessionError> {
        let mut requests: Vec<Self> = records.iter().map(Self::from_mooncake).collect();
        if session::has_sessions(records) {
            for (request, turn) in requests.iter_mut().zip(session::resolve(records)?) {
                request.turn = Some(turn);
            }
        }
        Ok(requests)
    }

    pub fn from_mooncake(record: &MooncakeRecord) -> Self {
        TraceRequest {
            arrival: Duration::from_millis(record.timestamp),
            input_tokens: record.input_length.min(u64::from(u32::MAX)) as u32,
            output_tokens: record.output_length.min(u64::from(u32::MAX)) as u32,
            hash_ids: record.hash_ids.clone(),
            media: record.media.clone(),
            turn: None,
        }
    }

    /// Whether it is sent at its `arrival` (not released by other requests).
    pub fn is_root(&self) -> bool {
        self.turn.as_ref().is_none_or(|t| t.after.is_none())
    }
}

/// A request given as the servers receive it.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptRequest {
    pub arrival: Duration,
    pub prompt: Prompt,
    pub max_tokens: u32,
    pub priority: Priority,
}

/// A workload ready to simulate: arrivals (scaled), prompts cut into engine blocks.
#[derive(Debug, Clone)]
pub struct PreparedWorkload {
    pub block_size: u32,
    pub requests: Vec<PreparedRequest>,
}

#[derive(Debug, Clone)]
pub struct PreparedRequest {
    /// When it is sent; for a request released by others (see `turn`), unknown until they
    /// complete, and zero here.
    pub arrival: Duration,
    pub prompt: TokenBlocks,
    /// Output tokens asked for (fewer come out if an end-of-sequence token is drawn).
    pub output_tokens: u32,
    pub priority: Priority,
    /// Its media items, to encode before it can be prefilled.
    pub media: Vec<MediaSpan>,
    /// Its session and what releases it, waits divided by the speedup (a session trace).
    pub turn: Option<Turn>,
}

impl PreparedWorkload {
    /// Cuts every prompt into `block_size`-token blocks. Arrivals (and a session's waits)
    /// are divided by `speedup` and shifted so the first request arrives at 0.
    pub fn prepare(
        requests: &[TraceRequest],
        trace_block_size: u32,
        block_size: u32,
        speedup: f64,
    ) -> Self {
        let start = requests
            .iter()
            .filter(|r| r.is_root())
            .map(|r| r.arrival)
            .min()
            .unwrap_or_default();
        let speedup = if speedup.is_finite() && speedup > 0.0 {
            speedup
        } else {
            1.0
        };
        // Token buffers, reused from prompt to prompt.
        let mut prompt = Prompt::default();
        let mut text: Vec<Token> = Vec::new();
        let prepared = requests
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let len = r.input_tokens.max(1) as usize;
                prompt.media = media_spans(&r.media, len);
                if prompt.media.is_empty() {
                    synthesise(i as u64, r, len, trace_block_size, &mut prompt.token_ids);
                } else {
                    // The media is inserted: the text (laid out by the hash ids as if there
                    // were none) flows around its placeholder positions, which hold one
                    // token, as the servers write them; only the media hash tells two
                    // items apart.
                    let media: usize = prompt.media.iter().map(|s| s.length as usize).sum();
                    synthesise(i as u64, r, len - media, trace_block_size, &mut text);
                    prompt.token_ids.clear();
                    let mut rest = text.as_slice();
                    for span in &prompt.media {
                        let before = span.offset as usize - prompt.token_ids.len();
                        let (head, tail) = rest.split_at(before.min(rest.len()));
                        prompt.token_ids.extend_from_slice(head);
                        prompt.token_ids.resize(span.end() as usize, 0);
                        rest = tail;
                    }
                    prompt.token_ids.extend_from_slice(rest);
                }
                let mut turn = r.turn.clone();
                if let Some(after) = turn.as_mut().and_then(|t| t.after.as_mut()) {
                    after.delay = after.delay.div_f64(speedup);
                    after.tool_wait = after.tool_wait.div_f64(speedup);
                }
                PreparedRequest {
                    arrival: if r.is_root() {
                        r.arrival.saturating_sub(start).div_f64(speedup)
                    } else {
                        Duration::ZERO
                    },
                    prompt: blocks_for(&prompt, block_size.max(1))
                        .unwrap_or_else(|_| unreachable!("spans checked, blocks of at least 1")),
                    output_tokens: r.output_tokens.max(1),
                    priority: Priority::Standard,
                    media: prompt.media.clone(),
                    turn,
                }
            })
            .collect();
        PreparedWorkload {
            block_size: block_size.max(1),
            requests: prepared,
        }
    }

    /// Cuts real prompts into `block_size`-token blocks, as the servers do. Arrivals are
    /// kept as they are (ordered by the caller).
    pub fn from_prompts(
        requests: &[PromptRequest],
        block_size: u32,
    ) -> Result<Self, InvalidPrompt> {
        let prepared = requests
            .iter()
            .map(|r| {
                Ok(PreparedRequest {
                    arrival: r.arrival,
                    prompt: blocks_for(&r.prompt, block_size)?,
                    output_tokens: r.max_tokens.max(1),
                    priority: r.priority,
                    media: r.prompt.media.clone(),
                    turn: None,
                })
            })
            .collect::<Result<_, InvalidPrompt>>()?;
        Ok(PreparedWorkload {
            block_size,
            requests: prepared,
        })
    }

    pub fn total_prompt_tokens(&self) -> u64 {
        self.requests
            .iter()
            .map(|r| r.prompt.total_tokens() as u64)
            .sum()
    }
}

/// A trace request's media as prompt spans: in order, within the prompt's `len` tokens,
/// not overlapping (an item that breaks these is left out, and so is an empty one).
fn media_spans(media: &[MediaRecord], len: usize) -> Vec<MediaSpan> {
    let mut spans = Vec::with_capacity(media.len());
    let mut end = 0u64;
    for m in media {
        let (Ok(offset), Ok(length)) = (u32::try_from(m.offset), u32::try_from(m.tokens)) else {
            continue;
        };
        if length == 0 || m.offset < end || m.offset + m.tokens > len as u64 {
            continue;
        }
        end = m.offset + m.tokens;
        spans.push(MediaSpan {
            modality: m.modality,
            media_hash: m.hash,
            offset,
            length,
        });
    }
    spans
}

/// The `len` text tokens of request `index`'s prompt, into `out`: position `p` holds a token drawn
/// from the hash id covering it and its offset in that trace block, so equal ids give equal
/// tokens; positions past the ids (or every position, without ids) are the request's own.
fn synthesise(
    index: u64,
    request: &TraceRequest,
    len: usize,
    trace_block_size: u32,
    out: &mut Vec<Token>,
) {
    let t = trace_block_size.max(1) as usize;
    out.clear();
    out.extend((0..len).map(|p| {
        let key = match request.hash_ids.get(p / t) {
            Some(&id) => id,
            // Top bit set: never equal to a hash id of the trace.
            None => index | 1 << 63,
        };
        (mix(key, (p % t) as u64) % VOCAB) as Token
    }));
}

/// A 64-bit mix of two values (splitmix64's finaliser).
fn mix(a: u64, b: u64) -> u64 {
    let mut x = a.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ b.wrapping_add(0x632B_E59B_D9B4_E019);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_core::Modality;

    fn item(offset: u64, tokens: u64, hash: u64) -> MediaRecord {
        MediaRecord {
            modality: Modality::Image,
            offset,
            tokens,
            hash,
        }
    }

    #[test]
    fn media_rows_become_spans_and_the_same_item_shares_blocks() {
        // In order and inside the prompt: kept; overlapping, past the end or empty: left out.
        let spans = media_spans(
            &[
                item(10, 20, 1),
                item(25, 5, 2),
                item(40, 0, 3),
                item(50, 10, 4),
                item(90, 20, 5),
            ],
            100,
        );
        assert_eq!(
            spans
                .iter()
                .map(|s| (s.offset, s.length, s.media_hash))
                .collect::<Vec<_>>(),
            [(10, 20, 1), (50, 10, 4)]
        );
        // Two requests with different text after the item (trace blocks 2 and 9) but the
        // same item: equal blocks through it; another item: they part at its first block.
        let request = |second: u64, hash: u64| TraceRequest {
            arrival: Duration::ZERO,
            input_tokens: 64,
            output_tokens: 1,
            hash_ids: vec![1, second],
            media: vec![item(16, 32, hash)],
            turn: None,
        };
        let w =
            PreparedWorkload::prepare(&[request(2, 7), request(9, 7), request(2, 8)], 16, 16, 1.0);
        let hashes = |i: usize| w.requests[i].prompt.sequence_hashes().to_vec();
        assert_eq!(hashes(0)[..3], hashes(1)[..3]);
        assert_eq!(hashes(0)[0], hashes(2)[0]);
        assert_ne!(hashes(0)[1], hashes(2)[1]);
        assert_eq!(w.requests[0].media.len(), 1);
    }

    #[test]
    fn shared_trace_prefixes_share_engine_blocks_and_lengths_are_kept() {
        let a = TraceRequest {
            arrival: Duration::from_millis(1000),
            input_tokens: 1100,
            output_tokens: 5,
            hash_ids: vec![1, 2, 3],
            media: Vec::new(),
            turn: None,
        };
        let b = TraceRequest {
            arrival: Duration::from_millis(3000),
            input_tokens: 700,
            output_tokens: 0,
            hash_ids: vec![1, 9],
            media: Vec::new(),
            turn: None,
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
            media: Vec::new(),
            turn: None,
        };
        let w = PreparedWorkload::prepare(&[r.clone(), r], 512, 16, 1.0);
        assert_eq!(w.requests[0].prompt.full_blocks(), 4);
        assert_ne!(
            w.requests[0].prompt.sequence_hashes()[0],
            w.requests[1].prompt.sequence_hashes()[0]
        );
    }

    #[test]
    fn real_prompts_hash_as_the_servers_hash_them() {
        let prompt = Prompt::tokens((0..40).collect());
        let w = PreparedWorkload::from_prompts(
            &[PromptRequest {
                arrival: Duration::from_millis(5),
                prompt: prompt.clone(),
                max_tokens: 3,
                priority: Priority::Premium,
            }],
            16,
        )
        .expect("valid prompt");
        assert_eq!(
            w.requests[0].prompt,
            blocks_for(&prompt, 16).expect("valid")
        );
        assert_eq!(w.requests[0].priority, Priority::Premium);
    }
}
