//! The sequence of requests a run sends and, for open-loop shapes, when.

use std::time::Duration;

use rand::SeedableRng;
use rand::rngs::StdRng;
use rand_distr::{Distribution, Exp};
use switchyard_core::trace::{MOONCAKE_BLOCK_SIZE, MooncakeRecord};

use super::config::{BenchConfig, LoadShape, RequestSource};
use super::prompt::PromptBuilder;

/// One request, ready to send.
#[derive(Debug, Clone)]
pub(crate) struct PlannedRequest {
    pub index: usize,
    /// Offset from the start of the run for open-loop shapes; `None` in a closed loop.
    pub scheduled: Option<Duration>,
    pub prompt: String,
    /// A session's earlier messages (role, content), sent before `prompt`.
    pub history: Option<std::sync::Arc<Vec<(&'static str, String)>>>,
    /// Tokens in the prompt under the one-word-one-token assumption.
    pub prompt_tokens: u64,
    pub max_tokens: u64,
}

/// Yields the run's requests in order, at most `limit` of them.
#[derive(Debug)]
pub(crate) struct Plan {
    source: Source,
    prompts: PromptBuilder,
    limit: Option<usize>,
    next: usize,
    arrivals: Arrivals,
}

#[derive(Debug)]
enum Source {
    /// Rows in arrival order.
    Trace(Vec<MooncakeRecord>),
    Synthetic {
        input_tokens: u64,
        output_tokens: u64,
    },
}

#[derive(Debug)]
enum Arrivals {
    /// At trace timestamps (relative to the first) divided by the speedup.
    Replay {
        origin_ms: u64,
        speedup: f64,
    },
    Poisson {
        gaps: Exp<f64>,
        rng: Box<StdRng>,
        clock: Duration,
    },
    ClosedLoop,
}

/// Marks synthetic prompt ids so they never meet a trace's.
const SYNTHETIC_ID_BIT: u64 = 1 << 63;

impl Plan {
    /// Assumes a validated config.
    pub fn new(config: &BenchConfig) -> Self {
        let (source, block_size) = match &config.source {
            RequestSource::Trace {
                records,
                block_size,
            } => {
                let mut sorted = records.clone();
                sorted.sort_by_key(|r| r.timestamp);
                (Source::Trace(sorted), *block_size)
            }
            RequestSource::Synthetic {
                input_tokens,
                output_tokens,
            } => (
                Source::Synthetic {
                    input_tokens: *input_tokens,
                    output_tokens: *output_tokens,
                },
                MOONCAKE_BLOCK_SIZE,
            ),
        };
        let arrivals = match (config.shape, &source) {
            (LoadShape::Replay { speedup }, Source::Trace(rows)) => Arrivals::Replay {
                origin_ms: rows.first().map_or(0, |r| r.timestamp),
                speedup,
            },
            (LoadShape::Poisson { rate }, _) => match Exp::new(rate) {
                Ok(gaps) => Arrivals::Poisson {
                    gaps,
                    rng: Box::new(StdRng::seed_from_u64(config.seed)),
                    clock: Duration::ZERO,
                },
                Err(_) => Arrivals::ClosedLoop,
            },
            _ => Arrivals::ClosedLoop,
        };
        Self {
            source,
            prompts: PromptBuilder::new(block_size, config.seed),
            limit: config.request_limit(),
            next: 0,
            arrivals,
        }
    }

