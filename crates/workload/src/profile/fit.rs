//! Reading the measurements: the profile the mocker runs, the context cost fitted through
//! the cached-prefix points, and what the targets allow.

use switchyard_core::perf::{InvalidProfile, MAX_CONTEXT_MS, PerfModel, Profile, interpolate};

use super::{ContextFit, ContextPoint, DecodePoint, LoadThresholds, PrefillPoint, Recommendations};

/// A cached prefix the server served for less than half its tokens, or (the server not
/// saying) a chunk that took half or more of recomputing the whole prompt, means the prefix
/// was not served from a cache.
const CACHED_AT_LEAST: f64 = 0.5;

/// Fits k in `extra = k · cached · chunk` through the origin (least squares), over
/// points where the prefix came from the cache; clamped to what a profile may hold.
pub fn fit_context(points: &[ContextPoint]) -> ContextFit {
    if points.is_empty() {
        return ContextFit {
            prefill_context_ms: 0.0,
            not_measured: Some("no cached-prefix lengths given".into()),
        };
    }
    if let Some(p) = points.iter().find(|p| {
        if p.cached_reported {
            p.cached < CACHED_AT_LEAST * p.prefix
        } else {
            p.ttft_ms - p.fresh_ms >= CACHED_AT_LEAST * p.recompute_ms.max(0.0)
        }
    }) {
        let why = if p.cached_reported {
            format!(
                "the server served {:.0} tokens of a prompt from its cache right after its \
                 {:.0}-token prefix: no prefix caching, or too small a cache",
                p.cached, p.prefix
            )
        } else {
            format!(
                "a prompt whose {:.0}-token prefix had just been sent took {:.1} ms, {:.1} more \
                 than a fresh {:.0}-token chunk: about what recomputing the prefix costs \
                 ({:.1} ms), so the server does not cache prefixes, or gives no count to tell",
                p.prefix,
                p.ttft_ms,
                p.ttft_ms - p.fresh_ms,
                p.chunk,
                p.recompute_ms
            )
        };
        return ContextFit {
            prefill_context_ms: 0.0,
            not_measured: Some(why),
        };
    }
    let (xy, xx) = points.iter().fold((0.0, 0.0), |(xy, xx), p| {
        let x = p.attended;
        (xy + x * p.extra_ms, xx + x * x)
    });
    let k = if xx > 0.0 { xy / xx } else { 0.0 };
    ContextFit {
        prefill_context_ms: if k.is_finite() {
            k.clamp(0.0, MAX_CONTEXT_MS)
        } else {
            0.0
        },
        not_measured: None,
    }
}

/// Points on an axis closer than this are one point.
const SAME_POINT: f64 = 0.5;

fn axis(mut values: Vec<f64>) -> Vec<f64> {
    values.sort_by(f64::total_cmp);
    values.dedup_by(|a, b| (*a - *b).abs() < SAME_POINT);
    values
}

/// The measurements as the mocker's profile: the decode grid's rows are every active-KV
/// value measured, each context column filled by interpolating that context's points.
pub fn to_profile(
    prefill: &[PrefillPoint],
    decode: &[DecodePoint],
) -> Result<Profile, InvalidProfile> {
    let mut by_isl: Vec<(f64, f64)> = prefill.iter().map(|p| (p.isl, p.ttft_ms)).collect();
    by_isl.sort_by(|a, b| a.0.total_cmp(&b.0));
    by_isl.dedup_by(|a, b| (a.0 - b.0).abs() < SAME_POINT);
    let contexts = axis(decode.iter().map(|d| d.context).collect());
    let rows = axis(decode.iter().map(|d| d.active_kv_tokens).collect());
    let columns: Vec<Vec<(f64, f64)>> = contexts
        .iter()
        .map(|&c| {
            let mut points: Vec<(f64, f64)> = decode
                .iter()
                .filter(|d| (d.context - c).abs() < SAME_POINT)
                .map(|d| (d.active_kv_tokens, d.itl_ms))
                .collect();
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            points
        })
        .collect();
    let grid = rows
        .iter()
        .map(|&r| {
            columns
                .iter()
                .map(|points| interpolate(points, r).max(0.0))
                .collect()
        })
        .collect();
    let profile = Profile {
        prefill_isl: by_isl.iter().map(|p| p.0).collect(),
        prefill_ttft_ms: by_isl.iter().map(|p| p.1.max(0.0)).collect(),
        decode_active_kv_tokens: rows,
        decode_context_length: contexts,
        decode_itl: grid,
        mixed_step_saving: 0.0,
        prefill_context_ms: 0.0,
    };
    // The same checks a profile read from a file gets.
    PerfModel::from_profile(profile.clone())?;
    Ok(profile)
}

/// What the targets allow, read off the measurements.
pub fn recommend(
    prefill: &[PrefillPoint],
    decode: &[DecodePoint],
    ttft_ms: f64,
    itl_ms: f64,
    kv_capacity_tokens: Option<u64>,
) -> Recommendations {
    let max_isl_within_ttft = prefill
        .iter()
        .filter(|p| p.ttft_ms <= ttft_ms)
        .map(|p| p.isl)
        .fold(None, |best: Option<f64>, x| {
            Some(best.map_or(x, |b| b.max(x)))
        });
    let contexts = axis(decode.iter().map(|d| d.context).collect());
    let max_concurrency_within_itl = contexts
        .iter()
        .map(|&c| {
            let best = decode
                .iter()
                .filter(|d| (d.context - c).abs() < SAME_POINT && d.itl_ms <= itl_ms)
                .map(|d| d.concurrency)
                .max();
            (c, best)
        })
        .collect();
    // Behind q waiting prompts of this length, a new one's first token comes after q + 1
    // prefills.
    let queue_within_ttft: Vec<(f64, u32)> = prefill
        .iter()
        .map(|p| {
            let fits = (ttft_ms / p.ttft_ms.max(1e-3)).floor() - 1.0;
            (p.isl, fits.clamp(0.0, f64::from(u32::MAX)) as u32)
        })
        .collect();
    let kv_tokens_within_itl = contexts
        .iter()
        .map(|&c| {
            decode
                .iter()
                .filter(|d| (d.context - c).abs() < SAME_POINT && d.itl_ms <= itl_ms)
                .map(|d| d.active_kv_tokens)
                .fold(None, |best: Option<f64>, x| {
                    Some(best.map_or(x, |b| b.max(x)))
                })
        })
        .collect::<Option<Vec<f64>>>()
        .and_then(|per_context| per_context.into_iter().reduce(f64::min));
    let median_queue = {
        let mut q: Vec<u32> = queue_within_ttft.iter().map(|&(_, q)| q).collect();
        q.sort_unstable();
        q.get(q.len() / 2).copied().unwrap_or(0)
    };
    // At least half a request waiting per worker, so that the threshold means a queue.
    let queue_up = f64::from(median_queue).max(0.5);
    let kv_up = kv_capacity_tokens
        .filter(|&c| c > 0)
        .zip(kv_tokens_within_itl)
        .map(|(c, kv)| (kv / c as f64).clamp(0.05, 1.0));
    Recommendations {
        max_isl_within_ttft,
        max_concurrency_within_itl,
        queue_within_ttft,
        kv_tokens_within_itl,
        load_planner: LoadThresholds {
            prefill_queue_up: queue_up,
            prefill_queue_down: queue_up * 0.4,
            kv_usage_up: kv_up,
            kv_usage_down: kv_up.map(|u| u * 0.5 / 0.9),
        },
    }
}
