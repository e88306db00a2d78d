//! Empirical distributions held as cumulative counts.

use std::collections::BTreeMap;

use rand::Rng;
use serde::{Deserialize, Serialize};

/// An empirical (discrete) distribution held as a cumulative count per outcome: sampling
/// draws an outcome with probability count / total.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cdf<T> {
    outcomes: Vec<T>,
    cumulative: Vec<u64>,
}

impl<T: Copy> Cdf<T> {
    /// Builds from `(outcome, count)` pairs in the given order; zero counts are dropped.
    pub fn from_counts(counts: impl IntoIterator<Item = (T, u64)>) -> Self {
        let mut outcomes = Vec::new();
        let mut cumulative = Vec::new();
        let mut total = 0u64;
        for (outcome, count) in counts {
            if count == 0 {
                continue;
            }
            total += count;
            outcomes.push(outcome);
            cumulative.push(total);
        }
        Self {
            outcomes,
            cumulative,
        }
    }

    /// Total count; zero means the distribution is empty and cannot be sampled.
    pub fn total(&self) -> u64 {
        self.cumulative.last().copied().unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.outcomes.is_empty()
    }

    /// Draws one outcome; `None` when empty.
    pub fn sample<R: Rng + ?Sized>(&self, rng: &mut R) -> Option<T> {
        let total = self.total();
        if total == 0 {
            return None;
        }
        let draw = rng.random_range(0..total);
        let index = self.cumulative.partition_point(|&c| c <= draw);
        self.outcomes.get(index).copied()
    }

    /// Outcomes with their counts, in build order.
    pub fn counts(&self) -> impl Iterator<Item = (T, u64)> + '_ {
        let mut previous = 0;
        self.outcomes
            .iter()
            .zip(&self.cumulative)
            .map(move |(&outcome, &c)| {
                let count = c - previous;
                previous = c;
                (outcome, count)
            })
    }

    /// Outcomes with their probabilities, in build order.
    pub fn probabilities(&self) -> impl Iterator<Item = (T, f64)> + '_ {
        let total = self.total().max(1) as f64;
        self.counts()
            .map(move |(outcome, count)| (outcome, count as f64 / total))
    }
}

impl<T: Copy + Ord> Cdf<T> {
    /// The empirical distribution of observed values, outcomes in ascending order.
    pub fn of_values(values: impl IntoIterator<Item = T>) -> Self {
        let mut counts = BTreeMap::new();
        for value in values {
            *counts.entry(value).or_insert(0u64) += 1;
        }
        Self::from_counts(counts)
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    use super::*;

    #[test]
    fn samples_in_proportion_to_counts() {
        let cdf = Cdf::from_counts([('a', 1), ('b', 0), ('c', 3)]);
        assert_eq!(cdf.total(), 4);
        let mut rng = StdRng::seed_from_u64(7);
        let draws = 40_000;
        let c = (0..draws)
            .filter(|_| cdf.sample(&mut rng) == Some('c'))
            .count();
        let share = c as f64 / draws as f64;
        assert!((share - 0.75).abs() < 0.01, "share of c = {share}");
        let probabilities: Vec<_> = cdf.probabilities().collect();
        assert_eq!(probabilities, vec![('a', 0.25), ('c', 0.75)]);
        assert_eq!(cdf.counts().collect::<Vec<_>>(), vec![('a', 1), ('c', 3)]);
    }

    #[test]
    fn empty_distribution_samples_nothing() {
        let cdf: Cdf<u32> = Cdf::of_values([]);
        assert!(cdf.is_empty());
        assert_eq!(cdf.sample(&mut StdRng::seed_from_u64(1)), None);
    }
}
