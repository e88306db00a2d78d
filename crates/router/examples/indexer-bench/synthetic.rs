//! A large synthetic index with realistic prefix sharing.
//!
//! Sequences are a system prompt (64 of them, Zipf-popular), sometimes a shared document
//! (2,048, Zipf-popular), then a unique tail. Workers take sequences in turn until the
//! index holds the requested number of distinct blocks.

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rustc_hash::FxHashSet;
use serde::Serialize;
use switchyard_core::hash::sequence_hashes;
use switchyard_core::{KvEvent, KvEventData, LocalBlockHash, StorageTier, StoredBlock, WorkerId};
use switchyard_router::indexer::shared::SharedIndexer;
use switchyard_router::{Indexer, IndexerConfig, OverlapScores};

use crate::latency::{QueryLatency, Samples};
use crate::query::{Lookup, Query};

pub struct Synthetic {
    pub workers: u32,
    pub events: Vec<KvEvent>,
    pub sequences: Vec<Vec<LocalBlockHash>>,
    system_prompts: Vec<Vec<LocalBlockHash>>,
}

struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    fn new(n: usize) -> Self {
        let mut acc = 0.0;
        let cdf = (0..n)
            .map(|i| {
                acc += 1.0 / (i as f64 + 1.0);
                acc
            })
            .collect();
        Zipf { cdf }
    }

    fn sample(&self, rng: &mut SmallRng) -> usize {
        let total = self.cdf.last().copied().unwrap_or(1.0);
        let x = rng.random::<f64>() * total;
        self.cdf.partition_point(|&c| c < x).min(self.cdf.len() - 1)
    }
}

fn random_blocks(rng: &mut SmallRng, len: usize) -> Vec<LocalBlockHash> {
    (0..len).map(|_| LocalBlockHash(rng.random())).collect()
}

fn stored_event(worker: u32, event_id: u64, path: &[LocalBlockHash]) -> KvEvent {
    let blocks = path
        .iter()
        .zip(sequence_hashes(path))
        .map(|(&local_hash, seq_hash)| StoredBlock {
            seq_hash,
            local_hash,
        })
        .collect();
    KvEvent {
        worker_id: WorkerId(u64::from(worker)),
        dp_rank: 0,
        event_id,
        tier: StorageTier::Device,
        data: KvEventData::Stored {
            parent: None,
            blocks,
        },
    }
}

pub fn build(workers: u32, target_blocks: usize, seed: u64) -> Synthetic {
    let mut rng = SmallRng::seed_from_u64(seed);
    let system_prompts: Vec<_> = (0..64)
        .map(|_| {
            let n = rng.random_range(8..=64);
            random_blocks(&mut rng, n)
        })
        .collect();
    let documents: Vec<_> = (0..2048)
        .map(|_| {
            let n = rng.random_range(16..=128);
            random_blocks(&mut rng, n)
        })
        .collect();
    let (zipf_sys, zipf_doc) = (Zipf::new(system_prompts.len()), Zipf::new(documents.len()));
    let mut distinct: FxHashSet<_> = FxHashSet::default();
    let mut events = Vec::new();
    let mut sequences = Vec::new();
    let mut next_id = vec![0u64; workers as usize];
    let mut worker = 0u32;
    while distinct.len() < target_blocks {
        let mut path = system_prompts[zipf_sys.sample(&mut rng)].clone();
        if rng.random_bool(0.4) {
            path.extend_from_slice(&documents[zipf_doc.sample(&mut rng)]);
        }
        let tail = rng.random_range(32..=480);
        path.extend(random_blocks(&mut rng, tail));
        distinct.extend(sequence_hashes(&path));
        next_id[worker as usize] += 1;
        events.push(stored_event(worker, next_id[worker as usize], &path));
        sequences.push(path);
        worker = (worker + 1) % workers.max(1);
    }
    Synthetic {
        workers,
        events,
        sequences,
        system_prompts,
    }
}

pub struct Ingest {
    pub indexer: Indexer,
    pub blocks: usize,
    pub worker_blocks: u64,
    pub blocks_per_sec: f64,
    pub events_per_sec: f64,
    pub remove_blocks_per_sec: f64,
}

pub fn measure_ingest(synth: &Synthetic) -> Ingest {
    let total_blocks: usize = synth.events.iter().map(KvEvent::block_count).sum();
    let mut indexer = Indexer::new(IndexerConfig::default());
    let start = Instant::now();
    for event in &synth.events {
        indexer.apply(event);
    }
    let elapsed = start.elapsed().as_secs_f64();

    // Removal: the blocks of a quarter of the sequences, from a separate index.
    let quarter = synth.events.len() / 4;
    let mut scratch = Indexer::new(IndexerConfig::default());
    for event in &synth.events[..quarter] {
        scratch.apply(event);
    }
    let removals: Vec<KvEvent> = synth.events[..quarter]
        .iter()
        .map(|e| {
            let KvEventData::Stored { blocks, .. } = &e.data else {
                unreachable!("synthetic events are stores")
            };
            KvEvent {
                event_id: e.event_id + 1_000_000,
                data: KvEventData::Removed {
                    seq_hashes: blocks.iter().rev().map(|b| b.seq_hash).collect(),
                },
                ..e.clone()
            }
        })
        .collect();
    let removed_blocks: usize = removals.iter().map(KvEvent::block_count).sum();
    let start = Instant::now();
    for event in &removals {
        scratch.apply(event);
    }
    let remove_elapsed = start.elapsed().as_secs_f64();

    Ingest {
        blocks: indexer.block_count(),
        worker_blocks: indexer.worker_block_count(),
        blocks_per_sec: total_blocks as f64 / elapsed,
        events_per_sec: synth.events.len() as f64 / elapsed,
        remove_blocks_per_sec: removed_blocks as f64 / remove_elapsed,
        indexer,
    }
}

