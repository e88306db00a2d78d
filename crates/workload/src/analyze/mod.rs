//! The structure of a Mooncake-style hash trace: arrivals, lengths, block reuse and the shape
//! of its shared-prefix tree.

mod compare;
mod report;
pub mod sessions;

use std::collections::HashSet;
use std::time::Duration;

use serde::Serialize;
use switchyard_core::trace::MooncakeRecord;

pub use compare::{Comparison, ComparisonRow};

use crate::prefix::{CoreTree, PrefixTrie};
use crate::stats::Summary;
use crate::trace_io::{RecordError, Trace, TraceError};
use crate::units::serialize_ms;

/// What `switchyard synth analyze` reports.
#[derive(Debug, Clone, Serialize)]
pub struct TraceAnalysis {
    pub requests: usize,
    /// Tokens per hash id.
    pub block_size: u32,
    /// From the first arrival to the last.
    #[serde(rename = "duration_ms", serialize_with = "serialize_ms")]
    pub duration: Duration,
    /// Requests per second over the whole trace.
    pub mean_rate: f64,
    pub arrival_rate: ArrivalRate,
    pub inter_arrival_ms: Summary,
    pub input_length: Summary,
    pub output_length: Summary,
    pub blocks: BlockReuse,
    pub core_tree: CoreTreeShape,
    pub unique_prompts: UniquePrompts,
    /// Sessions recovered from the prefix chains (see [`sessions`]).
    pub sessions: sessions::SessionShape,
}

/// Arrivals counted in fixed windows from the first request.
#[derive(Debug, Clone, Serialize)]
pub struct ArrivalRate {
    #[serde(rename = "window_ms", serialize_with = "serialize_ms")]
    pub window: Duration,
    /// Requests arriving in each window.
    pub requests: Vec<usize>,
}

/// How often hash ids repeat across requests.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct BlockReuse {
    /// Hash ids over all requests, repeats included.
    pub total: u64,
    pub distinct: u64,
    /// `1 - distinct / total`: the share of blocks some other request also sent.
    pub reuse_ratio: f64,
}

/// Size and depth of the shared-prefix (core) tree.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct CoreTreeShape {
    /// Blocks visited by two or more requests.
    pub blocks: u64,
    pub radix_nodes: usize,
    /// Distinct first shared runs (prefix families).
    pub roots: usize,
    pub max_depth_blocks: u64,
    pub max_depth_nodes: u32,
    /// Shared blocks at the start of each request's prompt.
    pub shared_blocks_per_request: Summary,
}

/// The unique part of prompts: blocks after the last shared one.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct UniquePrompts {
    /// Requests that continue past the core tree with blocks of their own.
    pub requests: usize,
    /// Requests whose whole prompt is shared with another request.
    pub ending_in_core: usize,
    /// Unique blocks of the requests that have any.
    pub length_blocks: Summary,
}

impl TraceAnalysis {
    /// Analyses records (in arrival order or not; timestamps are sorted for rates).
    pub fn of(records: &[MooncakeRecord], block_size: u32) -> Result<Self, RecordError> {
        let trie = PrefixTrie::build(records)?;
        let core = CoreTree::from_trie(&trie);

        let mut stamps: Vec<u64> = records.iter().map(|r| r.timestamp).collect();
        stamps.sort_unstable();
        let first = stamps.first().copied().unwrap_or(0);
        let duration = Duration::from_millis(stamps.last().copied().unwrap_or(0) - first);
        let gaps = stamps.windows(2).map(|w| (w[1] - w[0]) as f64);

        let total: u64 = records.iter().map(|r| r.hash_ids.len() as u64).sum();
        let distinct = records
            .iter()
            .flat_map(|r| r.hash_ids.iter().copied())
            .collect::<HashSet<u64>>()
            .len() as u64;

        let splits: Vec<(usize, usize)> = records.iter().map(|r| trie.split(&r.hash_ids)).collect();
        let recovered = sessions::recover(records, block_size);
        let tails = splits.iter().filter(|s| s.1 > 0).map(|s| s.1 as f64);

        Ok(Self {
            requests: records.len(),
            block_size,
            duration,
            mean_rate: if duration.is_zero() {
                0.0
            } else {
                records.len() as f64 / duration.as_secs_f64()
            },
            arrival_rate: ArrivalRate::of(&stamps, duration),
            inter_arrival_ms: Summary::of(gaps).unwrap_or_default(),
            input_length: Summary::of(records.iter().map(|r| r.input_length as f64))
                .unwrap_or_default(),
            output_length: Summary::of(records.iter().map(|r| r.output_length as f64))
                .unwrap_or_default(),
            blocks: BlockReuse {
                total,
                distinct,
                reuse_ratio: if total == 0 {
                    0.0
                } else {
                    1.0 - distinct as f64 / total as f64
                },
            },
            core_tree: CoreTreeShape {
                blocks: core.blocks(),
                radix_nodes: core.radix_nodes(),
                roots: core.roots(),
                max_depth_blocks: core.max_depth_blocks(),
                max_depth_nodes: core.max_depth_nodes(),
                shared_blocks_per_request: Summary::of(splits.iter().map(|s| s.0 as f64))
                    .unwrap_or_default(),
            },
            unique_prompts: UniquePrompts {
                requests: splits.iter().filter(|s| s.1 > 0).count(),
                ending_in_core: splits.iter().filter(|s| s.1 == 0).count(),
                length_blocks: Summary::of(tails).unwrap_or_default(),
            },
            sessions: sessions::SessionShape::of(records, &recovered),
        })
    }
}