    /// The next request, or `None` when the plan is exhausted.
    pub fn next_request(&mut self) -> Option<PlannedRequest> {
        let index = self.next;
        if self.limit.is_some_and(|limit| index >= limit) {
            return None;
        }
        let (hash_ids, input_length, max_tokens, timestamp) = match &self.source {
            Source::Trace(rows) => {
                let is_replay = matches!(self.arrivals, Arrivals::Replay { .. });
                if is_replay && index >= rows.len() {
                    return None;
                }
                // Other shapes start the trace over when they outrun it.
                let row = rows.get(index % rows.len().max(1))?;
                (
                    row.hash_ids.clone(),
                    row.input_length,
                    row.output_length.max(1),
                    row.timestamp,
                )
            }
            Source::Synthetic {
                input_tokens,
                output_tokens,
            } => {
                let blocks = input_tokens.div_ceil(u64::from(self.prompts.block_size));
                let first = SYNTHETIC_ID_BIT | ((index as u64) << 20);
                (
                    (first..first + blocks).collect(),
                    *input_tokens,
                    *output_tokens,
                    0,
                )
            }
        };
        let scheduled = match &mut self.arrivals {
            Arrivals::Replay { origin_ms, speedup } => Some(Duration::from_secs_f64(
                timestamp.saturating_sub(*origin_ms) as f64 / 1e3 / *speedup,
            )),
            Arrivals::Poisson { gaps, rng, clock } => {
                let at = *clock;
                *clock += Duration::from_secs_f64(gaps.sample(rng));
                Some(at)
            }
            Arrivals::ClosedLoop => None,
        };
        self.next += 1;
        Some(PlannedRequest {
            index,
            scheduled,
            prompt: self.prompts.prompt(&hash_ids, input_length),
            history: None,
            prompt_tokens: input_length,
            max_tokens,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trace_config(shape: LoadShape) -> BenchConfig {
        let records = [(2000, vec![1, 2]), (1000, vec![1]), (5000, vec![3])]
            .into_iter()
            .map(|(timestamp, hash_ids)| MooncakeRecord {
                media: Vec::new(),
                timestamp,
                input_length: 6 * hash_ids.len() as u64 - 1,
                output_length: 3,
                hash_ids,
                ..MooncakeRecord::default()
            })
            .collect();
        let mut config = BenchConfig::new("http://h", "m");
        config.source = RequestSource::Trace {
            records,
            block_size: 6,
        };
        config.shape = shape;
        config
    }

    fn drain(plan: &mut Plan) -> Vec<PlannedRequest> {
        std::iter::from_fn(|| plan.next_request()).collect()
    }

    #[test]
    fn replay_sorts_rows_and_scales_their_timestamps() {
        let mut plan = Plan::new(&trace_config(LoadShape::Replay { speedup: 2.0 }));
        let requests = drain(&mut plan);
        let at: Vec<_> = requests.iter().map(|r| r.scheduled).collect();
        assert_eq!(
            at,
            vec![
                Some(Duration::ZERO),
                Some(Duration::from_millis(500)),
                Some(Duration::from_millis(2000))
            ]
        );
        assert_eq!(requests[1].prompt_tokens, 11);
        assert_eq!(requests[1].prompt.split(' ').count(), 11);
        // Rows 0 and 1 (after sorting) share hash id 1: the 5-word prompt of the first is
        // the start of the second's.
        assert!(requests[1].prompt.starts_with(&requests[0].prompt));
        assert_ne!(requests[2].prompt[..10], requests[1].prompt[..10]);
    }

    #[test]
    fn closed_loop_cycles_the_trace_up_to_the_limit() {
        let mut config = trace_config(LoadShape::Concurrency { clients: 2 });
        config.max_requests = Some(7);
        let requests = drain(&mut Plan::new(&config));
        assert_eq!(requests.len(), 7);
        assert!(requests.iter().all(|r| r.scheduled.is_none()));
        assert_eq!(requests[0].prompt, requests[3].prompt);
    }

    #[test]
    fn poisson_gaps_average_one_over_the_rate() {
        let mut config = BenchConfig::new("http://h", "m");
        config.shape = LoadShape::Poisson { rate: 50.0 };
        config.max_requests = Some(2001);
        config.source = RequestSource::Synthetic {
            input_tokens: 3,
            output_tokens: 2,
        };
        let requests = drain(&mut Plan::new(&config));
        let last = requests.last().and_then(|r| r.scheduled).unwrap();
        let mean_gap = last.as_secs_f64() / 2000.0;
        assert!((mean_gap - 0.02).abs() < 0.002, "mean gap {mean_gap}");
        assert_ne!(requests[0].prompt, requests[1].prompt);
        assert_eq!(requests[0].max_tokens, 2);
    }
}
