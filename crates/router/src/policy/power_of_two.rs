//! `power-of-two`: the less loaded of two workers drawn at random.

use rand::Rng;
use rand::rngs::SmallRng;

use super::{Policy, PolicyKind, Selection};

/// Two workers at random; the one with fewer active blocks.
#[derive(Debug, Clone, Default)]
pub struct PowerOfTwo;

impl Policy for PowerOfTwo {
    fn kind(&self) -> PolicyKind {
        PolicyKind::PowerOfTwo
    }

    fn select(&mut self, s: &Selection<'_>, rng: &mut SmallRng) -> Option<usize> {
        let n = s.candidates.len();
        match n {
            0 => None,
            1 => Some(0),
            _ => {
                let a = rng.random_range(0..n);
                let b = (a + rng.random_range(1..n)) % n;
                let load = |i: usize| {
                    (
                        s.candidates[i].active_blocks,
                        s.candidates[i].active_requests,
                    )
                };
                Some(if load(b) < load(a) { b } else { a })
            }
        }
    }
}
