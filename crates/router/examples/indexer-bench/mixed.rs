//! Mixed replay: the Mooncake trace routed by the `kv` policy, each worker an LRU cache
//! emitting Stored events (one per prefill chunk of new blocks) and Removed events (one per
//! eviction batch), with one lookup per request interleaved.
//!
//! The operation stream (lookups and events) is generated first with a routing indexer,
//! then replayed alone into a fresh indexer and timed op by op.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::hint::black_box;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use hashlink::LinkedHashMap;
use rustc_hash::FxBuildHasher;
use serde::Serialize;
use switchyard_core::hash::sequence_hashes;
use switchyard_core::trace::{MOONCAKE_BLOCK_SIZE, MooncakeRecord};
use switchyard_core::{
    KvEvent, KvEventData, RequestId, SequenceHash, StorageTier, StoredBlock, WorkerKey,
};
use switchyard_router::{
    Indexer, IndexerConfig, OverlapScores, PolicyKind, RouteRequest, Router, RouterConfig,
    RoutingOverrides,
};

use crate::latency::{Samples, Summary};
use crate::query::{Lookup, Query};

#[derive(Debug, Clone, Serialize)]
pub struct MixedReport {
    pub requests: usize,
    pub workers: u32,
    pub block_size: u32,
    pub cache_blocks: usize,
    pub chunk_tokens: u32,
    pub lookups: usize,
    pub events: usize,
    pub blocks: usize,
    pub ops_per_sec: f64,
    /// Blocks of lookups and events over the replay's time.
    pub blocks_per_sec: f64,
    /// Blocks of events over the time spent applying events.
    pub event_blocks_per_sec: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub lookup_p99_us: f64,
    pub lookup_mean_us: f64,
    pub event_p99_us: f64,
    /// Share of prompt tokens found cached on the chosen worker.
    pub routed_cache_hit_rate: f64,
    pub replay_seconds: f64,
    /// Every timed pass, fastest first.
    pub passes: Vec<PassSummary>,
}

/// One timed pass of the replay.
#[derive(Debug, Clone, Serialize)]
pub struct PassSummary {
    pub ops_per_sec: f64,
    pub blocks_per_sec: f64,
    /// Blocks over the time the replaying thread was on a CPU: on a shared machine, the
    /// figure least disturbed by other processes taking the CPU.
    pub blocks_per_cpu_sec: f64,
    pub event_blocks_per_sec: f64,
    pub lookup_p99_us: f64,
    pub lookup_mean_us: f64,
    pub event_p99_us: f64,
}

pub enum Op {
    Lookup(Query),
    Event(KvEvent),
}

/// The operations of a routed trace, in arrival order.
pub struct OpStream {
    pub ops: Vec<Op>,
    pub workers: Vec<WorkerKey>,
    pub requests: usize,
    /// Share of prompt tokens found cached on the chosen worker.
    pub routed_cache_hit_rate: f64,
}

/// A worker's cache: least recently used first; a request touches its blocks last to first
/// so prefixes outlive their tails.
struct LruCache {
    blocks: LinkedHashMap<SequenceHash, (), FxBuildHasher>,
    next_event_id: u64,
}

