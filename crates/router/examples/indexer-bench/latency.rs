//! Latency samples and their percentiles.

use serde::Serialize;

/// Nanosecond samples.
#[derive(Debug, Default)]
pub struct Samples(Vec<u64>);

impl Samples {
    pub fn with_capacity(n: usize) -> Self {
        Samples(Vec::with_capacity(n))
    }

    pub fn push(&mut self, nanos: u64) {
        self.0.push(nanos);
    }

    pub fn extend(&mut self, other: Samples) {
        self.0.extend(other.0);
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// The sum of the samples, in nanoseconds.
    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }

    /// Sorts once; percentiles and mean in microseconds.
    pub fn summarize(mut self) -> Summary {
        self.0.sort_unstable();
        let n = self.0.len().max(1);
        let at = |p: f64| {
            self.0
                .get(
                    ((n as f64 * p).ceil() as usize)
                        .saturating_sub(1)
                        .min(n - 1),
                )
                .copied()
                .unwrap_or(0) as f64
                / 1e3
        };
        Summary {
            p50_us: at(0.50),
            p99_us: at(0.99),
            p999_us: at(0.999),
            max_us: self.0.last().copied().unwrap_or(0) as f64 / 1e3,
            mean_us: self.0.iter().sum::<u64>() as f64 / n as f64 / 1e3,
        }
    }
}

#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Summary {
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
    pub mean_us: f64,
}

/// find_matches latency for one query length.
#[derive(Debug, Clone, Serialize)]
pub struct QueryLatency {
    pub query_blocks: usize,
    pub p50_us: f64,
    pub p99_us: f64,
    pub mean_us: f64,
    /// Mean over queries of the best worker's match, to show the walks are deep.
    pub mean_best_overlap: f64,
}
