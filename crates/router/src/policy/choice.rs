//! Picking among candidates: the cheapest by cost (ties to the worker with more room, then
//! at random), a softmax sample over costs, the minimisers of a key.

use rand::Rng;
use rand::rngs::SmallRng;

use super::{Candidate, Selection};

/// The cheapest candidate, or with a temperature above 0 (the request's, else `temperature`)
/// a softmax sample over the costs.
pub fn choose(
    s: &Selection<'_>,
    costs: &[f64],
    temperature: f64,
    rng: &mut SmallRng,
) -> Option<usize> {
    let temperature = s.overrides.temperature.unwrap_or(temperature);
    if temperature > 0.0 {
        return Some(softmax_sample(costs, temperature, rng));
    }
    cheapest(s, costs, rng)
}

/// The cheapest candidate; ties to the worker with less cached (more room), then at random.
pub fn cheapest(s: &Selection<'_>, costs: &[f64], rng: &mut SmallRng) -> Option<usize> {
    let min = costs.iter().copied().fold(f64::INFINITY, f64::min);
    let cheapest: Vec<usize> = (0..costs.len())
        .filter(|&i| costs[i] - min <= 1e-9)
        .collect();
    let fewest_cached = cheapest
        .iter()
        .map(|&i| s.candidates[i].cached_blocks)
        .min()?;
    let tied: Vec<usize> = cheapest
        .into_iter()
        .filter(|&i| s.candidates[i].cached_blocks == fewest_cached)
        .collect();
    pick(&tied, rng)
}

/// Samples an index with probability ∝ exp(−normalised cost / T), costs normalised to [0, 1].
pub fn softmax_sample(costs: &[f64], temperature: f64, rng: &mut SmallRng) -> usize {
    let min = costs.iter().copied().fold(f64::INFINITY, f64::min);
    let max = costs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let span = max - min;
    let weights: Vec<f64> = costs
        .iter()
        .map(|&c| {
            let normalised = if span > 0.0 { (c - min) / span } else { 0.0 };
            (-normalised / temperature).exp()
        })
        .collect();
    let total: f64 = weights.iter().sum();
    let mut point = rng.random::<f64>() * total;
    for (i, w) in weights.iter().enumerate() {
        if point < *w {
            return i;
        }
        point -= w;
    }
    costs.len() - 1
}

pub fn pick(indices: &[usize], rng: &mut SmallRng) -> Option<usize> {
    match indices.len() {
        0 => None,
        1 => Some(indices[0]),
        n => Some(indices[rng.random_range(0..n)]),
    }
}

/// Indices of the candidates minimising `key`.
pub fn argmin_all<K: Ord + Copy>(
    candidates: &[Candidate],
    key: impl Fn(&Candidate) -> K,
) -> Vec<usize> {
    let Some(best) = candidates.iter().map(&key).min() else {
        return Vec::new();
    };
    (0..candidates.len())
        .filter(|&i| key(&candidates[i]) == best)
        .collect()
}
