//! `round-robin`: each worker in turn.

use rand::rngs::SmallRng;

use super::{Policy, PolicyKind, Selection};

/// Each worker in turn.
#[derive(Debug, Clone, Default)]
pub struct RoundRobin {
    next: usize,
}

impl Policy for RoundRobin {
    fn kind(&self) -> PolicyKind {
        PolicyKind::RoundRobin
    }

    fn select(&mut self, s: &Selection<'_>, _rng: &mut SmallRng) -> Option<usize> {
        if s.candidates.is_empty() {
            return None;
        }
        let chosen = self.next % s.candidates.len();
        self.next = self.next.wrapping_add(1);
        Some(chosen)
    }
}