pub fn generate(
    trace: &Path,
    workers: u32,
    block_size: u32,
    capacity: usize,
    chunk_tokens: u32,
    seed: u64,
) -> Result<OpStream> {
    let text = std::fs::read_to_string(trace)
        .with_context(|| format!("cannot read trace {}", trace.display()))?;
    let records = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(i, l)| {
            MooncakeRecord::parse(l)
                .with_context(|| format!("{}:{}: invalid trace row", trace.display(), i + 1))
        })
        .collect::<Result<Vec<_>>>()?;

    let keys: Vec<WorkerKey> = (0..workers)
        .map(|w| WorkerKey::new(u64::from(w), 0))
        .collect();
    let mut router = Router::new(RouterConfig {
        block_size,
        policy: PolicyKind::Kv,
        seed,
        ..RouterConfig::default()
    });
    for &k in &keys {
        router.add_worker(k);
    }
    let mut routing_index = Indexer::new(IndexerConfig::default());
    let mut caches: Vec<LruCache> = keys
        .iter()
        .map(|_| LruCache {
            blocks: LinkedHashMap::with_hasher(FxBuildHasher),
            next_event_id: 0,
        })
        .collect();
    let mut completions: BinaryHeap<Reverse<(u64, u64)>> = BinaryHeap::new();
    let mut ops = Vec::with_capacity(records.len() * 3);
    let (mut cached_tokens, mut prompt_tokens) = (0u64, 0u64);

    for (i, record) in records.iter().enumerate() {
        let now_ms = record.timestamp;
        while let Some(&Reverse((done, id))) = completions.peek() {
            if done > now_ms {
                break;
            }
            completions.pop();
            router.free(RequestId(id));
        }
        let locals = record.engine_block_hashes(MOONCAKE_BLOCK_SIZE, block_size);
        let seqs = sequence_hashes(&locals);
        let overlaps = routing_index.find_matches(&locals);
        ops.push(Op::Lookup(Query {
            locals: locals.clone(),
            seqs: seqs.clone(),
        }));
        let request = RouteRequest {
            id: RequestId(i as u64),
            isl_tokens: record.input_length,
            seq_hashes: &seqs,
            overrides: RoutingOverrides::default(),
        };
        let decision = router.route(&request, &overlaps, Duration::from_millis(now_ms))?;
        cached_tokens += u64::from(decision.overlap_blocks) * u64::from(block_size);
        prompt_tokens += record.input_length;
        // A rough service time: prefill at 10k tokens/s, decode at 20 ms per token.
        let service_ms = decision.prefill_tokens / 10 + record.output_length * 20;
        completions.push(Reverse((now_ms + service_ms, i as u64)));

        let worker = decision.worker;
        let cache = &mut caches[worker.worker_id.0 as usize];
        let held = seqs.partition_point(|h| cache.blocks.contains_key(h));
        let mut events = Vec::new();
        // New blocks are stored one prefill chunk at a time, as an engine with chunked
        // prefill reports them.
        let chunk_blocks = (chunk_tokens / block_size).max(1) as usize;
        let mut start = held;
        while start < seqs.len() {
            let end = (start + chunk_blocks).min(seqs.len());
            cache.next_event_id += 1;
            let blocks = (start..end)
                .map(|j| StoredBlock {
                    seq_hash: seqs[j],
                    local_hash: locals[j],
                })
                .collect();
            let parent = start.checked_sub(1).map(|j| seqs[j]);
            events.push(event(
                worker,
                cache.next_event_id,
                KvEventData::Stored { parent, blocks },
            ));
            start = end;
        }
        for &h in seqs.iter().rev() {
            cache.blocks.insert(h, ());
        }
        let mut evicted = Vec::new();
        while cache.blocks.len() > capacity {
            if let Some((h, ())) = cache.blocks.pop_front() {
                evicted.push(h);
            }
        }
        if !evicted.is_empty() {
            cache.next_event_id += 1;
            events.push(event(
                worker,
                cache.next_event_id,
                KvEventData::Removed {
                    seq_hashes: evicted,
                },
            ));
        }
        for e in events {
            routing_index.apply(&e);
            ops.push(Op::Event(e));
        }
    }

    Ok(OpStream {
        ops,
        workers: keys,
        requests: records.len(),
        routed_cache_hit_rate: cached_tokens as f64 / prompt_tokens.max(1) as f64,
    })
}

/// The timed replay: how lookups are made, and how many passes.
#[derive(Debug, Clone, Copy)]
pub struct Replay {
    pub lookup: Lookup,
    pub passes: usize,
}

pub fn run(
    trace: &Path,
    workers: u32,
    block_size: u32,
    capacity: usize,
    chunk_tokens: u32,
    seed: u64,
    how: Replay,
) -> Result<MixedReport> {
    let Replay { lookup, passes } = how;
    let stream = generate(trace, workers, block_size, capacity, chunk_tokens, seed)?;
    let (ops, keys) = (&stream.ops, &stream.workers);
    // Each timed replay follows an untimed one whose workers are then removed: the measured
    // pass runs on warm memory, as in a long-running indexer, instead of paying first-touch
    // page faults.
    let mut indexer = Indexer::new(IndexerConfig::default());
    let mut scores = OverlapScores::default();
    for op in ops {
        match op {
            Op::Lookup(q) => {
                lookup.find(&indexer, q, &mut scores);
                black_box(&scores);
            }
            Op::Event(e) => {
                indexer.apply(e);
            }
        }
    }
    let mut timed = Vec::with_capacity(passes.max(1));
    for _ in 0..passes.max(1) {
        for &worker in keys {
            indexer.remove_worker(worker);
        }
        timed.push(replay(&mut indexer, ops, lookup));
    }
    // On a shared machine a pass can lose time to other processes: the report is the pass
    // of median length, with every pass's figures beside it.
    timed.sort_by(|a, b| a.seconds.total_cmp(&b.seconds));
    let summaries: Vec<PassSummary> = timed.iter().map(|p| p.summary(ops.len())).collect();
    let median = &timed[timed.len() / 2];
    Ok(MixedReport {
        requests: stream.requests,
        workers,
        block_size,
        cache_blocks: capacity,
        chunk_tokens,
        lookups: median.lookups.len(),
        events: median.events.len(),
        blocks: median.blocks,
        ops_per_sec: ops.len() as f64 / median.seconds,
        blocks_per_sec: median.blocks as f64 / median.seconds,
        event_blocks_per_sec: median.event_blocks_per_sec(),
        p50_us: median.all.p50_us,
        p99_us: median.all.p99_us,
        lookup_p99_us: median.lookups.summary.p99_us,
        lookup_mean_us: median.lookups.summary.mean_us,
        event_p99_us: median.events.summary.p99_us,
        routed_cache_hit_rate: stream.routed_cache_hit_rate,
        replay_seconds: median.seconds,
        passes: summaries,
    })
}

