//! Sampling a synthetic trace from a learned model.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Gamma};
use switchyard_core::trace::MooncakeRecord;

use super::{Arrivals, RateShape, SynthConfig, SynthModel};
use crate::prefix::{CoreTree, Step};
use crate::stats::Sampler;

/// Seeds the stream that scales core node lengths apart from the per-request stream, so a
/// knob that changes lengths does not reshuffle every request.
const NODE_STREAM: u64 = 0x6e6f_6465_6c65_6e73;

/// Seeds the stream of generated gaps apart from the per-request stream, so that
/// `Arrivals::Gamma` keeps the requests of `Arrivals::Learned` and moves only their times.
const GAP_STREAM: u64 = 0x6172_7269_7661_6c73;

/// Hash ids of the core tree's copies, laid out one node after another.
struct CoreLayout {
    /// First id of each core node in copy 0 (the root's entry is unused).
    first_id: Vec<u64>,
    /// Blocks of each core node after scaling.
    len: Vec<u64>,
    /// Ids taken by one copy of the tree; copy `c` adds `c * span`.
    span: u64,
}

impl CoreLayout {
    fn new(core: &CoreTree, multiplier: f64, seed: u64) -> Self {
        let mut rng = StdRng::seed_from_u64(seed ^ NODE_STREAM);
        let mut first_id = Vec::with_capacity(core.nodes().len());
        let mut len = Vec::with_capacity(core.nodes().len());
        let mut next = 0u64;
        for (index, node) in core.nodes().iter().enumerate() {
            let blocks = if index == CoreTree::ROOT {
                0
            } else {
                scale_blocks(u64::from(node.len), multiplier, &mut rng)
            };
            first_id.push(next);
            len.push(blocks);
            next += blocks;
        }
        Self {
            first_id,
            len,
            span: next,
        }
    }
}

/// Samplers of one copy of the core tree, made on a node's first visit.
struct CopySamplers {
    steps: Vec<Option<Sampler<Step>>>,
    tails: Vec<Option<Sampler<u64>>>,
}

impl CopySamplers {
    fn new(nodes: usize) -> Self {
        Self {
            steps: (0..nodes).map(|_| None).collect(),
            tails: (0..nodes).map(|_| None).collect(),
        }
    }
}

impl SynthModel {
    /// Samples a trace. Each request walks the core tree from the root by the learned
    /// next-step distributions (within one of the tree's copies), may continue with a fresh
    /// unique prompt whose length comes from those that left the same node, and gets its
    /// last block's tokens, output length and arrival gap from the empirical distributions.
    /// The same model and config always give the same trace.
    pub fn generate(&self, config: &SynthConfig) -> Vec<MooncakeRecord> {
        let layout = CoreLayout::new(&self.core, config.prefix_len_multiplier, config.seed);
        let copies = config.prefix_root_multiplier.max(1);
        let mut per_copy: Vec<CopySamplers> = (0..copies)
            .map(|_| CopySamplers::new(self.core.nodes().len()))
            .collect();
        let sampling = config.sampling;
        let mut residuals = Sampler::new(&self.residual_tokens, sampling);
        let mut outputs = Sampler::new(&self.output_length, sampling);
        let mut gaps = Sampler::new(&self.inter_arrival_ms, sampling);

        let block_size = u64::from(self.block_size);
        let mut next_unique_id = u64::from(copies) * layout.span;
        let mut rng = StdRng::seed_from_u64(config.seed);
        let count = config.num_requests.unwrap_or(self.source_requests);
        let mut clock_ms = 0.0f64;
        let mut out = Vec::with_capacity(count);
        let mut renewal = match config.arrivals {
            Arrivals::Learned => None,
            Arrivals::Gamma { shape } => {
                let mean = mean_of(&self.inter_arrival_ms);
                // A source of one request, or all at one instant, has no rate to keep.
                (mean > 0.0)
                    .then(|| Gamma::new(shape, mean / shape).ok())
                    .flatten()
                    .map(|gamma| (gamma, StdRng::seed_from_u64(config.seed ^ GAP_STREAM)))
            }
        };

        for index in 0..count {
            if index > 0 {
                // Drawn whatever the arrivals, so the requests stay the same.
                let learned = gaps.draw(&mut rng).unwrap_or(0) as f64;
                let gap = match &mut renewal {
                    Some((gamma, gap_rng)) => gamma.sample(gap_rng),
                    None => learned,
                };
                clock_ms += gap / config.speedup_ratio;
            }
            let copy = rng.random_range(0..copies);
            let samplers = &mut per_copy[copy as usize];
            let offset = u64::from(copy) * layout.span;
            let mut hash_ids = Vec::new();
            let mut node = CoreTree::ROOT;
            let mut unique = false;
            loop {
                let steps = samplers.steps[node]
                    .get_or_insert_with(|| Sampler::new(&self.transitions[node], sampling));
                match steps.draw(&mut rng) {
                    Some(Step::Child(child)) => {
                        let first = layout.first_id[child] + offset;
                        hash_ids.extend(first..first + layout.len[child]);
                        node = child;
                    }
                    Some(Step::Unique) => {
                        unique = true;
                        break;
                    }
                    Some(Step::End) | None => break,
                }
            }
            if unique {
                let tails = samplers.tails[node]
                    .get_or_insert_with(|| Sampler::new(&self.unique_blocks[node], sampling));
                let tail = tails.draw(&mut rng).unwrap_or(1);
                let tail = scale_blocks(tail, config.prompt_len_multiplier, &mut rng);
                hash_ids.extend(next_unique_id..next_unique_id + tail);
                next_unique_id += tail;
            }
            let residual = residuals
                .draw(&mut rng)
                .unwrap_or(block_size)
                .min(block_size);
            let input_length = match hash_ids.len() as u64 {
                0 => 0,
                blocks => (blocks - 1) * block_size + residual,
            };
            let source_osl = outputs.draw(&mut rng).unwrap_or(0);
            out.push(MooncakeRecord {
                media: Vec::new(),
                timestamp: warp(
                    burst(clock_ms, config),
                    &config.rate_profile,
                    config.rate_shape,
                )
                .round() as u64,
                input_length,
                output_length: scale_tokens(source_osl, config.osl_multiplier),
                hash_ids,
                ..MooncakeRecord::default()
            });
        }
        out
    }
}

