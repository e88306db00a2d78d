//! The mocker's log probabilities: the distribution its draws come from, exactly.
//!
//! Its model gives every token the same logit, 0 (see [`TokenRules`]); a request's biases
//! and penalties change some of them, its bans and its constraint's mask leave tokens out.
//! A token's log probability is its logit less the log of the sum of every remaining
//! token's weight. Without a constraint the tokens are the mocker's vocabulary
//! ([`VOCAB_SIZE`]) and any biased token beyond it; under one, the tokens it allows.
//!
//! Under a constraint the mocker's draw is not this distribution alone: with a
//! probability that grows as the budget runs out, it takes the token that ends the answer
//! soonest instead (see [`crate::tokens::token_guided`]); what is reported is its model's.

use rustc_hash::FxHashMap;
use switchyard_core::Token;
use switchyard_core::protocol::TokenLogprobs;

use crate::tokens::{TokenRules, VOCAB_SIZE, touched};

/// `chosen`'s log probability and the `n` likeliest tokens', likeliest first (among equal
/// ones, `chosen` first, then by id), given how often each token is already in the output
/// (`counts`) and, under a constraint, the tokens it allows (`allowed`, ascending).
pub fn logprobs(
    rules: &TokenRules,
    counts: &FxHashMap<Token, u32>,
    allowed: Option<&[Token]>,
    chosen: Token,
    n: u32,
) -> TokenLogprobs {
    // The tokens whose logit is not 0 (None: banned), as the draw weighs them.
    let touched = touched(rules, counts);
    let drawable = |token: Token| match allowed {
        Some(allowed) => allowed.binary_search(&token).is_ok(),
        None => token < VOCAB_SIZE || touched.contains_key(&token),
    };
    let logit = |token: Token| match touched.get(&token) {
        _ if !drawable(token) => None,
        Some(&logit) => logit,
        None => Some(0.0),
    };
    let weighed: Vec<(Token, f64)> = touched
        .iter()
        .filter(|&(&token, _)| drawable(token))
        .filter_map(|(&token, &logit)| Some((token, logit?)))
        .collect();
    let size = match allowed {
        Some(allowed) => allowed.len(),
        None => VOCAB_SIZE as usize + touched.keys().filter(|&&t| t >= VOCAB_SIZE).count(),
    };
    let plain = size - touched.keys().filter(|&&t| drawable(t)).count();
    if plain == 0 && weighed.is_empty() {
        // Nothing is drawable (every allowed token banned): the draw took what it could.
        return TokenLogprobs {
            logprob: f32::NEG_INFINITY,
            top: Vec::new(),
        };
    }
    // log Σ e^logit, shifted by the largest logit.
    let most = weighed
        .iter()
        .map(|&(_, logit)| logit)
        .fold(if plain > 0 { 0.0 } else { f64::NEG_INFINITY }, f64::max);
    let sum =
        plain as f64 * (-most).exp() + weighed.iter().map(|&(_, l)| (l - most).exp()).sum::<f64>();
    let log_total = most + sum.ln();
    let logprob = |logit: f64| (logit - log_total) as f32;
    // Candidates for the likeliest: every weighed token, and enough of the plain ones
    // (the chosen token, then the lowest ids).
    let mut candidates = weighed;
    if logit(chosen).is_some() && !touched.contains_key(&chosen) {
        candidates.push((chosen, 0.0));
    }
    let ids: Box<dyn Iterator<Item = Token>> = match allowed {
        Some(allowed) => Box::new(allowed.iter().copied()),
        None => Box::new(0..VOCAB_SIZE),
    };
    candidates.extend(
        ids.filter(|&t| t != chosen && !touched.contains_key(&t))
            .take(n as usize)
            .map(|t| (t, 0.0)),
    );
    candidates.sort_by(|a, b| {
        b.1.total_cmp(&a.1)
            .then((b.0 == chosen).cmp(&(a.0 == chosen)))
            .then(a.0.cmp(&b.0))
    });
    TokenLogprobs {
        logprob: logit(chosen).map_or(f32::NEG_INFINITY, logprob),
        top: candidates
            .into_iter()
            .take(n as usize)
            .map(|(token, l)| (token, logprob(l)))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::tokens::token_under;

    /// Every drawable token's log probability, naively: all logits written out.
    fn naive(
        rules: &TokenRules,
        counts: &FxHashMap<Token, u32>,
        allowed: Option<&[Token]>,
    ) -> Vec<(Token, f64)> {
        let beyond = rules
            .bias
            .iter()
            .map(|&(t, _)| t)
            .filter(|&t| t >= VOCAB_SIZE);
        let tokens: Vec<Token> = match allowed {
            Some(allowed) => allowed.to_vec(),
            None => (0..VOCAB_SIZE).chain(beyond).collect(),
        };
        let mut logits = Vec::new();
        for token in tokens {
            if rules.banned.contains(&token) || logits.iter().any(|&(t, _)| t == token) {
                continue;
            }
            let bias = rules
                .bias
                .iter()
                .rev()
                .find(|&&(t, _)| t == token)
                .map_or(0.0, |&(_, b)| f64::from(b));
            let count = counts.get(&token).copied().unwrap_or(0);
            let penalty = if count == 0 {
                0.0
            } else {
                f64::from(rules.frequency_penalty) * f64::from(count)
                    + f64::from(rules.presence_penalty)
            };
            logits.push((token, bias - penalty));
        }
        let total: f64 = logits.iter().map(|&(_, l)| l.exp()).sum();
        logits
            .into_iter()
            .map(|(t, l)| (t, l - total.ln()))
            .collect()
    }

    fn rules() -> impl Strategy<Value = (TokenRules, FxHashMap<Token, u32>)> {
        let token = prop_oneof![0u32..40, (VOCAB_SIZE - 2)..(VOCAB_SIZE + 2)];
        (
            prop::collection::vec(token.clone(), 0..4),
            prop::collection::vec((token.clone(), -20.0f32..20.0), 0..5),
            -2.0f32..2.0,
            -2.0f32..2.0,
            prop::collection::vec((token, 1u32..4), 0..5),
        )
            .prop_map(
                |(banned, bias, frequency_penalty, presence_penalty, counts)| {
                    let mut seen = std::collections::HashSet::new();
                    let bias = bias.into_iter().filter(|(t, _)| seen.insert(*t)).collect();
                    let counts = counts
                        .into_iter()
                        .filter(|&(t, _)| t < VOCAB_SIZE)
                        .collect();
                    (
                        TokenRules {
                            banned,
                            bias,
                            frequency_penalty,
                            presence_penalty,
                        },
                        counts,
                    )
                },
            )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Against every logit written out: the chosen token's log probability, and the
        /// likeliest tokens with theirs, in order.
        #[test]
        fn the_distribution_is_the_naive_one(
            (rules, counts) in rules(),
            allowed in prop::option::of(prop::collection::btree_set(0u32..60, 1..20)),
            chosen in 0u32..60,
            n in 0u32..8,
        ) {
            let allowed: Option<Vec<Token>> = allowed.map(|a| a.into_iter().collect());
            let got = logprobs(&rules, &counts, allowed.as_deref(), chosen, n);
            let mut all = naive(&rules, &counts, allowed.as_deref());
            let total: f64 = all.iter().map(|&(_, l)| l.exp()).sum();
            prop_assert!(all.is_empty() || (total - 1.0).abs() < 1e-6);
            match all.iter().find(|&&(t, _)| t == chosen) {
                Some(&(_, l)) => prop_assert!((f64::from(got.logprob) - l).abs() < 1e-4),
                None => prop_assert_eq!(got.logprob, f32::NEG_INFINITY),
            }
            all.sort_by(|a, b| {
                b.1.total_cmp(&a.1)
                    .then((b.0 == chosen).cmp(&(a.0 == chosen)))
                    .then(a.0.cmp(&b.0))
            });
            prop_assert_eq!(got.top.len(), all.len().min(n as usize));
            for (&(token, logprob), &(want, l)) in got.top.iter().zip(&all) {
                prop_assert_eq!(token, want);
                prop_assert!((f64::from(logprob) - l).abs() < 1e-4);
            }
        }
    }

    /// The draws follow the reported distribution: the biased token comes as often as its
    /// probability says.
    #[test]
    fn draws_come_as_often_as_reported() {
        let rules = TokenRules {
            bias: vec![(7, 10.4)],
            ..TokenRules::default()
        };
        let counts = FxHashMap::default();
        let reported = f64::from(logprobs(&rules, &counts, None, 7, 1).logprob).exp();
        let draws = 20_000;
        let hits = (0..draws)
            .filter(|&i| token_under(3, 9, i, &rules, &counts) == 7)
            .count();
        let seen = hits as f64 / f64::from(draws);
        assert!((0.4..0.6).contains(&reported), "{reported}");
        assert!(
            (seen - reported).abs() < 0.02,
            "drawn {seen}, reported {reported}"
        );
    }
}
