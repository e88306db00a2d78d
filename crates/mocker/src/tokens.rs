//! Deterministic output tokens, so two runs (or a run and a test) produce the same streams.
//!
//! A token depends on the model's seed, the request's stream key (its sampling seed, or its
//! id), its absolute position in the sequence (prompt included) and, when the request
//! biases logits or sets penalties, the output so far ([`token_under`]); on nothing about
//! the engine that produces it: a request resumed elsewhere, its prompt extended by what
//! was generated, continues the same sequence.

use rustc_hash::FxHashMap;
use switchyard_core::Token;
use switchyard_core::protocol::SamplingParams;
use switchyard_grammar::guide::pressure;
use switchyard_grammar::{Guide, Pick};
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Size of the vocabulary tokens are drawn from.
pub const VOCAB_SIZE: u32 = 32_000;

/// The token at absolute `position` of the stream keyed by `stream_key`.
pub fn token_at(seed: u64, stream_key: u64, position: u32) -> Token {
    let mut key = [0u8; 12];
    key[..8].copy_from_slice(&stream_key.to_le_bytes());
    key[8..].copy_from_slice(&position.to_le_bytes());
    (xxh3_64_with_seed(&key, seed) % u64::from(VOCAB_SIZE)) as Token
}

/// [`token_at`], redrawn (deterministically) while it is one of `banned`, so a request's
/// banned tokens never appear and a resumed request still continues the same sequence.
///
/// After 64 redraws (a request banning most of the vocabulary) it takes the allowed token
/// the last draw points at; when every token is banned, the plain draw (the request asked
/// for the impossible; the frontend refuses such requests).
pub fn token_avoiding(seed: u64, stream_key: u64, position: u32, banned: &[Token]) -> Token {
    let mut token = token_at(seed, stream_key, position);
    let mut draw = 0u64;
    while banned.contains(&token) {
        draw += 1;
        if draw > 64 {
            let mut sorted: Vec<Token> =
                banned.iter().copied().filter(|&t| t < VOCAB_SIZE).collect();
            sorted.sort_unstable();
            sorted.dedup();
            let allowed = VOCAB_SIZE - sorted.len() as u32;
            if allowed == 0 {
                return token_at(seed, stream_key, position);
            }
            return nth_allowed(u64::from(token) % u64::from(allowed), &sorted);
        }
        token = token_at(seed, stream_key ^ draw.rotate_right(1), position);
    }
    token
}

/// The `n`-th token of the vocabulary not in `sorted` (ascending, no duplicates, all in
/// the vocabulary).
fn nth_allowed(n: u64, sorted: &[Token]) -> Token {
    let mut token = n as Token;
    for &t in sorted {
        if t <= token {
            token += 1;
        }
    }
    token
}

/// What a request asks of its draws besides their key: OpenAI's `logit_bias` and penalties.
///
/// The mocker's model gives every token of its vocabulary the same logit, 0. The rules
/// change logits as OpenAI documents: a token's logit gains its bias, loses
/// `frequency_penalty` for every time it is already in the output and `presence_penalty`
/// once if it is there at all; a banned token (a bias of -100) has none.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TokenRules {
    /// Tokens never produced.
    pub banned: Vec<Token>,
    /// Other biases, added to their token's logit.
    pub bias: Vec<(Token, f32)>,
    pub frequency_penalty: f32,
    pub presence_penalty: f32,
}

impl TokenRules {
    /// The rules of a request's sampling parameters.
    pub fn of(sampling: &SamplingParams) -> Self {
        TokenRules {
            banned: sampling.banned_tokens().collect(),
            bias: sampling
                .logit_bias
                .iter()
                .copied()
                .filter(|&(_, bias)| bias > -100.0 && bias != 0.0)
                .collect(),
            frequency_penalty: sampling.frequency_penalty.unwrap_or(0.0),
            presence_penalty: sampling.presence_penalty.unwrap_or(0.0),
        }
    }

    /// Whether a draw depends on more than the bans, so on the output so far: without
    /// biases or penalties the stream is [`token_avoiding`]'s.
    pub fn reshapes(&self) -> bool {
        !self.bias.is_empty() || self.frequency_penalty != 0.0 || self.presence_penalty != 0.0
    }
}