/// The mean of an empirical distribution of milliseconds (0 when empty).
fn mean_of(cdf: &crate::stats::Cdf<u64>) -> f64 {
    let total = cdf.total();
    if total == 0 {
        return 0.0;
    }
    let sum: f64 = cdf.counts().map(|(ms, n)| ms as f64 * n as f64).sum();
    sum / total as f64
}

/// Scales a block count with stochastic rounding (so the mean scales exactly), keeping at
/// least one block. Always draws once from `rng`, so the multiplier's value never shifts
/// the rest of the random stream.
fn scale_blocks(blocks: u64, multiplier: f64, rng: &mut impl Rng) -> u64 {
    let scaled = blocks as f64 * multiplier;
    let draw: f64 = rng.random();
    let whole = scaled.floor();
    let rounded = if draw < scaled - whole {
        whole + 1.0
    } else {
        whole
    };
    (rounded as u64).max(1)
}

/// Scales a token count, rounding to nearest; a non-zero count stays non-zero.
fn scale_tokens(tokens: u64, multiplier: f64) -> u64 {
    if tokens == 0 {
        return 0;
    }
    ((tokens as f64 * multiplier).round() as u64).max(1)
}

/// The arrival time `ms` with its period's arrivals squeezed into the period's first
/// `burst_duty` (order kept).
fn burst(ms: f64, config: &SynthConfig) -> f64 {
    if config.burst_duty >= 1.0 {
        return ms;
    }
    let period = config.burst_period_ms;
    let start = (ms / period).floor() * period;
    start + (ms - start) * config.burst_duty
}

