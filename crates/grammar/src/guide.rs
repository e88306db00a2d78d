//! One request's matcher: the tokens its constraint allows next, and the mocker's draw
//! under them.

use std::sync::Arc;

use llguidance::Matcher;
use switchyard_core::Token;
use toktrie::{SimpleVob, TokEnv};

use crate::compile::GrammarError;

/// Where a request stands in its constraint. Cloning it is cheap (the compiled grammar is
/// shared).
#[derive(Clone)]
pub struct Guide {
    matcher: Matcher,
    env: TokEnv,
    eos: Token,
    closers: Arc<[Token]>,
    /// Tokens taken so far.
    taken: u32,
}

impl std::fmt::Debug for Guide {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guide")
            .field("taken", &self.taken)
            .field("done", &self.is_done())
            .finish_non_exhaustive()
    }
}

/// What a draw under a constraint is made of, each part a pure function of the request's
/// seed, key and position (so a request resumed elsewhere draws the same tokens).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pick {
    /// The token drawn without the constraint: kept when the constraint allows it.
    pub plain: Token,
    /// Uniform in [0, 1): below `pressure`, the draw closes the structure instead.
    pub close: f64,
    /// Uniform in [0, 1): which allowed token, when the plain one is not.
    pub other: f64,
    /// How strongly the draw leans to ending the constraint, in [0, 1] (see
    /// [`pressure`]).
    pub pressure: f64,
}

/// Generated tokens past which a constrained draw always closes what it has open.
pub const SOFT_BUDGET: u32 = 48;

/// How strongly the `generated`-th draw (from 0) of a request that may generate `budget`
/// tokens in all leans to ending its constraint: `((generated + 1) / soft)²`, capped at 1,
/// where `soft` is half the budget, at most [`SOFT_BUDGET`]. A real model closes its
/// objects; the mocker, whose plain draws are uniform over a vocabulary of words, would
/// otherwise write strings until its budget ran out.
pub fn pressure(generated: u32, budget: u32) -> f64 {
    let soft = (budget / 2).clamp(1, SOFT_BUDGET);
    let ratio = f64::from(generated + 1) / f64::from(soft);
    (ratio * ratio).min(1.0)
}

impl Guide {
    pub(crate) fn new(matcher: Matcher, env: TokEnv, eos: Token, closers: Arc<[Token]>) -> Self {
        Guide {
            matcher,
            env,
            eos,
            closers,
            taken: 0,
        }
    }

    /// The token that ends a sequence under it.
    pub fn eos(&self) -> Token {
        self.eos
    }

    /// Whether the constraint is complete: nothing may follow but the end of the sequence.
    pub fn is_done(&self) -> bool {
        self.matcher.is_stopped()
    }

    /// Whether what it took so far is a complete answer (the sequence may end here).
    pub fn is_accepting(&mut self) -> bool {
        self.is_done() || self.matcher.is_accepting().unwrap_or(false)
    }

    /// Takes tokens generated under it (a resumed request's output so far).
    pub fn take(&mut self, tokens: &[Token]) -> Result<(), GrammarError> {
        for &token in tokens {
            self.take_one(token)?;
        }
        Ok(())
    }

    fn take_one(&mut self, token: Token) -> Result<(), GrammarError> {
        if self.is_done() {
            if token == self.eos {
                return Ok(());
            }
            return Err(GrammarError::Rejected(format!(
                "token {token} follows a complete answer"
            )));
        }
        let allowed = self.mask()?;
        if !allowed.is_allowed(token) {
            return Err(GrammarError::Rejected(format!(
                "token {token} is not allowed here by the constraint"
            )));
        }
        self.matcher
            .consume_token(token)
            .map_err(|e| GrammarError::Internal(e.to_string()))?;
        self.taken += 1;
        Ok(())
    }

    /// The tokens allowed next (the end of the sequence among them once the answer is
    /// complete).
    pub fn allowed(&mut self) -> Result<Vec<Token>, GrammarError> {
        if self.is_done() {
            return Ok(vec![self.eos]);
        }
        Ok(self.mask()?.to_list())
    }

