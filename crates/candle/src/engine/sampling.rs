//! Drawing the next token from logits under a request's sampling options.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use switchyard_core::protocol::SamplingParams;

/// Samples the next token from logits, as the request's sampling options say. The random
/// draw depends on the request's stream key and the output position only, so a resumed
/// request continues the same sequence.
pub fn sample(
    logits: &mut [f32],
    sampling: &SamplingParams,
    history: &[u32],
    key: u64,
    position: u32,
) -> u32 {
    for &(token, bias) in &sampling.logit_bias {
        if let Some(l) = logits.get_mut(token as usize) {
            *l += bias;
        }
    }
    for token in sampling.banned_tokens() {
        if let Some(l) = logits.get_mut(token as usize) {
            *l = f32::NEG_INFINITY;
        }
    }
    let frequency = sampling.frequency_penalty.unwrap_or(0.0);
    let presence = sampling.presence_penalty.unwrap_or(0.0);
    if frequency != 0.0 || presence != 0.0 {
        let mut counts: rustc_hash::FxHashMap<u32, u32> = Default::default();
        for &t in history {
            *counts.entry(t).or_default() += 1;
        }
        for (t, n) in counts {
            if let Some(l) = logits.get_mut(t as usize) {
                *l -= frequency * n as f32 + presence;
            }
        }
    }
    let argmax = || {
        logits
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .map_or(0, |(i, _)| i as u32)
    };
    let temperature = sampling.temperature.unwrap_or(1.0);
    if temperature <= 0.0 || sampling.top_k == Some(1) {
        return argmax();
    }
    let mut rng =
        SmallRng::seed_from_u64(key ^ u64::from(position).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let draw: f32 = rng.random();
    let whole = sampling.top_k.is_none_or(|k| k == 0) && sampling.top_p.is_none_or(|p| p >= 1.0);
    if whole {
        if !logits.iter().any(|l| l.is_finite()) {
            return argmax();
        }
        return draw_in_order(logits, temperature, draw).unwrap_or_default();
    }
    let mut candidates: Vec<(u32, f32)> = logits
        .iter()
        .enumerate()
        .filter(|(_, l)| l.is_finite())
        .map(|(i, &l)| (i as u32, l / temperature))
        .collect();
    if candidates.is_empty() {
        return argmax();
    }
    candidates.sort_unstable_by(|a, b| b.1.total_cmp(&a.1));
    if let Some(k) = sampling.top_k.filter(|&k| k > 0) {
        candidates.truncate(k as usize);
    }
    let max = candidates[0].1;
    let mut probs: Vec<f32> = candidates.iter().map(|(_, l)| (l - max).exp()).collect();
    let total: f32 = probs.iter().sum();
    probs.iter_mut().for_each(|p| *p /= total);
    if let Some(top_p) = sampling.top_p.filter(|&p| p < 1.0) {
        let mut mass = 0.0;
        let keep = probs
            .iter()
            .position(|&p| {
                mass += p;
                mass >= top_p
            })
            .map_or(probs.len(), |i| i + 1);
        probs.truncate(keep);
        let total: f32 = probs.iter().sum();
        probs.iter_mut().for_each(|p| *p /= total);
    }
    let mut mass = 0.0;
    for (i, p) in probs.iter().enumerate() {
        mass += p;
        if draw < mass {
            return candidates[i].0;
        }
    }
    candidates[probs.len() - 1].0
}

/// The token at `draw` (in [0, 1)) of the cumulative softmax of `logits / temperature`,
/// the tokens taken in id order: the whole distribution needs no sort. `logits` are
/// overwritten with the weights. None when no logit is finite.
fn draw_in_order(logits: &mut [f32], temperature: f32, draw: f32) -> Option<u32> {
    let max = logits
        .iter()
        .copied()
        .filter(|l| l.is_finite())
        .fold(f32::NEG_INFINITY, f32::max);
    if !max.is_finite() {
        return None;
    }
    let mut total = 0.0f64;
    for logit in logits.iter_mut() {
        *logit = if logit.is_finite() {
            ((*logit - max) / temperature).exp()
        } else {
            0.0
        };
        total += f64::from(*logit);
    }
    let target = f64::from(draw) * total;
    let mut mass = 0.0f64;
    let mut last = None;
    for (id, &weight) in logits.iter().enumerate() {
        if weight > 0.0 {
            mass += f64::from(weight);
            last = Some(id as u32);
            if target < mass {
                return last;
            }
        }
    }
    last
}

/// The model's distribution at one step, as log probabilities: the log of the softmax's
/// normaliser over the raw logits, and the `n` likeliest tokens (likeliest first, the
/// lower id first among equals) with theirs.
#[derive(Debug, Clone, PartialEq)]
pub struct Distribution {
    log_normaliser: f64,
    pub top: Vec<(u32, f32)>,
}

impl Distribution {
    pub fn of(logits: &[f32], n: usize) -> Self {
        let max = logits
            .iter()
            .copied()
            .filter(|l| l.is_finite())
            .fold(f32::NEG_INFINITY, f32::max);
        let sum: f64 = logits
            .iter()
            .filter(|l| l.is_finite())
            .map(|&l| f64::from(l - max).exp())
            .sum();
        let log_normaliser = f64::from(max) + sum.ln();
        // A short sorted list: `n` is at most 20.
        let mut top: Vec<(u32, f32)> = Vec::with_capacity(n + 1);
        if n > 0 {
            for (id, &logit) in logits.iter().enumerate() {
                if !logit.is_finite() || (top.len() == n && logit <= top[n - 1].1) {
                    continue;
                }
                let at = top.partition_point(|&(_, l)| l >= logit);
                top.insert(at, (id as u32, logit));
                top.truncate(n);
            }
        }
        let mut distribution = Distribution {
            log_normaliser,
            top: Vec::new(),
        };
        distribution.top = top
            .into_iter()
            .map(|(id, logit)| (id, distribution.logprob(logit)))
            .collect();
        distribution
    }

    /// The log probability of a token whose raw logit is `logit`.
    pub fn logprob(&self, logit: f32) -> f32 {
        (f64::from(logit) - self.log_normaliser) as f32
    }
}

#[cfg(test)]
mod distribution_tests {
    use super::{Distribution, draw_in_order};
    use proptest::prelude::*;

    proptest! {
        /// Against a naive model: the token whose cumulative softmax, in id order, first
        /// passes the draw.
        #[test]
        fn a_draw_over_the_whole_distribution_is_its_inverse_cumulative(
            logits in prop::collection::vec(prop_oneof![-20.0f32..20.0, Just(f32::NEG_INFINITY)], 1..100),
            temperature in 0.1f32..3.0,
            draw in 0.0f32..1.0,
        ) {
            let finite: Vec<(usize, f64)> = logits
                .iter()
                .enumerate()
                .filter(|(_, l)| l.is_finite())
                .map(|(i, &l)| (i, f64::from(l)))
                .collect();
            let got = draw_in_order(&mut logits.clone(), temperature, draw);
            if finite.is_empty() {
                prop_assert_eq!(got, None);
                return Ok(());
            }
            let max = finite.iter().map(|f| f.1).fold(f64::NEG_INFINITY, f64::max);
            let weights: Vec<f64> = finite
                .iter()
                .map(|&(_, l)| ((l - max) / f64::from(temperature)).exp())
                .collect();
            let total: f64 = weights.iter().sum();
            let mut mass = 0.0;
            let mut naive = finite.last().unwrap().0;
            for (w, &(i, _)) in weights.iter().zip(&finite) {
                mass += w / total;
                if f64::from(draw) < mass {
                    naive = i;
                    break;
                }
            }
            // A draw within rounding of a boundary may fall on either side.
            let at = |id: usize| finite.iter().position(|f| f.0 == id).unwrap();
            let got = got.unwrap() as usize;
            let before: f64 = weights[..at(got)].iter().sum::<f64>() / total;
            let after = before + weights[at(got)] / total;
            prop_assert!(
                got == naive || (f64::from(draw) - before).abs() < 1e-5 || (f64::from(draw) - after).abs() < 1e-5,
                "{} against {}", got, naive
            );
        }
    }

    proptest! {
        /// Against a naive model: every token's log probability, sorted.
        #[test]
        fn the_top_tokens_and_their_log_probabilities_are_the_softmaxs(
            logits in prop::collection::vec(-30.0f32..30.0, 1..200),
            n in 0usize..21,
        ) {
            let d = Distribution::of(&logits, n);
            let total: f64 = logits.iter().map(|&l| f64::from(l).exp()).sum();
            let mut naive: Vec<(u32, f64)> = logits
                .iter()
                .enumerate()
                .map(|(i, &l)| (i as u32, f64::from(l).exp().ln() - total.ln()))
                .collect();
            naive.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            naive.truncate(n);
            prop_assert_eq!(d.top.len(), naive.len());
            for ((id, lp), (nid, nlp)) in d.top.iter().zip(&naive) {
                prop_assert_eq!(id, nid);
                prop_assert!((f64::from(*lp) - nlp).abs() < 1e-4, "{} against {}", lp, nlp);
            }
            for (i, &l) in logits.iter().enumerate() {
                let exact = f64::from(l) - total.ln();
                prop_assert!((f64::from(d.logprob(l)) - exact).abs() < 1e-4, "token {}", i);
            }
        }
    }
}
