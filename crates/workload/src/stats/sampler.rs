//! Drawing from an empirical distribution, with or without replacement.

use rand::Rng;
use serde::{Deserialize, Serialize};

use super::Cdf;

/// How a [`Sampler`] draws.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Sampling {
    /// Without replacement from the observed counts, refilled when used up: every full
    /// round of draws has exactly the observed proportions. This removes the sampling noise
    /// of independent draws and their bias on shared structure (a shared block that two
    /// requests visited is missed entirely by 2 of 15 independent samplings of those
    /// requests, which inflates the reuse ratio).
    #[default]
    Stratified,
    /// Independent draws with the observed probabilities.
    Independent,
}

/// Draws outcomes of a [`Cdf`] in O(log n) each, keeping what is left in a Fenwick tree.
#[derive(Debug, Clone)]
pub struct Sampler<T> {
    outcomes: Vec<T>,
    counts: Vec<u64>,
    /// Fenwick (binary indexed) tree over the counts left, 1-based.
    tree: Vec<u64>,
    left: u64,
    sampling: Sampling,
}

impl<T: Copy> Sampler<T> {
    pub fn new(cdf: &Cdf<T>, sampling: Sampling) -> Self {
        let (outcomes, counts) = cdf.counts().unzip();
        let mut sampler = Self {
            outcomes,
            counts,
            tree: Vec::new(),
            left: 0,
            sampling,
        };
        sampler.refill();
        sampler
    }

    /// Draws one outcome; `None` when the distribution is empty.
    pub fn draw<R: Rng + ?Sized>(&mut self, rng: &mut R) -> Option<T> {
        if self.outcomes.is_empty() {
            return None;
        }
        if self.left == 0 {
            self.refill();
        }
        let index = self.find(rng.random_range(0..self.left));
        if self.sampling == Sampling::Stratified {
            self.take(index);
        }
        self.outcomes.get(index).copied()
    }

    fn refill(&mut self) {
        let n = self.counts.len();
        self.tree = vec![0; n + 1];
        for i in 1..=n {
            self.tree[i] += self.counts[i - 1];
            let parent = i + (i & i.wrapping_neg());
            if parent <= n {
                self.tree[parent] += self.tree[i];
            }
        }
        self.left = self.counts.iter().sum();
    }

    /// The 0-based outcome whose cumulative range holds `target` (< `left`).
    fn find(&self, mut target: u64) -> usize {
        let n = self.tree.len() - 1;
        let mut position = 0;
        let mut step = n.next_power_of_two();
        while step > 0 {
            let next = position + step;
            if next <= n && self.tree[next] <= target {
                position = next;
                target -= self.tree[next];
            }
            step /= 2;
        }
        position.min(n.saturating_sub(1))
    }

    fn take(&mut self, index: usize) {
        let n = self.tree.len() - 1;
        let mut i = index + 1;
        while i <= n {
            self.tree[i] -= 1;
            i += i & i.wrapping_neg();
        }
        self.left -= 1;
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    use super::*;

    fn tally(sampler: &mut Sampler<usize>, draws: usize, rng: &mut StdRng) -> Vec<u64> {
        let mut seen = vec![0u64; 6];
        for _ in 0..draws {
            seen[sampler.draw(rng).unwrap()] += 1;
        }
        seen
    }

    #[test]
    fn stratified_rounds_have_exact_counts() {
        let cdf = Cdf::from_counts([(0usize, 3), (1, 1), (2, 7), (3, 0), (4, 2), (5, 5)]);
        let mut sampler = Sampler::new(&cdf, Sampling::Stratified);
        let mut rng = StdRng::seed_from_u64(11);
        // Two full rounds: the second starts from a refill.
        assert_eq!(tally(&mut sampler, 18, &mut rng), vec![3, 1, 7, 0, 2, 5]);
        assert_eq!(tally(&mut sampler, 18, &mut rng), vec![3, 1, 7, 0, 2, 5]);
    }

    #[test]
    fn independent_draws_follow_the_probabilities() {
        let cdf = Cdf::from_counts([(0usize, 1), (1, 3)]);
        let mut sampler = Sampler::new(&cdf, Sampling::Independent);
        let mut rng = StdRng::seed_from_u64(5);
        let seen = tally(&mut sampler, 40_000, &mut rng);
        let share = seen[1] as f64 / 40_000.0;
        assert!((share - 0.75).abs() < 0.01, "share {share}");
    }

    #[test]
    fn empty_distribution_draws_nothing() {
        let mut sampler = Sampler::new(&Cdf::<u8>::from_counts([]), Sampling::Stratified);
        assert_eq!(sampler.draw(&mut StdRng::seed_from_u64(1)), None);
    }
}
