//! Replica counts from a performance model: how much one worker prefills and decodes per
//! second while holding the latency targets, and how many workers the predicted traffic
//! needs.
//!
//! The model is the one the mocker runs and the router predicts with
//! ([`PerfModel`]: Dynamo's polynomials, or a profile measured by `switchyard profile`), so
//! what the simulator shows of a plan holds for the engines it was measured on.
//!
//! - Prefill: a worker prefilling prompts of the predicted length back to back computes
//!   `isl / prefill_time(isl)` tokens per second; the work to do is the predicted request
//!   rate × the prompt tokens not found in cache.
//! - Decode: at the mean context (`isl + osl / 2`), the largest batch whose step time stays
//!   within the ITL target sets a worker's tokens per second; the work is rate × OSL.
//! - Aggregated workers do both on one engine, a mixed step taking the prefill time plus
//!   the decode time: a worker prefilling a share `f` of the time decodes the rest of it,
//!   its sequences waiting through the prefill chunks, so its mean ITL is about
//!   `step(b) / (1 − f)`. The fleet is the fewest workers whose share of the prompts leaves
//!   a batch within the ITL target that decodes their share of the output tokens.
//! - Bursts: requests that arrive together (a client fanning out, a trace's batch of
//!   simultaneous arrivals) are prefilled within the TTFT target only if enough workers
//!   are free to share them. From the prompt tokens that arrived per metric pull, the
//!   fewest workers whose prefill within a TTFT target leaves at most a given share of
//!   the tokens over (summed over every window of that length) is the room to keep; an
//!   aggregated fleet keeps it beside its decode need. A mean rate hides these bursts,
//!   and a utilization below 1 pays for them in proportion to the load: too little for a
//!   small fleet, too much for a large one.
//! - Correction: observed TTFT over the model's prefill time scales the prefill need down
//!   (never up: observed TTFT includes queueing the model does not, which more workers would
//!   remove), and observed ITL over the model's step time at the observed batch tightens (or
//!   relaxes) the ITL target the decode throughput is read at. Both clamped to [0.25, 4].

use serde::Serialize;
use switchyard_core::perf::{PerfModel, StepShape};

/// Per-worker throughput at the targets.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Capacity {
    /// Prompt tokens per second one worker prefills.
    pub prefill_tokens_per_s: f64,
    /// Whether a lone prompt of this length meets the TTFT target at all.
    pub ttft_reachable: bool,
    /// Largest batch the cache holds (within `max_kv_usage`).
    pub max_batch: u32,
    /// Largest batch holding the ITL target, and the tokens per second it decodes.
    pub decode_batch: u32,
    pub decode_tokens_per_s: f64,
    /// Whether a batch of one meets the ITL target.
    pub itl_reachable: bool,
}

/// What the SLA rules need to know about one worker.
#[derive(Debug, Clone, Copy)]
pub struct WorkerModel<'a> {
    pub perf: &'a PerfModel,
    pub capacity_blocks: u64,
    pub block_size: u32,
    /// Share of the cache a decode batch may fill.
    pub max_kv_usage: f64,
}