impl TraceAnalysis {
    /// Analyses a trace file's records; record problems name the file line.
    pub fn of_trace(trace: &Trace, block_size: u32) -> Result<Self, TraceError> {
        Self::of(&trace.records, block_size).map_err(|e| trace.locate(e))
    }

    /// The analysis as pretty-printed JSON (durations in milliseconds).
    pub fn to_json(&self) -> Result<String, serde_json::Error> {
        serde_json::to_string_pretty(self)
    }
}

impl ArrivalRate {
    /// Window sizes a reader can take in at a glance; the smallest giving at most 24 rows.
    const WINDOWS: [Duration; 8] = [
        Duration::from_secs(1),
        Duration::from_secs(10),
        Duration::from_secs(60),
        Duration::from_secs(300),
        Duration::from_secs(600),
        Duration::from_secs(1800),
        Duration::from_secs(3600),
        Duration::from_secs(6 * 3600),
    ];
    const MAX_WINDOWS: u128 = 24;

    fn of(sorted_stamps: &[u64], duration: Duration) -> Self {
        let window = Self::WINDOWS
            .into_iter()
            .find(|w| duration.as_millis() / w.as_millis() < Self::MAX_WINDOWS)
            .unwrap_or(Duration::from_secs(24 * 3600));
        let width = window.as_millis() as u64;
        let first = sorted_stamps.first().copied().unwrap_or(0);
        let slots = (duration.as_millis() as u64 / width + 1) as usize;
        let mut requests = vec![0; slots];
        for &stamp in sorted_stamps {
            let slot = ((stamp - first) / width) as usize;
            if let Some(count) = requests.get_mut(slot) {
                *count += 1;
            }
        }
        Self { window, requests }
    }

    /// Requests per second in each window.
    pub fn rates(&self) -> impl Iterator<Item = f64> + '_ {
        let secs = self.window.as_secs_f64();
        self.requests.iter().map(move |&n| n as f64 / secs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(timestamp: u64, input_length: u64, ids: &[u64]) -> MooncakeRecord {
        MooncakeRecord {
            media: Vec::new(),
            timestamp,
            input_length,
            output_length: 10,
            hash_ids: ids.to_vec(),
            ..MooncakeRecord::default()
        }
    }

    #[test]
    fn reports_reuse_tree_and_unique_tails() {
        let rows = [
            row(0, 1500, &[0, 1, 2]),
            row(1000, 1100, &[0, 1, 3]),
            row(3000, 500, &[0]),
            row(2000, 2000, &[4, 5, 6, 7]),
        ];
        let a = TraceAnalysis::of(&rows, 512).unwrap();
        assert_eq!(a.requests, 4);
        assert_eq!(a.duration, Duration::from_secs(3));
        assert_eq!((a.blocks.total, a.blocks.distinct), (11, 8));
        assert!((a.blocks.reuse_ratio - 3.0 / 11.0).abs() < 1e-12);
        assert_eq!((a.core_tree.blocks, a.core_tree.radix_nodes), (2, 2));
        assert_eq!(a.core_tree.roots, 1);
        assert_eq!(a.unique_prompts.requests, 3);
        assert_eq!(a.unique_prompts.ending_in_core, 1);
        assert_eq!(a.unique_prompts.length_blocks.max, 4.0);
        assert_eq!(a.inter_arrival_ms.mean, 1000.0);
        assert_eq!(a.arrival_rate.window, Duration::from_secs(1));
        assert_eq!(a.arrival_rate.requests, vec![1, 1, 1, 1]);
    }
}