/// The arrival time `ms` of a trace at the learned rate, moved so that the rate follows
/// `profile` (see [`SynthConfig::rate_profile`]) in `shape`: the output time τ at which the
/// multiplier's integral reaches `ms`.
fn warp(ms: f64, profile: &[(f64, f64)], shape: RateShape) -> f64 {
    let (mut start, mut multiplier, mut left) = (0.0, 1.0, ms);
    for &(at, next) in profile {
        let width = at - start;
        let (covered, slope) = match shape {
            RateShape::Steps => (width * multiplier, 0.0),
            RateShape::Linear if width > 0.0 => (
                width * (multiplier + next) / 2.0,
                (next - multiplier) / width,
            ),
            RateShape::Linear => (0.0, 0.0),
        };
        if left <= covered {
            // Within the segment the integral is m·x + slope·x²/2; solved for x in the
            // form that stays exact as the slope goes to 0.
            let root = (multiplier * multiplier + 2.0 * slope * left)
                .max(0.0)
                .sqrt();
            return start + 2.0 * left / (multiplier + root);
        }
        left -= covered;
        start = at;
        multiplier = next;
    }
    start + left / multiplier
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rate_profile_compresses_arrivals_where_the_rate_is_higher() {
        // Learned rate 1/s. From 10 s, 5×; from 20 s, back to 1×.
        let profile = [(10_000.0, 5.0), (20_000.0, 1.0)];
        assert_eq!(warp(5_000.0, &profile, RateShape::Steps), 5_000.0);
        // 10 s in: the burst starts; 50 source seconds fit in its 10 s.
        assert_eq!(warp(10_000.0, &profile, RateShape::Steps), 10_000.0);
        assert_eq!(warp(35_000.0, &profile, RateShape::Steps), 15_000.0);
        assert_eq!(warp(60_000.0, &profile, RateShape::Steps), 20_000.0);
        assert_eq!(warp(70_000.0, &profile, RateShape::Steps), 30_000.0);
        assert_eq!(warp(1_234.0, &[], RateShape::Steps), 1_234.0);
        // Arrivals per second in each phase: 1, 5, 1.
        let per_phase = |lo: f64, hi: f64| {
            (0..100_000)
                .map(|i| warp(f64::from(i), &profile, RateShape::Steps))
                .filter(|t| (lo..hi).contains(t))
                .count()
        };
        assert_eq!(per_phase(0.0, 10_000.0), 10_000);
        assert_eq!(per_phase(10_000.0, 20_000.0), 50_000);
        assert_eq!(per_phase(20_000.0, 30_000.0), 10_000);
    }

    #[test]
    fn a_linear_rate_profile_ramps_between_its_points() {
        // From 1× at 0 to 3× at 10 s (20 source seconds), then 3× on.
        let profile = [(10_000.0, 3.0)];
        let at = |ms: f64| warp(ms, &profile, RateShape::Linear);
        // m(t) = 1 + 0.2 t (seconds): t + 0.1 t² = 5 at t = −5 + √75.
        assert!((at(5_000.0) - (75f64.sqrt() - 5.0) * 1e3).abs() < 1e-6);
        assert!((at(20_000.0) - 10_000.0).abs() < 1e-6);
        assert!((at(26_000.0) - 12_000.0).abs() < 1e-6);
        // Flat segments are steps; a zero-width segment jumps.
        let flat = [(5_000.0, 1.0), (5_000.0, 2.0), (10_000.0, 2.0)];
        for ms in [0.0, 2_500.0, 5_000.0, 9_000.0, 15_000.0, 40_000.0] {
            let steps = warp(ms, &flat, RateShape::Steps);
            assert!(
                (warp(ms, &flat, RateShape::Linear) - steps).abs() < 1e-6,
                "{ms}"
            );
        }
        // Arrivals per second along the ramp follow the multiplier at its middle, and
        // never run backwards.
        let times: Vec<f64> = (0..30_000).map(|i| at(f64::from(i))).collect();
        assert!(times.windows(2).all(|w| w[0] < w[1]));
        for second in 0..10 {
            let (lo, hi) = (f64::from(second) * 1e3, f64::from(second + 1) * 1e3);
            let n = times.iter().filter(|t| (lo..hi).contains(*t)).count() as f64;
            let expected = 1_000.0 * (1.0 + 0.2 * (f64::from(second) + 0.5));
            assert!(
                (n - expected).abs() <= 1.0,
                "second {second}: {n} against {expected}"
            );
        }
    }

    #[test]
    fn stochastic_rounding_keeps_the_mean() {
        let mut rng = StdRng::seed_from_u64(3);
        let n = 20_000;
        let total: u64 = (0..n).map(|_| scale_blocks(3, 1.5, &mut rng)).sum();
        let mean = total as f64 / n as f64;
        assert!((mean - 4.5).abs() < 0.05, "mean {mean}");
        assert_eq!(scale_blocks(7, 1.0, &mut rng), 7);
        assert_eq!(scale_blocks(1, 0.1, &mut rng), 1);
    }

    #[test]
    fn token_scaling_keeps_non_zero_counts() {
        assert_eq!(scale_tokens(0, 3.0), 0);
        assert_eq!(scale_tokens(3, 0.1), 1);
        assert_eq!(scale_tokens(100, 1.5), 150);
    }

    #[test]
    fn stratified_sampling_at_source_scale_visits_the_core_as_the_source_did() {
        let rows: Vec<MooncakeRecord> = [&[1u64, 2, 3][..], &[1, 2, 4], &[1, 5], &[1, 5], &[6]]
            .iter()
            .enumerate()
            .map(|(i, ids)| MooncakeRecord {
                media: Vec::new(),
                timestamp: i as u64 * 10,
                input_length: ids.len() as u64 * 16,
                output_length: 4,
                hash_ids: ids.to_vec(),
                ..MooncakeRecord::default()
            })
            .collect();
        let model = SynthModel::learn(&rows, 16).unwrap();
        let config = SynthConfig {
            block_size: 16,
            ..SynthConfig::default()
        };
        let out = model.generate(&config);
        // Core blocks 1, 2 and 5 (ids 0, 1, 2 here): visited 4, 2 and 2 times as in the source.
        let visits = |id: u64| out.iter().filter(|r| r.hash_ids.contains(&id)).count();
        let mut core_visits: Vec<_> = (0..3).map(visits).collect();
        core_visits.sort_unstable();
        assert_eq!(core_visits, vec![2, 2, 4]);
        assert_eq!(out.last().map(|r| r.timestamp), Some(40));
    }

    #[test]
    fn bursts_squeeze_each_period_and_keep_the_rate_and_order() {
        // 100 requests 1 s apart: with 10 s periods at a duty of 0.2, each period's ten
        // arrive within its first 2 s, 200 ms apart; the span and the order stay.
        let rows: Vec<MooncakeRecord> = (0..100)
            .map(|i| MooncakeRecord {
                media: Vec::new(),
                timestamp: i * 1000,
                input_length: 16,
                output_length: 4,
                hash_ids: vec![i],
                ..MooncakeRecord::default()
            })
            .collect();
        let model = SynthModel::learn(&rows, 16).unwrap();
        let config = SynthConfig {
            block_size: 16,
            burst_period_ms: 10_000.0,
            burst_duty: 0.2,
            ..SynthConfig::default()
        };
        let out = model.generate(&config);
        let stamps: Vec<u64> = out.iter().map(|r| r.timestamp).collect();
        assert!(stamps.windows(2).all(|w| w[0] <= w[1]));
        for (i, &t) in stamps.iter().enumerate() {
            let i = i as u64;
            assert_eq!(t, (i / 10) * 10_000 + (i % 10) * 200, "request {i}");
        }
        // Off (duty 1): as learned.
        let plain = model.generate(&SynthConfig {
            block_size: 16,
            ..SynthConfig::default()
        });
        assert_eq!(plain.last().map(|r| r.timestamp), Some(99_000));
        let bad = SynthConfig {
            burst_duty: 0.0,
            ..SynthConfig::default()
        };
        assert!(
            bad.validate()
                .unwrap_err()
                .to_string()
                .starts_with("--burst-duty")
        );
    }

    #[test]
    fn gamma_arrivals_keep_the_requests_and_the_rate_and_break_the_lumps() {
        // Ten requests a stamp, stamps 3 s apart (the Mooncake traces' shape): 300 ms a gap.
        let rows: Vec<MooncakeRecord> = (0..2_000u64)
            .map(|i| MooncakeRecord {
                media: Vec::new(),
                timestamp: (i / 10) * 3_000,
                input_length: 16 * (i % 7 + 1),
                output_length: 4 + i % 5,
                hash_ids: (0..i % 7 + 1).map(|b| i * 10 + b).collect(),
                ..MooncakeRecord::default()
            })
            .collect();
        let model = SynthModel::learn(&rows, 16).unwrap();
        let config = |arrivals| SynthConfig {
            block_size: 16,
            num_requests: Some(20_000),
            seed: 5,
            arrivals,
            ..SynthConfig::default()
        };
        let learned = model.generate(&config(Arrivals::Learned));
        let stamps = |trace: &[MooncakeRecord]| -> Vec<f64> {
            trace.iter().map(|r| r.timestamp as f64).collect()
        };
        let distinct = |trace: &[MooncakeRecord]| {
            let mut t: Vec<u64> = trace.iter().map(|r| r.timestamp).collect();
            t.dedup();
            t.len()
        };
        // (mean gap, coefficient of variation of the gaps)
        let gap_stats = |t: &[f64]| {
            let gaps: Vec<f64> = t.windows(2).map(|w| w[1] - w[0]).collect();
            let n = gaps.len() as f64;
            let mean = gaps.iter().sum::<f64>() / n;
            let var = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / n;
            (mean, var.sqrt() / mean)
        };
        assert!(distinct(&learned) < 2_500, "learned gaps keep the lumps");
        for (shape, cv) in [(1.0, 1.0), (4.0, 0.5), (0.25, 2.0)] {
            let renewal = model.generate(&config(Arrivals::Gamma { shape }));
            for (a, b) in learned.iter().zip(&renewal) {
                assert_eq!(
                    (&a.hash_ids, a.input_length, a.output_length),
                    (&b.hash_ids, b.input_length, b.output_length)
                );
            }
            let t = stamps(&renewal);
            assert!(t.windows(2).all(|w| w[0] <= w[1]));
            let (mean, got_cv) = gap_stats(&t);
            assert!(
                (mean / 300.0 - 1.0).abs() < 0.05,
                "shape {shape}: mean gap {mean}"
            );
            assert!(
                (got_cv / cv - 1.0).abs() < 0.1,
                "shape {shape}: cv {got_cv}"
            );
            if shape >= 1.0 {
                assert!(distinct(&renewal) > 19_000, "shape {shape}: lumps left");
            }
        }
        let bad = SynthConfig {
            arrivals: Arrivals::Gamma { shape: 0.0 },
            ..SynthConfig::default()
        };
        assert!(
            bad.validate()
                .unwrap_err()
                .to_string()
                .starts_with("--burstiness")
        );
    }
}
