//! Profiling an engine through its OpenAI API: prefill time over prompt lengths, and
//! inter-token latency over batch sizes and context lengths, measured with the benchmark
//! client, turned into the timing profile the mocker runs and the planner sizes with
//! ([`switchyard_core::perf::Profile`]), and a report with plots and what the targets allow.
//!
//! - Prefill: at each prompt length, a few requests one at a time, each asking for one
//!   token (TTFT is then the prefill, plus the server's overhead); prompts are fresh text,
//!   so no prefix cache helps. The length is the server's own count (`usage`).
//! - Decode: at each context length and concurrency, that many streams started together;
//!   the ITL is read over the second half of each stream's tokens (after every prompt of
//!   the batch is in), its active KV tokens as concurrency × (context + ¾ of the output).

use std::time::Duration;

use serde::Serialize;
use switchyard_core::perf::{InvalidProfile, PerfModel, Profile, interpolate};
use tokio_util::sync::CancellationToken;

use crate::bench::config::{Endpoint, LoadShape, RequestSource};
use crate::bench::{BenchConfig, BenchError, RequestRecord};

/// What to measure, where.
#[derive(Debug, Clone)]
pub struct ProfileConfig {
    pub url: String,
    pub model: String,
    pub endpoint: Endpoint,
    pub api_key: Option<String>,
    /// Prompt lengths (words of synthetic text) for the prefill sweep.
    pub prefill_isl: Vec<u64>,
    /// Requests per prompt length.
    pub prefill_samples: usize,
    /// Context lengths and concurrencies for the decode sweep.
    pub decode_context: Vec<u64>,
    pub decode_concurrency: Vec<usize>,
    /// Tokens each decode stream asks for.
    pub decode_output_tokens: u64,
    pub ttft_target: Duration,
    pub itl_target: Duration,
    pub request_timeout: Duration,
    pub seed: u64,
    /// The engine's KV cache in tokens, when known: KV thresholds are then given as the
    /// share of it the planner reads (its engines' `kv_usage`).
    pub kv_capacity_tokens: Option<u64>,
}