    /// Leaves the logits of the tokens it allows next and sets the others to −∞ (tokens
    /// beyond its vocabulary included): only the end of the sequence once it is complete.
    pub fn mask_logits(&mut self, logits: &mut [f32]) -> Result<(), GrammarError> {
        if self.is_done() {
            for (token, logit) in logits.iter_mut().enumerate() {
                if token as u32 != self.eos {
                    *logit = f32::NEG_INFINITY;
                }
            }
            return Ok(());
        }
        let mask = self.mask()?;
        let known = mask.len().min(logits.len());
        // A word of the mask at a time: most are all clear under a constraint (a fill), a
        // few all set (left alone); only the rest bit by bit.
        let (covered, beyond) = logits.split_at_mut(known);
        for (chunk, &word) in covered.chunks_mut(32).zip(mask.as_slice()) {
            match word {
                0 => chunk.fill(f32::NEG_INFINITY),
                u32::MAX => {}
                _ => {
                    for (bit, logit) in chunk.iter_mut().enumerate() {
                        if word & (1 << bit) == 0 {
                            *logit = f32::NEG_INFINITY;
                        }
                    }
                }
            }
        }
        beyond.fill(f32::NEG_INFINITY);
        Ok(())
    }

    fn mask(&mut self) -> Result<SimpleVob, GrammarError> {
        self.matcher
            .compute_mask()
            .map_err(|e| GrammarError::Internal(e.to_string()))
    }

    /// The mocker's next token under the constraint, taken: the end of the sequence once
    /// the answer is complete (or when nothing else is allowed); with probability
    /// `pressure`, the token that brings the answer to its end soonest ([`Self::closer`]);
    /// otherwise the plain draw when the constraint allows it, else the allowed token
    /// `other` points at, uniformly over them.
    pub fn pick(&mut self, pick: &Pick) -> Result<Token, GrammarError> {
        if self.is_done() {
            return Ok(self.eos);
        }
        let mask = self.mask()?;
        let eos_allowed = mask.is_allowed(self.eos);
        let others = mask.num_set() - usize::from(eos_allowed);
        let token = if others == 0 {
            if !eos_allowed {
                return Err(GrammarError::Internal(
                    "the constraint allows no token here".into(),
                ));
            }
            self.eos
        } else if pick.close < pick.pressure {
            self.closer(&mask)
        // The plain draw comes from the mocker's own vocabulary, which may be larger than
        // the constraint's.
        } else if pick.plain != self.eos
            && (pick.plain as usize) < mask.len()
            && mask.is_allowed(pick.plain)
        {
            pick.plain
        } else {
            let n = ((pick.other * others as f64) as usize).min(others - 1);
            nth_allowed(&mask, n, self.eos)
        };
        self.matcher
            .consume_token(token)
            .map_err(|e| GrammarError::Internal(e.to_string()))?;
        self.taken += 1;
        Ok(token)
    }

    /// The allowed token that leads to the end of the answer soonest, greedily: the end of
    /// the sequence when the answer is complete; else the longest token that starts what
    /// the grammar forces next; else the first of the closing tokens (a quote, a brace, a
    /// bracket, then what most often completes a value) that is allowed; else the first
    /// allowed token.
    fn closer(&mut self, mask: &SimpleVob) -> Token {
        if mask.is_allowed(self.eos) {
            return self.eos;
        }
        let forced = self.matcher.compute_ff_bytes();
        if !forced.is_empty() {
            let (token, len) = self.env.tok_trie().prefix_token_id(&forced);
            if len > 0 && mask.is_allowed(token) {
                return token;
            }
        }
        if let Some(&token) = self.closers.iter().find(|&&t| mask.is_allowed(t)) {
            return token;
        }
        nth_allowed(mask, 0, self.eos)
    }
}

/// The `n`-th token (from 0) allowed by `mask` other than `eos`.
fn nth_allowed(mask: &SimpleVob, n: usize, eos: Token) -> Token {
    let mut left = n;
    for (word_index, &word) in mask.as_slice().iter().enumerate() {
        let mut word = word;
        let base = (word_index * 32) as u32;
        if (base..base + 32).contains(&eos) {
            word &= !(1 << (eos - base));
        }
        let count = word.count_ones() as usize;
        if left >= count {
            left -= count;
            continue;
        }
        for _ in 0..left {
            word &= word - 1;
        }
        return base + word.trailing_zeros();
    }
    eos
}