/// One timed replay.
struct Pass {
    seconds: f64,
    /// The time this thread was on a CPU (the wall time where the system does not say).
    cpu_seconds: f64,
    blocks: usize,
    event_blocks: usize,
    all: Summary,
    lookups: Timed,
    events: Timed,
}

/// Samples of one kind of operation: their count, total time and percentiles.
struct Timed {
    count: usize,
    total_ns: u64,
    summary: Summary,
}

impl Timed {
    fn of(samples: Samples) -> Self {
        Timed {
            count: samples.len(),
            total_ns: samples.total(),
            summary: samples.summarize(),
        }
    }

    fn len(&self) -> usize {
        self.count
    }
}

impl Pass {
    /// Blocks of events over the time spent applying events alone.
    fn event_blocks_per_sec(&self) -> f64 {
        self.event_blocks as f64 / (self.events.total_ns.max(1) as f64 / 1e9)
    }

    fn summary(&self, ops: usize) -> PassSummary {
        PassSummary {
            ops_per_sec: ops as f64 / self.seconds,
            blocks_per_sec: self.blocks as f64 / self.seconds,
            blocks_per_cpu_sec: self.blocks as f64 / self.cpu_seconds,
            event_blocks_per_sec: self.event_blocks_per_sec(),
            lookup_p99_us: self.lookups.summary.p99_us,
            lookup_mean_us: self.lookups.summary.mean_us,
            event_p99_us: self.events.summary.p99_us,
        }
    }
}

fn replay(indexer: &mut Indexer, ops: &[Op], lookup: Lookup) -> Pass {
    let mut scores = OverlapScores::default();
    let (mut all, mut lookups, mut events) = (
        Samples::with_capacity(ops.len()),
        Samples::default(),
        Samples::default(),
    );
    let (mut blocks, mut event_blocks) = (0usize, 0usize);
    let cpu = thread_cpu_ns();
    let start = Instant::now();
    for op in ops {
        let t = Instant::now();
        match op {
            Op::Lookup(q) => {
                lookup.find(indexer, q, &mut scores);
                black_box(&scores);
                let ns = t.elapsed().as_nanos() as u64;
                all.push(ns);
                lookups.push(ns);
                blocks += q.len();
            }
            Op::Event(e) => {
                indexer.apply(e);
                let ns = t.elapsed().as_nanos() as u64;
                all.push(ns);
                events.push(ns);
                blocks += e.block_count();
                event_blocks += e.block_count();
            }
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    let cpu_seconds = match (cpu, thread_cpu_ns()) {
        (Some(a), Some(b)) => b.saturating_sub(a) as f64 / 1e9,
        _ => seconds,
    };
    Pass {
        seconds,
        cpu_seconds,
        blocks,
        event_blocks,
        all: all.summarize(),
        lookups: Timed::of(lookups),
        events: Timed::of(events),
    }
}

fn event(worker: WorkerKey, event_id: u64, data: KvEventData) -> KvEvent {
    KvEvent {
        worker_id: worker.worker_id,
        dp_rank: worker.dp_rank,
        event_id,
        tier: StorageTier::Device,
        data,
    }
}

/// Nanoseconds this thread has run on a CPU, from Linux's scheduler statistics.
fn thread_cpu_ns() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    text.split_whitespace().next()?.parse().ok()
}