/// Every token whose logit `rules` change from 0, with its logit (None: banned), given how
/// often each token is already in the output (`counts`).
pub fn touched(
    rules: &TokenRules,
    counts: &FxHashMap<Token, u32>,
) -> FxHashMap<Token, Option<f64>> {
    let penalty = |token: Token| match counts.get(&token) {
        None | Some(0) => 0.0,
        Some(&count) => {
            f64::from(rules.frequency_penalty) * f64::from(count)
                + f64::from(rules.presence_penalty)
        }
    };
    let mut logits: FxHashMap<Token, Option<f64>> = counts
        .keys()
        .map(|&token| (token, Some(-penalty(token))))
        .collect();
    for &(token, bias) in &rules.bias {
        logits.insert(token, Some(f64::from(bias) - penalty(token)));
    }
    for &token in &rules.banned {
        logits.insert(token, None);
    }
    logits
}

/// The token at absolute `position` of the stream keyed by `stream_key` under `rules`,
/// given how often each token is already in the output (`counts`).
///
/// The draw is exact: the tokens whose logit the rules change are weighed one by one, and
/// the others, all at logit 0, share the rest of the mass, one of them picked uniformly.
/// It depends on the seed, the key, the position, the rules and the output so far only, so
/// a resumed request still continues the same sequence.
pub fn token_under(
    seed: u64,
    stream_key: u64,
    position: u32,
    rules: &TokenRules,
    counts: &FxHashMap<Token, u32>,
) -> Token {
    if !rules.reshapes() {
        return token_avoiding(seed, stream_key, position, &rules.banned);
    }
    let mut touched: Vec<(Token, Option<f64>)> = touched(rules, counts).into_iter().collect();
    touched.sort_unstable_by_key(|&(token, _)| token);
    let in_vocab = touched.iter().filter(|(t, _)| *t < VOCAB_SIZE).count() as u32;
    let plain = VOCAB_SIZE - in_vocab;
    // Weights relative to the largest logit, so no exponential overflows.
    let top = touched
        .iter()
        .filter_map(|&(_, logit)| logit)
        .fold(if plain > 0 { 0.0 } else { f64::NEG_INFINITY }, f64::max);
    if !top.is_finite() {
        // Every token of the vocabulary is banned and nothing outside it is allowed.
        return token_at(seed, stream_key, position);
    }
    let plain_mass = f64::from(plain) * (-top).exp();
    let total = plain_mass
        + touched
            .iter()
            .filter_map(|&(_, logit)| logit)
            .map(|logit| (logit - top).exp())
            .sum::<f64>();
    let mut left = unit(seed ^ MASS_SALT, stream_key, position) * total;
    for &(token, logit) in &touched {
        let Some(logit) = logit else { continue };
        let weight = (logit - top).exp();
        if left < weight {
            return token;
        }
        left -= weight;
    }
    if plain == 0 {
        // Rounding left a sliver past the last weighed token.
        if let Some(&(token, _)) = touched.iter().rev().find(|(_, logit)| logit.is_some()) {
            return token;
        }
        return token_at(seed, stream_key, position);
    }
    // The j-th token of the vocabulary the rules leave at logit 0, j uniform over them.
    let j = (unit(seed ^ PLAIN_SALT, stream_key, position) * f64::from(plain)) as u64;
    let in_vocab: Vec<Token> = touched
        .iter()
        .map(|&(t, _)| t)
        .filter(|&t| t < VOCAB_SIZE)
        .collect();
    nth_allowed(j.min(u64::from(plain) - 1), &in_vocab)
}

/// The token at absolute `position` under `guide`, a request's constraint: the draw of
/// [`token_under`], kept when the constraint allows it, else another allowed token, drawn
/// uniformly; leaning more and more to the token that ends the constraint soonest as the
/// `(generated, budget)` output tokens run out (see [`switchyard_grammar::Guide::pick`] and
/// [`switchyard_grammar::guide::pressure`]). Still a pure function of the seed, the key, the
/// position and the output so far. On a draw the matcher cannot make, the token that ends
/// the sequence, as an error.
pub fn token_guided(
    seed: u64,
    stream_key: u64,
    position: u32,
    rules: &TokenRules,
    counts: &FxHashMap<Token, u32>,
    guide: &mut Guide,
    (generated, budget): (u32, u32),
) -> Result<Token, Token> {
    let pick = Pick {
        plain: token_under(seed, stream_key, position, rules, counts),
        close: unit(seed ^ CLOSE_SALT, stream_key, position),
        other: unit(seed ^ OTHER_SALT, stream_key, position),
        pressure: pressure(generated, budget),
    };
    guide.pick(&pick).map_err(|_| guide.eos())
}