impl WorkerModel<'_> {
    fn decode_shape(&self, batch: u32, context: f64) -> StepShape {
        let context = context.max(1.0);
        let blocks_each = (context / f64::from(self.block_size)).ceil() as u64;
        StepShape {
            prefill_tokens: 0,
            prefill_context: 0,
            decode_seqs: batch,
            decode_kv_tokens: (f64::from(batch) * context) as u64,
            active_blocks: u64::from(batch) * blocks_each,
            capacity_blocks: self.capacity_blocks,
        }
    }

    /// The step time of a decode batch, in ms.
    pub fn decode_ms(&self, batch: u32, context: f64) -> f64 {
        self.perf.decode_ms(&self.decode_shape(batch, context))
    }

    /// Throughput at these targets for prompts of `isl` tokens and outputs of `osl`.
    pub fn capacity(&self, isl: f64, osl: f64, ttft_ms: f64, itl_ms: f64) -> Capacity {
        let isl_tokens = isl.clamp(1.0, f64::from(u32::MAX)) as u32;
        let prefill_ms = self.perf.prefill_ms(isl_tokens).max(1e-3);
        let context = isl + osl / 2.0;
        // The batch the cache can hold at this context.
        let blocks_each = (context.max(1.0) / f64::from(self.block_size))
            .ceil()
            .max(1.0);
        let usable = self.capacity_blocks as f64 * self.max_kv_usage.clamp(0.0, 1.0);
        let max_batch = ((usable / blocks_each).floor() as u32).max(1);
        // Step time grows with the batch: the largest batch within the target, by bisection.
        let within = |batch: u32| self.decode_ms(batch, context) <= itl_ms;
        let batch = if !within(1) {
            1
        } else if within(max_batch) {
            max_batch
        } else {
            let (mut lo, mut hi) = (1u32, max_batch);
            while hi - lo > 1 {
                let mid = lo + (hi - lo) / 2;
                if within(mid) {
                    lo = mid;
                } else {
                    hi = mid;
                }
            }
            lo
        };
        let step_ms = self.decode_ms(batch, context).max(1e-3);
        Capacity {
            prefill_tokens_per_s: f64::from(isl_tokens) / (prefill_ms / 1000.0),
            ttft_reachable: prefill_ms <= ttft_ms,
            max_batch,
            decode_batch: batch,
            decode_tokens_per_s: f64::from(batch) / (step_ms / 1000.0),
            itl_reachable: within(1),
        }
    }
}

/// The traffic to plan for (predicted for the next interval).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Demand {
    /// Requests per second.
    pub rate: f64,
    pub isl: f64,
    pub osl: f64,
    /// Share of prompt tokens found in cache.
    pub hit_rate: f64,
}

/// How far observation is from the model: multipliers on the prefill need and on the ITL
/// target (1 when nothing was measured or correction is off).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Correction {
    pub prefill: f64,
    pub decode: f64,
}

impl Default for Correction {
    fn default() -> Self {
        Correction {
            prefill: 1.0,
            decode: 1.0,
        }
    }
}

impl Correction {
    /// From an interval's observed mean TTFT and ITL, its mean prompt length and batch,
    /// and the share of the time the decoding workers spent prefilling (0 for decode-only
    /// workers).
    pub fn observed(
        model: &WorkerModel<'_>,
        isl: f64,
        osl: f64,
        running_per_worker: f64,
        prefill_share: f64,
        ttft_ms: Option<f64>,
        itl_ms: Option<f64>,
    ) -> Correction {
        let clamp = |v: f64| {
            if v.is_finite() {
                v.clamp(0.25, 4.0)
            } else {
                1.0
            }
        };
        let mut c = Correction::default();
        if let Some(ttft) = ttft_ms.filter(|_| isl >= 1.0) {
            let expected = model.perf.prefill_ms(isl as u32).max(1e-3);
            c.prefill = clamp(ttft / expected).min(1.0);
        }
        if let Some(itl) = itl_ms {
            let batch = running_per_worker.round().max(1.0) as u32;
            let stretch = 1.0 - prefill_share.clamp(0.0, 0.9);
            let expected = model.decode_ms(batch, isl + osl / 2.0).max(1e-3) / stretch;
            c.decode = clamp(itl / expected);
        }
        c
    }
}

/// Workers needed: fractional for the prefill and decode pools (the caller rounds up and
/// applies the budget), whole for an aggregated fleet doing both.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Need {
    pub prefill: f64,
    pub decode: f64,
    pub aggregated: f64,
    /// Workers whose prefill absorbs the bursts of arrivals ([`burst_workers`]); 0 when
    /// not sized for bursts.
    pub burst: f64,
    pub capacity: Capacity,
}

/// Most aggregated workers [`need`] considers.
const MAX_AGGREGATED: u32 = 100_000;

