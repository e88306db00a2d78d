//! `random`: a uniformly random worker.

use rand::Rng;
use rand::rngs::SmallRng;

use super::{Policy, PolicyKind, Selection};

/// A uniformly random worker.
#[derive(Debug, Clone, Default)]
pub struct RandomPolicy;

impl Policy for RandomPolicy {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Random
    }

    fn select(&mut self, s: &Selection<'_>, rng: &mut SmallRng) -> Option<usize> {
        (!s.candidates.is_empty()).then(|| rng.random_range(0..s.candidates.len()))
    }
}