const CLOSE_SALT: u64 = 0x2545_f491_4f6c_dd1d;
const OTHER_SALT: u64 = 0x6a09_e667_f3bc_c909;
const MASS_SALT: u64 = 0x9e37_79b9_7f4a_7c15;
const PLAIN_SALT: u64 = 0x5851_f42d_4c95_7f2d;

/// A uniform draw in [0, 1) for the stream and position.
fn unit(seed: u64, stream_key: u64, position: u32) -> f64 {
    let mut key = [0u8; 12];
    key[..8].copy_from_slice(&stream_key.to_le_bytes());
    key[8..].copy_from_slice(&position.to_le_bytes());
    (xxh3_64_with_seed(&key, seed) >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_depend_on_seed_key_and_position() {
        let a: Vec<_> = (0..8).map(|i| token_at(1, 5, i)).collect();
        let b: Vec<_> = (0..8).map(|i| token_at(1, 5, i)).collect();
        assert_eq!(a, b);
        assert_ne!(a, (0..8).map(|i| token_at(2, 5, i)).collect::<Vec<_>>());
        assert_ne!(a, (0..8).map(|i| token_at(1, 6, i)).collect::<Vec<_>>());
        assert_ne!(a, (1..9).map(|i| token_at(1, 5, i)).collect::<Vec<_>>());
        assert!(a.iter().all(|&t| t < VOCAB_SIZE));
    }

    #[test]
    fn banned_tokens_are_redrawn_and_others_kept() {
        let plain: Vec<_> = (0..64).map(|i| token_at(1, 5, i)).collect();
        let banned = [plain[3], plain[10], plain[40]];
        let avoiding: Vec<_> = (0..64).map(|i| token_avoiding(1, 5, i, &banned)).collect();
        for (i, (&p, &a)) in plain.iter().zip(&avoiding).enumerate() {
            if banned.contains(&p) {
                assert!(!banned.contains(&a), "position {i} kept a banned token");
            } else {
                assert_eq!(p, a, "position {i} changed though its token was allowed");
            }
        }
        assert_eq!(
            avoiding,
            (0..64)
                .map(|i| token_avoiding(1, 5, i, &banned))
                .collect::<Vec<_>>()
        );
    }

    /// The probability of each token under `rules`, over the whole vocabulary (and any
    /// biased token beyond it), naively.
    fn naive_probabilities(
        rules: &TokenRules,
        counts: &FxHashMap<Token, u32>,
    ) -> FxHashMap<Token, f64> {
        let beyond = rules
            .bias
            .iter()
            .map(|&(t, _)| t)
            .filter(|&t| t >= VOCAB_SIZE);
        let weights: Vec<(Token, f64)> = (0..VOCAB_SIZE)
            .chain(beyond)
            .map(|token| {
                if rules.banned.contains(&token) {
                    return (token, 0.0);
                }
                let count = counts.get(&token).copied().unwrap_or(0);
                let bias = rules
                    .bias
                    .iter()
                    .find(|(t, _)| *t == token)
                    .map_or(0.0, |&(_, b)| f64::from(b));
                let penalty = if count == 0 {
                    0.0
                } else {
                    f64::from(rules.frequency_penalty) * f64::from(count)
                        + f64::from(rules.presence_penalty)
                };
                (token, (bias - penalty).exp())
            })
            .collect();
        let total: f64 = weights.iter().map(|(_, w)| w).sum();
        weights.into_iter().map(|(t, w)| (t, w / total)).collect()
    }

    #[test]
    fn without_biases_or_penalties_draws_are_the_plain_ones() {
        let counts: FxHashMap<Token, u32> = (0..50).map(|t| (token_at(1, 5, t), 1)).collect();
        let rules = TokenRules {
            banned: vec![token_at(1, 5, 60)],
            ..TokenRules::default()
        };
        assert!(!rules.reshapes());
        for position in 0..200 {
            assert_eq!(
                token_under(1, 5, position, &rules, &counts),
                token_avoiding(1, 5, position, &rules.banned)
            );
        }
    }

    #[test]
    fn draws_follow_the_adjusted_logits() {
        // Logits: token 5 at +6 (bias), 7 at +4.5 (seen twice, frequency -2, presence
        // -0.5), 9 at +2.5 (seen once), 11 at 3 - 2.5 (biased and seen once), 13 banned,
        // 40_000 (outside the mocker's draws) at +7; the rest at 0.
        let rules = TokenRules {
            banned: vec![13],
            bias: vec![(5, 6.0), (11, 3.0), (40_000, 7.0)],
            frequency_penalty: -2.0,
            presence_penalty: -0.5,
        };
        let counts: FxHashMap<Token, u32> =
            [(7, 2), (9, 1), (11, 1), (13, 4)].into_iter().collect();
        let naive = naive_probabilities(&rules, &counts);
        let draws = 200_000u32;
        let mut seen: FxHashMap<Token, u32> = FxHashMap::default();
        for key in 0..u64::from(draws) {
            *seen
                .entry(token_under(3, key, 17, &rules, &counts))
                .or_insert(0) += 1;
        }
        assert_eq!(seen.get(&13), None, "a banned token was drawn");
        let probability = |token: Token| naive[&token];
        for token in [5, 7, 9, 11, 40_000] {
            let expected = probability(token) * f64::from(draws);
            let got = f64::from(seen.get(&token).copied().unwrap_or(0));
            let sigma = expected.sqrt().max(1.0);
            assert!(
                (got - expected).abs() < 5.0 * sigma,
                "token {token}: drawn {got} times, expected {expected:.0}"
            );
        }
        // The plain tokens share the rest uniformly: no single one stands out.
        let plain_max = seen
            .iter()
            .filter(|(t, _)| ![5, 7, 9, 11, 40_000].contains(*t))
            .map(|(_, &n)| n)
            .max()
            .unwrap();
        let plain_each = probability(0) * f64::from(draws);
        assert!(f64::from(plain_max) < plain_each + 6.0 * plain_each.sqrt() + 3.0);
    }

    #[test]
    fn huge_logits_do_not_overflow() {
        let rules = TokenRules {
            frequency_penalty: -2.0,
            ..TokenRules::default()
        };
        // A token seen 1,000 times has logit +2,000: it is all that is drawn.
        let counts: FxHashMap<Token, u32> = [(42, 1_000), (43, 1)].into_iter().collect();
        for position in 0..100 {
            assert_eq!(token_under(1, 2, position, &rules, &counts), 42);
        }
        // A penalty that large the other way leaves the token out.
        let rules = TokenRules {
            frequency_penalty: 2.0,
            ..TokenRules::default()
        };
        for position in 0..2_000 {
            assert_ne!(token_under(1, 2, position, &rules, &counts), 42);
        }
    }

    #[test]
    fn a_request_banning_nearly_everything_still_gets_an_allowed_token_and_never_hangs() {
        let allowed = [7, 31_000];
        let banned: Vec<Token> = (0..VOCAB_SIZE).filter(|t| !allowed.contains(t)).collect();
        for position in 0..50 {
            let token = token_avoiding(1, 2, position, &banned);
            assert!(allowed.contains(&token), "{token}");
        }
        // Everything banned: a token anyway, at once.
        let all: Vec<Token> = (0..VOCAB_SIZE).collect();
        assert!(token_avoiding(1, 2, 3, &all) < VOCAB_SIZE);
        let rules = TokenRules {
            banned: all,
            presence_penalty: 1.0,
            ..TokenRules::default()
        };
        assert!(token_under(1, 2, 3, &rules, &FxHashMap::default()) < VOCAB_SIZE);
    }

    #[test]
    fn plain_tokens_are_drawn_uniformly_under_penalties() {
        // 6,000 tokens seen and penalised out: the 26,000 plain ones must be drawn evenly
        // (a second modulo would favour the ids below 6,000: 59 % of the draws in the
        // lower half instead of 50 %).
        let counts: FxHashMap<Token, u32> = (26_000..VOCAB_SIZE).map(|t| (t, 1)).collect();
        let rules = TokenRules {
            presence_penalty: 50.0,
            ..TokenRules::default()
        };
        let mut low = 0u32;
        let draws = 2_000u32;
        for key in 0..u64::from(draws) {
            let token = token_under(5, key, 9, &rules, &counts);
            assert!(token < 26_000, "a penalised token came out: {token}");
            low += u32::from(token < 13_000);
        }
        let share = f64::from(low) / f64::from(draws);
        assert!(
            (share - 0.5).abs() < 0.045,
            "{share} of the draws in the lower half"
        );
    }
}
