//! `least-loaded`: the worker with the fewest active blocks.

use rand::rngs::SmallRng;

use super::choice::{argmin_all, pick};
use super::{Policy, PolicyKind, Selection};

/// The worker with the fewest active blocks (then fewest requests, then at random).
#[derive(Debug, Clone, Default)]
pub struct LeastLoaded;

impl Policy for LeastLoaded {
    fn kind(&self) -> PolicyKind {
        PolicyKind::LeastLoaded
    }

    fn select(&mut self, s: &Selection<'_>, rng: &mut SmallRng) -> Option<usize> {
        pick(
            &argmin_all(s.candidates, |c| (c.active_blocks, c.active_requests)),
            rng,
        )
    }
}