/// A query of exactly `len` blocks: a stored sequence's first blocks, padded with blocks no
/// worker has when the sequence is shorter.
fn query(synth: &Synthetic, rng: &mut SmallRng, len: usize) -> Query {
    let seq = &synth.sequences[rng.random_range(0..synth.sequences.len())];
    let mut q: Vec<_> = seq.iter().take(len).copied().collect();
    let pad = len - q.len();
    q.extend(random_blocks(rng, pad));
    Query::new(q)
}

/// Lookup latency by query length. An empty query walks nothing: its time is the answer
/// alone (every worker's cached count, in key order); one block adds the scores of the
/// workers holding a popular first block.
pub fn measure_find_matches(
    indexer: &Indexer,
    synth: &Synthetic,
    n: usize,
    seed: u64,
    lookup: Lookup,
) -> Vec<QueryLatency> {
    let mut rng = SmallRng::seed_from_u64(seed ^ 0xf1d);
    [0usize, 1, 32, 128, 512]
        .into_iter()
        .map(|len| {
            let queries: Vec<_> = (0..n).map(|_| query(synth, &mut rng, len)).collect();
            let mut scores = OverlapScores::default();
            for q in queries.iter().take(1000) {
                lookup.find(indexer, q, &mut scores);
                black_box(&scores);
            }
            let mut samples = Samples::with_capacity(n);
            let mut best_total = 0u64;
            for q in &queries {
                let start = Instant::now();
                lookup.find(indexer, q, &mut scores);
                samples.push(start.elapsed().as_nanos() as u64);
                best_total += u64::from(scores.best());
            }
            let s = samples.summarize();
            QueryLatency {
                query_blocks: len,
                p50_us: s.p50_us,
                p99_us: s.p99_us,
                mean_us: s.mean_us,
                mean_best_overlap: best_total as f64 / n.max(1) as f64,
            }
        })
        .collect()
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct ConcurrentReport {
    pub seconds: f64,
    pub lookups: usize,
    pub find_matches_p50_us: f64,
    pub find_matches_p99_us: f64,
    pub find_matches_max_us: f64,
    pub ingest_blocks_per_sec: f64,
}

/// One thread looks up 128-block queries while another stores and removes sequences.
pub fn measure_concurrent(
    indexer: Indexer,
    synth: &Synthetic,
    duration: Duration,
    seed: u64,
    lookup: Lookup,
) -> ConcurrentReport {
    let mut rng = SmallRng::seed_from_u64(seed ^ 0xc0c);
    // Churn: store a fresh 32-block tail under a system prompt, remove it 64 events later.
    let pairs = (duration.as_secs_f64() * 60_000.0) as usize + 1000;
    let mut churn = Vec::with_capacity(pairs * 2);
    let mut next_id = vec![10_000_000u64; synth.workers as usize];
    let mut pending = std::collections::VecDeque::new();
    for _ in 0..pairs {
        let worker = rng.random_range(0..synth.workers.max(1));
        let mut path =
            synth.system_prompts[rng.random_range(0..synth.system_prompts.len())].clone();
        path.extend(random_blocks(&mut rng, 32));
        next_id[worker as usize] += 1;
        let stored = stored_event(worker, next_id[worker as usize], &path);
        let KvEventData::Stored { blocks, .. } = &stored.data else {
            unreachable!("built as a store")
        };
        let tail: Vec<_> = blocks[blocks.len() - 32..]
            .iter()
            .rev()
            .map(|b| b.seq_hash)
            .collect();
        churn.push(stored);
        pending.push_back((worker, tail));
        if pending.len() > 64
            && let Some((w, seq_hashes)) = pending.pop_front()
        {
            next_id[w as usize] += 1;
            churn.push(KvEvent {
                worker_id: WorkerId(u64::from(w)),
                dp_rank: 0,
                event_id: next_id[w as usize],
                tier: StorageTier::Device,
                data: KvEventData::Removed { seq_hashes },
            });
        }
    }
    let queries: Vec<_> = (0..4096).map(|_| query(synth, &mut rng, 128)).collect();

    let shared = Arc::new(SharedIndexer::new(indexer));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (shared, stop) = (Arc::clone(&shared), Arc::clone(&stop));
        std::thread::spawn(move || {
            let start = Instant::now();
            let mut blocks = 0usize;
            for chunk in churn.chunks(64) {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                shared.apply_all(chunk.iter().cloned());
                blocks += chunk.iter().map(KvEvent::block_count).sum::<usize>();
            }
            (blocks, start.elapsed().as_secs_f64())
        })
    };
    let mut samples = Samples::with_capacity(1 << 20);
    let mut scores = OverlapScores::default();
    let start = Instant::now();
    let mut i = 0;
    while start.elapsed() < duration {
        let q = &queries[i % queries.len()];
        let t = Instant::now();
        lookup.find_shared(&shared, q, &mut scores);
        black_box(&scores);
        samples.push(t.elapsed().as_nanos() as u64);
        i += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let (blocks, writer_secs) = writer.join().unwrap_or((0, 1.0));
    let lookups = samples.len();
    let s = samples.summarize();
    ConcurrentReport {
        seconds: duration.as_secs_f64(),
        lookups,
        find_matches_p50_us: s.p50_us,
        find_matches_p99_us: s.p99_us,
        find_matches_max_us: s.max_us,
        ingest_blocks_per_sec: blocks as f64 / writer_secs,
    }
}