/// Workers needed for `demand` at the targets.
pub fn need(
    model: &WorkerModel<'_>,
    demand: &Demand,
    ttft_ms: f64,
    itl_ms: f64,
    correction: &Correction,
) -> Need {
    let itl_target = itl_ms / correction.decode;
    let capacity = model.capacity(demand.isl, demand.osl, ttft_ms, itl_target);
    let uncached = demand.isl * (1.0 - demand.hit_rate.clamp(0.0, 1.0));
    let prefill =
        demand.rate * uncached * correction.prefill / capacity.prefill_tokens_per_s.max(1e-9);
    let decode = demand.rate * demand.osl / capacity.decode_tokens_per_s.max(1e-9);
    let aggregated = aggregated_workers(model, demand, prefill, itl_target, &capacity);
    Need {
        prefill: prefill.max(0.0),
        decode: decode.max(0.0),
        aggregated: f64::from(aggregated),
        burst: 0.0,
        capacity,
    }
}

/// Workers that prefill the bursts in `arrivals` (prompt tokens to compute that arrived
/// in each metric pull, oldest first) within a TTFT target: every run of `window` pulls
/// (one run of them all if fewer) is a burst, and one worker prefills `per_worker` tokens
/// in a window. The fewest workers, fractional, that leave at most `overflow` of the
/// tokens over (beyond what they prefill, summed over the windows) of all the windows'.
pub fn burst_workers(arrivals: &[f64], window: usize, per_worker: f64, overflow: f64) -> f64 {
    let window = window.clamp(1, arrivals.len().max(1));
    let bursts: Vec<f64> = arrivals
        .windows(window)
        .map(|w| w.iter().sum::<f64>().max(0.0))
        .collect();
    let total: f64 = bursts.iter().sum();
    if !(total > 0.0 && per_worker > 0.0) {
        return 0.0;
    }
    let over = |workers: f64| {
        let room = workers * per_worker;
        bursts.iter().map(|b| (b - room).max(0.0)).sum::<f64>() / total
    };
    if over(0.0) <= overflow {
        return 0.0;
    }
    // The largest burst fits whole in `hi` workers; `over` falls as workers grow.
    let (mut lo, mut hi) = (
        0.0,
        bursts.iter().fold(0.0, |a: f64, &b| a.max(b)) / per_worker,
    );
    for _ in 0..50 {
        let mid = (lo + hi) / 2.0;
        if over(mid) <= overflow {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    hi
}

/// The fewest aggregated workers that carry `prefill_load` worker-seconds of prefill per
/// second and decode the demand's output within the ITL target (see the module docs).
fn aggregated_workers(
    model: &WorkerModel<'_>,
    demand: &Demand,
    prefill_load: f64,
    itl_target: f64,
    capacity: &Capacity,
) -> u32 {
    let tokens = demand.rate * demand.osl;
    if !(tokens > 0.0 || prefill_load > 0.0) {
        return 0;
    }
    let context = demand.isl + demand.osl / 2.0;
    let max_batch = capacity.max_batch.max(1);
    // The decode tokens per second of one worker prefilling a share `f` of the time.
    let decode_rate = |f: f64| -> f64 {
        let budget = itl_target * (1.0 - f);
        if model.decode_ms(1, context) > budget {
            return 0.0;
        }
        let (mut lo, mut hi) = (1u32, max_batch);
        if model.decode_ms(hi, context) <= budget {
            lo = hi;
        }
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if model.decode_ms(mid, context) <= budget {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        f64::from(lo) / (model.decode_ms(lo, context).max(1e-3) / 1000.0) * (1.0 - f)
    };
    let feasible = |n: u32| {
        let f = prefill_load / f64::from(n);
        f < 0.95 && decode_rate(f) * f64::from(n) >= tokens
    };
    if !feasible(MAX_AGGREGATED) {
        return MAX_AGGREGATED;
    }
    let (mut lo, mut hi) = (1u32, MAX_AGGREGATED);
    if feasible(1) {
        return 1;
    }
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if feasible(mid) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    hi
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLY: PerfModel = PerfModel::Polynomial;

    fn model() -> WorkerModel<'static> {
        WorkerModel {
            perf: &POLY,
            capacity_blocks: 16_384,
            block_size: 64,
            max_kv_usage: 1.0,
        }
    }

    #[test]
    fn the_decode_batch_is_the_largest_within_the_itl_target() {
        let m = model();
        let c = m.capacity(4000.0, 200.0, 1000.0, 30.0);
        assert!(c.itl_reachable);
        assert!(m.decode_ms(c.decode_batch, 4100.0) <= 30.0);
        assert!(m.decode_ms(c.decode_batch + 1, 4100.0) > 30.0);
        // A looser target allows a bigger batch and more tokens per second.
        let loose = m.capacity(4000.0, 200.0, 1000.0, 50.0);
        assert!(loose.decode_batch > c.decode_batch);
        assert!(loose.decode_tokens_per_s > c.decode_tokens_per_s);
    }

    #[test]
    fn the_batch_is_capped_by_the_cache_and_a_tight_target_falls_back_to_one() {
        let m = WorkerModel {
            capacity_blocks: 100,
            ..model()
        };
        // 100 blocks of 64 tokens hold 10 sequences of 640 tokens; the polynomial's step
        // time stays under 100 ms at any usage.
        assert_eq!(m.capacity(600.0, 80.0, 1000.0, 100.0).decode_batch, 10);
        // Keeping a fifth of the cache for admissions: 8.
        let kept = WorkerModel {
            max_kv_usage: 0.8,
            ..m
        };
        assert_eq!(kept.capacity(600.0, 80.0, 1000.0, 100.0).decode_batch, 8);
        let tight = model().capacity(600.0, 80.0, 1000.0, 1.0);
        assert!(!tight.itl_reachable);
        assert_eq!(tight.decode_batch, 1);
    }

    #[test]
    fn prefill_need_scales_with_rate_and_uncached_tokens() {
        let m = model();
        let demand = Demand {
            rate: 10.0,
            isl: 2000.0,
            osl: 100.0,
            hit_rate: 0.0,
        };
        let n = need(&m, &demand, 500.0, 50.0, &Correction::default());
        let per_worker = 2000.0 / (POLY.prefill_ms(2000) / 1000.0);
        assert!((n.prefill - 10.0 * 2000.0 / per_worker).abs() < 1e-9);
        let half_cached = need(
            &m,
            &Demand {
                hit_rate: 0.5,
                ..demand
            },
            500.0,
            50.0,
            &Correction::default(),
        );
        assert!((half_cached.prefill - n.prefill / 2.0).abs() < 1e-9);
        let double = need(
            &m,
            &Demand {
                rate: 20.0,
                ..demand
            },
            500.0,
            50.0,
            &Correction::default(),
        );
        assert!((double.decode - 2.0 * n.decode).abs() < 1e-9);
        // Aggregated workers share their time: at least the two needs together.
        assert!(n.aggregated >= (n.prefill + n.decode).ceil(), "{n:?}");
        assert!(double.aggregated > n.aggregated);
    }

    #[test]
    fn aggregated_workers_leave_decode_time_for_the_itl_target() {
        let m = model();
        let demand = Demand {
            rate: 4.0,
            isl: 8000.0,
            osl: 300.0,
            hit_rate: 0.0,
        };
        let n = need(&m, &demand, 2000.0, 50.0, &Correction::default());
        let workers = n.aggregated as u32;
        // Checked by hand against the model: with `workers`, each prefills a share f of
        // the time and a batch within 50 ms · (1 − f) decodes its share of the tokens;
        // with one fewer it cannot.
        let holds = |w: u32| {
            let f = n.prefill / f64::from(w);
            let budget = 50.0 * (1.0 - f);
            (1..=n.capacity.max_batch)
                .filter(|&b| m.decode_ms(b, 8150.0) <= budget)
                .map(|b| f64::from(b) / (m.decode_ms(b, 8150.0) / 1000.0) * (1.0 - f))
                .fold(0.0, f64::max)
                * f64::from(w)
                >= 4.0 * 300.0
                && f < 0.95
        };
        assert!(holds(workers), "{n:?}");
        assert!(workers == 1 || !holds(workers - 1), "{n:?}");
        // No traffic, no workers.
        let idle = need(
            &m,
            &Demand {
                rate: 0.0,
                ..demand
            },
            2000.0,
            50.0,
            &Correction::default(),
        );
        assert_eq!(idle.aggregated, 0.0);
    }

    #[test]
    fn a_burst_needs_the_workers_that_prefill_it_within_the_target() {
        // 30,000 tokens at once, 10,000 per worker within the target: three workers for
        // all of it.
        let clump = [0.0, 0.0, 30_000.0, 0.0, 0.0];
        assert!((burst_workers(&clump, 2, 10_000.0, 0.0) - 3.0).abs() < 1e-6);
        // The clump is in two windows of two pulls; leaving a tenth of the tokens over
        // takes 2.7 workers (0.3 × 10,000 over in each window: 6,000 of 60,000).
        assert!((burst_workers(&clump, 2, 10_000.0, 0.1) - 2.7).abs() < 1e-6);
        // The same tokens spread evenly are 12,000 a window: 1.2 workers.
        let spread = [6_000.0; 5];
        assert!((burst_workers(&spread, 2, 10_000.0, 0.0) - 1.2).abs() < 1e-6);
        assert!((burst_workers(&spread, 2, 10_000.0, 0.1) - 1.08).abs() < 1e-6);
        // Fewer pulls than a window: one burst of them all.
        assert!((burst_workers(&[5_000.0, 5_000.0], 4, 10_000.0, 0.0) - 1.0).abs() < 1e-6);
        // Nothing arrived, or nothing is allowed under: no workers.
        assert_eq!(burst_workers(&[], 2, 10_000.0, 0.0), 0.0);
        assert_eq!(burst_workers(&[0.0; 4], 2, 10_000.0, 0.0), 0.0);
        assert_eq!(burst_workers(&clump, 2, 10_000.0, 1.0), 0.0);
    }

    #[test]
    fn corrections_follow_observation() {
        let m = model();
        // Observed ITL twice the model's: the decode model is read at half the target.
        let expected_itl = m.decode_ms(8, 1100.0);
        let c = Correction::observed(&m, 1000.0, 200.0, 8.0, 0.0, None, Some(2.0 * expected_itl));
        assert!((c.decode - 2.0).abs() < 1e-9);
        // Workers prefilling half the time are expected to take twice as long per token.
        let shared =
            Correction::observed(&m, 1000.0, 200.0, 8.0, 0.5, None, Some(2.0 * expected_itl));
        assert!((shared.decode - 1.0).abs() < 1e-9);
        assert_eq!(c.prefill, 1.0);
        let demand = Demand {
            rate: 5.0,
            isl: 1000.0,
            osl: 200.0,
            hit_rate: 0.0,
        };
        let plain = need(&m, &demand, 500.0, 40.0, &Correction::default());
        let corrected = need(&m, &demand, 500.0, 40.0, &c);
        assert!(corrected.decode > plain.decode);
        // Observed TTFT above the model (queueing) never raises the prefill need; below it
        // lowers it.
        let slow = Correction::observed(&m, 1000.0, 200.0, 8.0, 0.0, Some(10_000.0), None);
        assert_eq!(slow.prefill, 1.0);
        let fast = Correction::observed(
            &m,
            1000.0,
            200.0,
            8.0,
            0.0,
            Some(POLY.prefill_ms(1000) / 2.0),
            None,
        );
        assert!((fast.prefill - 0.5).abs() < 1e-9);
        // Absurd observations are clamped.
        let absurd = Correction::observed(&m, 1000.0, 200.0, 8.0, 0.0, Some(0.0), Some(1e12));
        assert_eq!((absurd.prefill, absurd.decode), (0.25, 4.0));
    }
}
