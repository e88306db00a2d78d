//! Summary statistics and empirical distributions shared by analysis, synthesis and the
//! benchmark report.

mod cdf;
mod sampler;

use serde::{Deserialize, Serialize};

pub use cdf::Cdf;
pub use sampler::{Sampler, Sampling};

/// Mean, extremes and the percentiles the reports show.
/// All zeros when there were no values.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub count: usize,
    pub mean: f64,
    pub min: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

impl Summary {
    /// Summarises `values`; `None` when there are none. NaNs are ignored.
    pub fn of(values: impl IntoIterator<Item = f64>) -> Option<Self> {
        let mut sorted: Vec<f64> = values.into_iter().filter(|v| !v.is_nan()).collect();
        sorted.sort_by(f64::total_cmp);
        Self::of_sorted(&sorted)
    }

    /// Summarises values already sorted ascending.
    pub fn of_sorted(sorted: &[f64]) -> Option<Self> {
        let (&min, &max) = (sorted.first()?, sorted.last()?);
        Some(Self {
            count: sorted.len(),
            mean: sorted.iter().sum::<f64>() / sorted.len() as f64,
            min,
            p50: percentile(sorted, 50.0),
            p90: percentile(sorted, 90.0),
            p99: percentile(sorted, 99.0),
            max,
        })
    }
}

/// The `q`-th percentile (0–100) of ascending `sorted`, interpolating linearly between the
/// two nearest ranks. Zero for an empty slice.
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    match sorted.len() {
        0 => 0.0,
        1 => sorted[0],
        n => {
            let rank = (q.clamp(0.0, 100.0) / 100.0) * (n - 1) as f64;
            let low = rank.floor() as usize;
            let high = (low + 1).min(n - 1);
            let frac = rank - low as f64;
            sorted[low] + (sorted[high] - sorted[low]) * frac
        }
    }
}

/// Relative difference `|a - b| / |b|`, or `|a|` when `b` is zero.
pub fn relative_diff(a: f64, b: f64) -> f64 {
    if b == 0.0 {
        a.abs()
    } else {
        ((a - b) / b).abs()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_interpolate_between_ranks() {
        let sorted = [1.0, 2.0, 3.0, 4.0, 5.0];
        assert_eq!(percentile(&sorted, 50.0), 3.0);
        assert!((percentile(&sorted, 90.0) - 4.6).abs() < 1e-12);
        assert_eq!(percentile(&sorted, 0.0), 1.0);
        assert_eq!(percentile(&sorted, 100.0), 5.0);
        assert_eq!(percentile(&[], 50.0), 0.0);
    }

    #[test]
    fn summary_ignores_order_and_nans() {
        let s = Summary::of([5.0, f64::NAN, 1.0, 3.0]).unwrap();
        assert_eq!(
            (s.count, s.min, s.max, s.mean, s.p50),
            (3, 1.0, 5.0, 3.0, 3.0)
        );
        assert!(Summary::of([]).is_none());
    }
}