impl ProfileConfig {
    pub fn new(url: impl Into<String>, model: impl Into<String>) -> Self {
        ProfileConfig {
            url: url.into(),
            model: model.into(),
            endpoint: Endpoint::Completions,
            api_key: None,
            prefill_isl: vec![128, 512, 1024, 2048, 4096],
            prefill_samples: 3,
            decode_context: vec![512, 2048],
            decode_concurrency: vec![1, 4, 16],
            decode_output_tokens: 64,
            ttft_target: Duration::from_millis(500),
            itl_target: Duration::from_millis(50),
            request_timeout: Duration::from_secs(600),
            seed: 0,
            kv_capacity_tokens: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PrefillPoint {
    /// Prompt tokens, as the server counted them (mean of the samples).
    pub isl: f64,
    /// Median time to the first token.
    pub ttft_ms: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct DecodePoint {
    pub context: f64,
    pub concurrency: usize,
    pub active_kv_tokens: f64,
    /// Median over the streams of their mean ITL in the second half of their tokens.
    pub itl_ms: f64,
}

/// What the targets allow on this engine.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Recommendations {
    /// Longest prompt whose prefill alone meets the TTFT target (`None`: not even the
    /// shortest measured).
    pub max_isl_within_ttft: Option<f64>,
    /// Per context length: the largest measured concurrency within the ITL target.
    pub max_concurrency_within_itl: Vec<(f64, Option<usize>)>,
    /// Per measured prompt length: how many prompts of that length may wait ahead of a new
    /// one on an engine while it still meets the TTFT target (its own prefill included).
    pub queue_within_ttft: Vec<(f64, u32)>,
    /// The most active KV tokens (streams × context) measured within the ITL target, over
    /// every context length (the smallest of their largest: holds at any of them).
    pub kv_tokens_within_itl: Option<f64>,
    /// Thresholds for the load planner (`[planner.load]`) from the above.
    pub load_planner: LoadThresholds,
}

/// Load-planner thresholds that hold the targets on this engine.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LoadThresholds {
    /// Waiting requests per worker above which one is added: the queue a prompt of the
    /// median measured length still meets the TTFT target behind.
    pub prefill_queue_up: f64,
    /// Below which one is removed: 40 % of the up threshold (Dynamo's defaults' ratio).
    pub prefill_queue_down: f64,
    /// KV usage above which a decode (or aggregated) worker is added: the share of the
    /// cache in use at the ITL target, when the capacity is known.
    pub kv_usage_up: Option<f64>,
    /// Below which one is removed: 55 % of the up threshold (0.5 / 0.9, Dynamo's).
    pub kv_usage_down: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProfileResult {
    pub prefill: Vec<PrefillPoint>,
    pub decode: Vec<DecodePoint>,
    pub profile: Profile,
    pub recommendations: Recommendations,
}

#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    #[error(transparent)]
    Bench(#[from] BenchError),
    #[error("{what}: {failed} of {sent} requests failed (first: {first})")]
    Failed {
        what: String,
        failed: usize,
        sent: usize,
        first: String,
    },
    #[error("{0}: no timing came back (is the endpoint streaming tokens?)")]
    NoTiming(String),
    #[error("the measurements make no usable profile: {0}")]
    Shape(#[from] InvalidProfile),
    #[error("nothing to measure: {0}")]
    Empty(&'static str),
}

/// Runs the sweep; `shutdown` stops it.
pub async fn measure(
    config: &ProfileConfig,
    shutdown: CancellationToken,
) -> Result<ProfileResult, ProfileError> {
    let distinct = |v: &[u64]| {
        let mut v = v.to_vec();
        v.sort_unstable();
        v.dedup();
        v.len()
    };
    let concurrencies: Vec<u64> = config
        .decode_concurrency
        .iter()
        .map(|&k| k as u64)
        .collect();
    if distinct(&config.prefill_isl) < 2 || config.prefill_samples == 0 {
        return Err(ProfileError::Empty(
            "give at least two prompt lengths, and samples",
        ));
    }
    if distinct(&config.decode_context) < 2 || distinct(&concurrencies) < 2 {
        return Err(ProfileError::Empty(
            "give at least two context lengths and two concurrencies",
        ));
    }
    let mut run = 0u64;
    let mut prefill = Vec::new();
    for &isl in &config.prefill_isl {
        run += 1;
        let what = format!("prefill at {isl} words");
        let records = bench(config, run, isl, 1, 1, config.prefill_samples, &shutdown).await?;
        let records = succeeded(&what, records)?;
        let ttfts: Vec<f64> = records
            .iter()
            .filter_map(|r| r.ttft)
            .map(|d| d.as_secs_f64() * 1e3)
            .collect();
        let tokens = records.iter().map(|r| r.input_tokens as f64).sum::<f64>()
            / records.len().max(1) as f64;
        let ttft = median(ttfts).ok_or_else(|| ProfileError::NoTiming(what.clone()))?;
        prefill.push(PrefillPoint {
            isl: tokens,
            ttft_ms: ttft,
        });
    }
    let mut decode = Vec::new();
    for &context in &config.decode_context {
        for &k in &config.decode_concurrency {
            run += 1;
            let what = format!("decode at {k} streams of {context} words");
            let records = bench(
                config,
                run,
                context,
                config.decode_output_tokens,
                k.max(1),
                k.max(1),
                &shutdown,
            )
            .await?;
            let records = succeeded(&what, records)?;
            let itls: Vec<f64> = records
                .iter()
                .filter_map(|r| {
                    let late = &r.itl[r.itl.len() / 2..];
                    (!late.is_empty()).then(|| {
                        late.iter().sum::<Duration>().as_secs_f64() * 1e3 / late.len() as f64
                    })
                })
                .collect();
            let tokens = records.iter().map(|r| r.input_tokens as f64).sum::<f64>()
                / records.len().max(1) as f64;
            let itl = median(itls).ok_or_else(|| ProfileError::NoTiming(what.clone()))?;
            decode.push(DecodePoint {
                context: tokens,
                concurrency: k.max(1),
                active_kv_tokens: k.max(1) as f64
                    * (tokens + 0.75 * config.decode_output_tokens as f64),
                itl_ms: itl,
            });
        }
    }
    let profile = to_profile(&prefill, &decode)?;
    let recommendations = recommend(
        &prefill,
        &decode,
        config.ttft_target.as_secs_f64() * 1e3,
        config.itl_target.as_secs_f64() * 1e3,
        config.kv_capacity_tokens,
    );
    Ok(ProfileResult {
        prefill,
        decode,
        profile,
        recommendations,
    })
}

#[allow(clippy::too_many_arguments)]
async fn bench(
    config: &ProfileConfig,
    run: u64,
    input_tokens: u64,
    output_tokens: u64,
    clients: usize,
    requests: usize,
    shutdown: &CancellationToken,
) -> Result<Vec<RequestRecord>, ProfileError> {
    let mut b = BenchConfig::new(config.url.clone(), config.model.clone());
    b.endpoint = config.endpoint;
    b.stream = true;
    b.source = RequestSource::Synthetic {
        input_tokens,
        output_tokens,
    };
    b.shape = LoadShape::Concurrency { clients };
    b.max_requests = Some(requests);
    b.request_timeout = config.request_timeout;
    b.api_key = config.api_key.clone();
    b.ignore_eos = true;
    // A new seed per point: fresh text, which no earlier point left in a cache.
    b.seed = config.seed.wrapping_mul(1_000_003).wrapping_add(run);
    Ok(crate::bench::run(b, shutdown.clone()).await?.requests)
}

fn succeeded(what: &str, records: Vec<RequestRecord>) -> Result<Vec<RequestRecord>, ProfileError> {
    let failed: Vec<&RequestRecord> = records.iter().filter(|r| !r.succeeded()).collect();
    if let Some(first) = failed.first() {
        return Err(ProfileError::Failed {
            what: what.to_string(),
            failed: failed.len(),
            sent: records.len(),
            first: first
                .error
                .as_ref()
                .map_or_else(String::new, |e| format!("{}: {}", e.kind, e.message)),
        });
    }
    Ok(records)
}

fn median(mut values: Vec<f64>) -> Option<f64> {
    values.retain(|v| v.is_finite());
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    Some(if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    })
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

/// The report as Markdown.
pub fn report(result: &ProfileResult, config: &ProfileConfig) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let _ = writeln!(s, "# Engine profile: {} at {}\n", config.model, config.url);
    let _ = writeln!(
        s,
        "## Prefill\n\n| prompt tokens | TTFT (median) ms |\n|---|---|"
    );
    for p in &result.prefill {
        let _ = writeln!(s, "| {:.0} | {:.1} |", p.isl, p.ttft_ms);
    }
    let _ = writeln!(
        s,
        "\n## Decode\n\n| context tokens | streams | active KV tokens | ITL ms |\n|---|---|---|---|"
    );
    for d in &result.decode {
        let _ = writeln!(
            s,
            "| {:.0} | {} | {:.0} | {:.2} |",
            d.context, d.concurrency, d.active_kv_tokens, d.itl_ms
        );
    }
    let r = &result.recommendations;
    let _ = writeln!(
        s,
        "\n## For TTFT ≤ {:?} and ITL ≤ {:?}\n",
        config.ttft_target, config.itl_target
    );
    let _ = match r.max_isl_within_ttft {
        Some(isl) => writeln!(
            s,
            "- Prompts up to {isl:.0} tokens are prefilled within the TTFT target on an idle engine; \
             longer ones miss it whatever the fleet size."
        ),
        None => writeln!(
            s,
            "- Not even the shortest prompt measured meets the TTFT target."
        ),
    };
    for (context, k) in &r.max_concurrency_within_itl {
        let _ = match k {
            Some(k) => writeln!(
                s,
                "- At {context:.0} tokens of context, up to {k} streams per engine hold the ITL target \
                 (a ceiling for `max_num_seqs`, and for the planner's decode batch)."
            ),
            None => writeln!(
                s,
                "- At {context:.0} tokens of context, not even one stream holds the ITL target."
            ),
        };
    }
    for (isl, q) in &r.queue_within_ttft {
        let _ = writeln!(
            s,
            "- Behind {q} waiting prompts of {isl:.0} tokens, a new one still meets the TTFT target."
        );
    }
    let _ = match (r.kv_tokens_within_itl, config.kv_capacity_tokens) {
        (Some(kv), Some(capacity)) => writeln!(
            s,
            "- Up to {kv:.0} active KV tokens ({:.0} % of the {capacity}-token cache) hold the ITL target \
             at every context measured.",
            kv / capacity.max(1) as f64 * 100.0
        ),
        (Some(kv), None) => writeln!(
            s,
            "- Up to {kv:.0} active KV tokens hold the ITL target at every context measured \
             (give `--kv-capacity-tokens` for the share of the cache)."
        ),
        (None, _) => writeln!(
            s,
            "- Not every context measured holds the ITL target even with one stream."
        ),
    };
    let t = &r.load_planner;
    let _ = writeln!(
        s,
        "\nThe load planner's thresholds for these targets (`--planner-config`, or the \
         `[planner.load]` table of the configuration):\n\n```toml\n[load]\n\
         prefill_queue_up = {:.2}\nprefill_queue_down = {:.2}",
        t.prefill_queue_up, t.prefill_queue_down
    );
    let _ = match (t.kv_usage_up, t.kv_usage_down) {
        (Some(up), Some(down)) => writeln!(s, "kv_usage_up = {up:.2}\nkv_usage_down = {down:.2}"),
        _ => writeln!(
            s,
            "# kv_usage_up / kv_usage_down: give --kv-capacity-tokens to derive them"
        ),
    };
    let _ = writeln!(s, "```");
    let _ = writeln!(
        s,
        "\nThe profile (`profile.json`) is the mocker's format: `switchyard serve --perf-profile \
         profile.json` simulates this engine, `switchyard sim --perf-profile` fleets of it, and \
         the SLA planner sizes with it (`switchyard planner --perf-profile`)."
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(context: f64, k: usize, itl: f64) -> DecodePoint {
        DecodePoint {
            context,
            concurrency: k,
            active_kv_tokens: k as f64 * context,
            itl_ms: itl,
        }
    }

    #[test]
    fn measurements_become_a_profile_the_mocker_reads() {
        let prefill = [
            PrefillPoint {
                isl: 2000.0,
                ttft_ms: 90.0,
            },
            PrefillPoint {
                isl: 130.0,
                ttft_ms: 20.0,
            },
        ];
        let decode = [
            d(500.0, 1, 10.0),
            d(500.0, 4, 14.0),
            d(2000.0, 1, 12.0),
            d(2000.0, 4, 20.0),
        ];
        let p = to_profile(&prefill, &decode).unwrap();
        assert_eq!(p.prefill_isl, [130.0, 2000.0]);
        assert_eq!(p.prefill_ttft_ms, [20.0, 90.0]);
        assert_eq!(p.decode_context_length, [500.0, 2000.0]);
        assert_eq!(p.decode_active_kv_tokens, [500.0, 2000.0, 8000.0]);
        // Column 500: measured at 500 (10) and 2000 (14); 8000 extrapolated: 14 + 4·6000/1500.
        // Column 2000: measured at 2000 (12) and 8000 (20); 500 extrapolated back: 10.
        assert_eq!(p.decode_itl[0], [10.0, 10.0]);
        assert_eq!(p.decode_itl[1], [14.0, 12.0]);
        assert_eq!(p.decode_itl[2], [30.0, 20.0]);
        let model = PerfModel::from_profile(p).unwrap();
        assert_eq!(model.prefill_ms(2000), 90.0);
    }

    #[test]
    fn recommendations_read_the_targets_off_the_points() {
        let prefill = [
            PrefillPoint {
                isl: 128.0,
                ttft_ms: 20.0,
            },
            PrefillPoint {
                isl: 4096.0,
                ttft_ms: 900.0,
            },
        ];
        let decode = [d(512.0, 1, 8.0), d(512.0, 16, 40.0), d(512.0, 64, 90.0)];
        let r = recommend(&prefill, &decode, 500.0, 50.0, Some(40_000));
        assert_eq!(r.max_isl_within_ttft, Some(128.0));
        assert_eq!(r.max_concurrency_within_itl, [(512.0, Some(16))]);
        // 500 ms fits 25 prefills of 20 ms (24 waiting ahead), none of 900 ms.
        assert_eq!(r.queue_within_ttft, [(128.0, 24), (4096.0, 0)]);
        // 16 streams at 512 tokens of context hold 50 ms: their KV tokens of the 40,000.
        let kv = d(512.0, 16, 40.0).active_kv_tokens;
        assert_eq!(r.kv_tokens_within_itl, Some(kv));
        let t = r.load_planner;
        // The median of (0, 24), the upper one of two, is 24.
        assert_eq!(
            (t.prefill_queue_up, t.prefill_queue_down),
            (24.0, 24.0 * 0.4)
        );
        assert_eq!(t.kv_usage_up, Some(kv / 40_000.0));
        assert!((t.kv_usage_down.unwrap() - kv / 40_000.0 * 0.5 / 0.9).abs() < 1e-12);
        let none = recommend(&prefill, &decode, 5.0, 5.0, None);
        assert_eq!(none.max_isl_within_ttft, None);
        assert_eq!(none.max_concurrency_within_itl, [(512.0, None)]);
        assert_eq!(none.kv_tokens_within_itl, None);
        assert_eq!(none.queue_within_ttft, [(128.0, 0), (4096.0, 0)]);
        // No queue at all fits: the threshold still means one (half a request a worker).
        assert_eq!(none.load_planner.prefill_queue_up, 0.5);
        assert_eq!(none.load_planner.kv_usage_up, None);
    }

    #[test]
    fn one_point_on_an_axis_is_no_profile() {
        let e = to_profile(
            &[PrefillPoint {
                isl: 100.0,
                ttft_ms: 10.0,
            }],
            &[d(100.0, 1, 5.0), d(100.0, 2, 6.0)],
        )
        .unwrap_err();
        assert!(e.to_string().contains("at least 2 points"), "{e}");
    }
}
