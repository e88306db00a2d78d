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
//! - Context: at each cached-prefix length p, one prompt of p words, then prompts of the
//!   same p words and a fresh chunk of t more, one at a time. The server computes only the
//!   chunk (its prefix cache holds the rest), whose queries also attend to the p cached
//!   keys: its TTFT less the prefill of t fresh tokens (the prefill curve) is that cost,
//!   k·p·t, and a least-squares fit over the points gives the profile's
//!   `prefill_context_ms` k. The cached count is the server's
//!   (`usage.prompt_tokens_details.cached_tokens`) when it says; a server that recomputes
//!   the prefix (no prefix caching, or too small a cache) leaves k at 0, with the reason in
//!   the report.

use std::time::Duration;

use serde::Serialize;
use switchyard_core::perf::{InvalidProfile, MAX_CONTEXT_MS, PerfModel, Profile, interpolate};
use switchyard_core::trace::MooncakeRecord;
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
    /// Cached-prefix lengths (words) for the context sweep; empty: not measured.
    pub context_prefix: Vec<u64>,
    /// Words of the fresh chunk after each cached prefix.
    pub context_chunk: u64,
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
            context_prefix: vec![1024, 2048],
            context_chunk: 512,
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

/// A chunk prefilled after a cached prefix.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ContextPoint {
    /// Tokens of the prefix prompt sent first.
    pub prefix: f64,
    /// Prompt tokens served from the cache (the server's count, or the prefix prompt's
    /// length when it gives none).
    pub cached: f64,
    /// Tokens computed: the prompt's less the cached.
    pub chunk: f64,
    /// Median time to the first token of the prompts (the prefix and a chunk).
    pub ttft_ms: f64,
    /// The same prompts sent again (now all cached but their last tokens): the server's
    /// own time for a prompt of that length.
    pub again_ms: f64,
    /// A fresh prompt of a chunk's words alone, and the same sent again.
    pub fresh_ms: f64,
    pub fresh_again_ms: f64,
    /// What attending to the cached tokens added: the median over the samples of
    /// `(ttft − again) − (fresh − fresh again)`, which leaves out what the server spends
    /// on a prompt's length outside the engine (reading, tokenizing, hashing it).
    pub extra_ms: f64,
    /// The same difference in cached × computed tokens (what k multiplies): cached ×
    /// chunk, less the last tokens the prompts sent again compute after their cached ones
    /// (when the server says what it cached).
    pub attended: f64,
    /// What recomputing the prefix would add, from the prefill curve: its time for the
    /// whole prompt less its time for the chunk.
    pub recompute_ms: f64,
    /// Whether the server said how many tokens it served from its cache.
    pub cached_reported: bool,
}

/// The context cost fitted over the points, or why there is none.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ContextFit {
    /// The profile's `prefill_context_ms`: milliseconds per cached token per chunk token.
    pub prefill_context_ms: f64,
    /// Why it is 0 without being measured as 0 (`None`: fitted).
    pub not_measured: Option<String>,
}

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
    /// The seed of the synthetic text (`--seed` repeats a run's prompts).
    pub seed: u64,
    pub prefill: Vec<PrefillPoint>,
    pub decode: Vec<DecodePoint>,
    pub context: Vec<ContextPoint>,
    pub context_fit: ContextFit,
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
    #[error("stopped before the sweep ended")]
    Stopped,
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
    if config.context_chunk == 0 && config.context_prefix.iter().any(|&p| p > 0) {
        return Err(ProfileError::Empty(
            "give a chunk of at least one word after the cached prefixes",
        ));
    }
    let mut run = 0u64;
    let mut prefill = Vec::new();
    for &isl in &config.prefill_isl {
        run += 1;
        let what = format!("prefill at {isl} words");
        let records = bench(
            config,
            run,
            synthetic(isl, 1),
            1,
            config.prefill_samples,
            &shutdown,
        )
        .await?;
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
                synthetic(context, config.decode_output_tokens),
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
    let mut context = Vec::new();
    let mut failure = None;
    let mut points: Vec<(f64, f64)> = prefill.iter().map(|p| (p.isl, p.ttft_ms)).collect();
    points.sort_by(|a, b| a.0.total_cmp(&b.0));
    let curve = |tokens: f64| interpolate(&points, tokens).max(0.0);
    let mut prefixes = config.context_prefix.clone();
    prefixes.retain(|&p| p > 0);
    prefixes.sort_unstable();
    prefixes.dedup();
    for &prefix in &prefixes {
        run += 1;
        let what = format!(
            "{} words after a cached prefix of {prefix} words",
            config.context_chunk
        );
        let records = context_bench(config, run, prefix, &shutdown).await?;
        if shutdown.is_cancelled() {
            // Stopped (Ctrl-C), as in the sweeps before: no profile.
            return Err(ProfileError::Stopped);
        }
        match context_point(&what, records, &curve) {
            Ok(point) => context.push(point),
            Err(e) => {
                failure = Some(e);
                break;
            }
        }
    }
    // A prompt of the sweep failing (longer than the server's context, say) costs the
    // context cost only, not the profile.
    let context_fit = match failure {
        None => fit_context(&context),
        Some(e) => ContextFit {
            prefill_context_ms: 0.0,
            not_measured: Some(format!("the sweep failed: {e}")),
        },
    };
    let mut profile = to_profile(&prefill, &decode)?;
    profile.prefill_context_ms = context_fit.prefill_context_ms;
    let recommendations = recommend(
        &prefill,
        &decode,
        config.ttft_target.as_secs_f64() * 1e3,
        config.itl_target.as_secs_f64() * 1e3,
        config.kv_capacity_tokens,
    );
    Ok(ProfileResult {
        seed: config.seed,
        prefill,
        decode,
        context,
        context_fit,
        profile,
        recommendations,
    })
}

/// Fresh prompts of `input_tokens` words, asking for `output_tokens`.
fn synthetic(input_tokens: u64, output_tokens: u64) -> RequestSource {
    RequestSource::Synthetic {
        input_tokens,
        output_tokens,
    }
}

async fn bench(
    config: &ProfileConfig,
    run: u64,
    source: RequestSource,
    clients: usize,
    requests: usize,
    shutdown: &CancellationToken,
) -> Result<Vec<RequestRecord>, ProfileError> {
    let mut b = BenchConfig::new(config.url.clone(), config.model.clone());
    b.endpoint = config.endpoint;
    b.stream = true;
    b.source = source;
    b.shape = LoadShape::Concurrency { clients };
    b.max_requests = Some(requests);
    b.request_timeout = config.request_timeout;
    b.api_key = config.api_key.clone();
    b.ignore_eos = true;
    // A new seed per point: fresh text, which no earlier point left in a cache.
    b.seed = config.seed.wrapping_mul(1_000_003).wrapping_add(run);
    Ok(crate::bench::run(b, shutdown.clone()).await?.requests)
}

/// One point of the context sweep from its records (see [`context_bench`] for their order).
fn context_point(
    what: &str,
    mut records: Vec<RequestRecord>,
    curve: &dyn Fn(f64) -> f64,
) -> Result<ContextPoint, ProfileError> {
    records.sort_by_key(|r| r.index);
    let records = succeeded(what, records)?;
    let no_timing = || ProfileError::NoTiming(what.to_string());
    let (first, rest) = records.split_first().ok_or_else(no_timing)?;
    let samples: Vec<&[RequestRecord]> = rest.chunks_exact(4).collect();
    let ms = |r: &RequestRecord| r.ttft.map(|d| d.as_secs_f64() * 1e3);
    let column = |i: usize| median(samples.iter().filter_map(|s| ms(&s[i])).collect());
    let reported = samples.iter().all(|s| s[2].cached_tokens.is_some());
    let cached = if reported {
        median(
            samples
                .iter()
                .filter_map(|s| s[2].cached_tokens)
                .map(|c| c as f64)
                .collect(),
        )
    } else {
        Some(first.input_tokens as f64)
    }
    .unwrap_or(0.0);
    let whole = samples
        .iter()
        .map(|s| s[2].input_tokens as f64)
        .sum::<f64>()
        / samples.len() as f64;
    let extra = median(
        samples
            .iter()
            .filter_map(|s| Some((ms(&s[2])? - ms(&s[3])?) - (ms(&s[0])? - ms(&s[1])?)))
            .collect(),
    );
    let chunk = (whole - cached).max(1.0);
    // Cached × computed tokens of one request, by the server's counts.
    let attended_by = |r: &RequestRecord| {
        r.cached_tokens
            .map(|c| c as f64 * r.input_tokens.saturating_sub(c) as f64)
    };
    let attended = if samples
        .iter()
        .flat_map(|s| s.iter())
        .all(|r| r.cached_tokens.is_some())
    {
        samples
            .iter()
            .map(|s| {
                let [a, b, c, d] = [0, 1, 2, 3].map(|i| attended_by(&s[i]).unwrap_or(0.0));
                (c - d) - (a - b)
            })
            .sum::<f64>()
            / samples.len() as f64
    } else {
        cached * chunk
    };
    let (Some(ttft), Some(again), Some(fresh), Some(fresh_again), Some(extra)) =
        (column(2), column(3), column(0), column(1), extra)
    else {
        return Err(no_timing());
    };
    Ok(ContextPoint {
        prefix: first.input_tokens as f64,
        cached,
        chunk,
        ttft_ms: ttft,
        again_ms: again,
        fresh_ms: fresh,
        fresh_again_ms: fresh_again,
        extra_ms: extra,
        attended,
        recompute_ms: curve(whole) - curve(chunk),
        cached_reported: reported,
    })
}

/// Words of the synthetic text per hash id in the context sweep's prompts.
const CONTEXT_BLOCK_WORDS: u32 = 64;

/// One prompt of `prefix` words, then `prefill_samples` times: a fresh prompt of a chunk's
/// words, the same again, a prompt of the prefix's words and a fresh chunk, the same again;
/// one at a time, each asking for one token.
async fn context_bench(
    config: &ProfileConfig,
    run: u64,
    prefix: u64,
    shutdown: &CancellationToken,
) -> Result<Vec<RequestRecord>, ProfileError> {
    let block = u64::from(CONTEXT_BLOCK_WORDS);
    let prefix_ids: Vec<u64> = (0..prefix.div_ceil(block)).collect();
    let chunk = config.context_chunk.max(1);
    let chunk_ids = chunk.div_ceil(block);
    let row = |input_length: u64, hash_ids: Vec<u64>| MooncakeRecord {
        timestamp: 0,
        input_length,
        output_length: 1,
        hash_ids,
        media: Vec::new(),
    };
    // The prefix in whole blocks, and each chunk from a block of its own: the prefix
    // prompt's words are the first words of every longer one.
    let padded = prefix_ids.len() as u64 * block;
    let mut records = vec![row(padded, prefix_ids.clone())];
    for sample in 0..config.prefill_samples as u64 {
        let alone = (2 * sample + 1) << 32;
        let after = (2 * sample + 2) << 32;
        let alone = row(chunk, (alone..alone + chunk_ids).collect());
        let mut ids = prefix_ids.clone();
        ids.extend(after..after + chunk_ids);
        let after = row(padded + chunk, ids);
        records.extend([alone.clone(), alone, after.clone(), after]);
    }
    let count = records.len();
    let source = RequestSource::Trace {
        records,
        block_size: CONTEXT_BLOCK_WORDS,
    };
    bench(config, run, source, 1, count, shutdown).await
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
    if !result.context.is_empty() {
        let _ = writeln!(
            s,
            "\n## A chunk after a cached prefix\n\nTTFT medians: the prompt, the same again \
             (all cached), a fresh prompt of the chunk's words alone, the same again; extra is \
             the median over the samples of (prompt − again) − (alone − again).\n\n\
             | cached tokens | chunk tokens | prompt ms | again ms | alone ms | again ms | \
             extra ms |\n|---|---|---|---|---|---|---|"
        );
        for c in &result.context {
            let _ = writeln!(
                s,
                "| {:.0}{} | {:.0} | {:.1} | {:.1} | {:.1} | {:.1} | {:.2} |",
                c.cached,
                if c.cached_reported { "" } else { " (assumed)" },
                c.chunk,
                c.ttft_ms,
                c.again_ms,
                c.fresh_ms,
                c.fresh_again_ms,
                c.extra_ms
            );
        }
    }
    let _ = match &result.context_fit.not_measured {
        None => writeln!(
            s,
            "\nAttending to cached tokens costs {:.3e} ms per cached token per chunk token \
             (`prefill_context_ms` in the profile, fitted through the points above).",
            result.context_fit.prefill_context_ms
        ),
        Some(why) => writeln!(
            s,
            "\nThe cost of attending to cached tokens is not measured ({why}); the profile's \
             `prefill_context_ms` is 0."
        ),
    };
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

    /// A point as a server with context cost `k` and a per-token overhead outside the
    /// engine would give it (`again` and `fresh again` carry only that overhead).
    fn c(prefix: f64, chunk: f64, k: f64, reported: bool) -> ContextPoint {
        let overhead = |tokens: f64| 30.0 + 0.002 * tokens;
        let prefill = |tokens: f64| 5.0 + 0.05 * tokens;
        ContextPoint {
            prefix,
            cached: prefix,
            chunk,
            ttft_ms: overhead(prefix + chunk) + prefill(chunk) + k * prefix * chunk,
            again_ms: overhead(prefix + chunk),
            fresh_ms: overhead(chunk) + prefill(chunk),
            fresh_again_ms: overhead(chunk),
            extra_ms: k * prefix * chunk,
            attended: prefix * chunk,
            recompute_ms: prefill(prefix + chunk) - prefill(chunk),
            cached_reported: reported,
        }
    }

    #[test]
    fn the_context_cost_is_fitted_through_the_points() {
        let k = 2e-5;
        let fit = fit_context(&[c(1024.0, 512.0, k, true), c(4096.0, 512.0, k, true)]);
        assert_eq!(fit.not_measured, None);
        assert!((fit.prefill_context_ms - k).abs() < 1e-12, "{fit:?}");
        // Least squares through the origin: the larger product weighs more.
        let mut low = c(1024.0, 512.0, k, false);
        low.extra_ms = 0.0;
        let high = c(4096.0, 512.0, k, false);
        let fit = fit_context(&[low, high]);
        let (x1, x2) = (low.attended, high.attended);
        let expected = (x2 * high.extra_ms) / (x1 * x1 + x2 * x2);
        assert!((fit.prefill_context_ms - expected).abs() < 1e-15);
        assert!(fit.prefill_context_ms < k);
        // Noise below zero is no negative cost; an absurd one is held to what a profile
        // may say.
        let mut negative = c(1024.0, 512.0, 0.0, true);
        negative.extra_ms = -3.0;
        assert_eq!(fit_context(&[negative]).prefill_context_ms, 0.0);
        let huge = c(1024.0, 512.0, 1.0, true);
        assert_eq!(fit_context(&[huge]).prefill_context_ms, MAX_CONTEXT_MS);
        // Nothing asked for.
        let none = fit_context(&[]);
        assert_eq!(none.prefill_context_ms, 0.0);
        assert!(none.not_measured.is_some());
    }

    fn record(index: usize, ttft_ms: u64, input: u64, cached: Option<u64>) -> RequestRecord {
        RequestRecord {
            index,
            scheduled: None,
            start: Duration::ZERO,
            ttft: Some(Duration::from_millis(ttft_ms)),
            itl: Vec::new(),
            latency: Duration::from_millis(ttft_ms),
            input_tokens: input,
            output_tokens: 1,
            usage_reported: true,
            cached_tokens: cached,
            error: None,
        }
    }

    #[test]
    fn a_point_reads_its_records_in_the_order_they_were_sent() {
        // The prefix (1,024 tokens), then per sample: 512 alone, again (496 of them cached),
        // 1,024 + 512 (1,024 cached), again (1,520 cached). Sent in this order, recorded in
        // any.
        let curve = |tokens: f64| tokens / 10.0;
        let mut records = vec![record(0, 110, 1_024, Some(0))];
        for (s, extra) in [(0, 30), (1, 50), (2, 40)] {
            let i = 1 + 4 * s;
            records.extend([
                record(i, 60, 512, Some(0)),
                record(i + 1, 20, 512, Some(496)),
                record(i + 2, 70 + extra, 1_536, Some(1_024)),
                record(i + 3, 25, 1_536, Some(1_520)),
            ]);
        }
        records.reverse();
        let p = context_point("x", records.clone(), &curve).unwrap();
        assert_eq!((p.prefix, p.cached, p.chunk), (1_024.0, 1_024.0, 512.0));
        assert!(p.cached_reported);
        assert_eq!((p.ttft_ms, p.again_ms), (110.0, 25.0));
        assert_eq!((p.fresh_ms, p.fresh_again_ms), (60.0, 20.0));
        // Per sample (70 + extra − 25) − (60 − 20): 35, 55, 45; their median.
        assert_eq!(p.extra_ms, 45.0);
        // Cached × computed: 1,024 · 512 − 1,520 · 16 − (0 − 496 · 16).
        assert_eq!(p.attended, 1_024.0 * 512.0 - 1_520.0 * 16.0 + 496.0 * 16.0);
        assert_eq!(p.recompute_ms, 1_536.0 / 10.0 - 512.0 / 10.0);

        // A server that gives no cached count: the prefix is taken as cached, and the
        // product is cached × chunk.
        let silent: Vec<RequestRecord> = records
            .into_iter()
            .map(|r| RequestRecord {
                cached_tokens: None,
                ..r
            })
            .collect();
        let p = context_point("x", silent.clone(), &curve).unwrap();
        assert!(!p.cached_reported);
        assert_eq!((p.cached, p.chunk), (1_024.0, 512.0));
        assert_eq!(p.attended, 1_024.0 * 512.0);
        // A failed request fails the point, naming it.
        let mut failed = silent;
        failed[3].error = Some(crate::bench::RequestError::new(
            crate::bench::ErrorKind::Http(400),
            "too long",
        ));
        let e = context_point("the 1024 point", failed, &curve).unwrap_err();
        assert!(e.to_string().contains("the 1024 point"), "{e}");
    }

    #[test]
    fn a_server_that_recomputes_the_prefix_gets_no_context_cost() {
        // It says it cached nothing.
        let mut said = c(4096.0, 512.0, 0.0, true);
        said.cached = 0.0;
        let fit = fit_context(&[c(1024.0, 512.0, 1e-5, true), said]);
        assert_eq!(fit.prefill_context_ms, 0.0);
        assert!(
            fit.not_measured
                .as_deref()
                .unwrap()
                .contains("served 0 tokens"),
            "{fit:?}"
        );
        // It says nothing, and the prompt took what recomputing its prefix takes (the
        // again-differences cancel: every prompt is computed whole).
        let mut silent = c(4096.0, 512.0, 0.0, false);
        silent.ttft_ms = silent.fresh_ms + silent.recompute_ms;
        silent.again_ms = silent.ttft_ms;
        silent.extra_ms = 0.0;
        let fit = fit_context(&[silent]);
        assert_eq!(fit.prefill_context_ms, 0.0);
        assert!(
            fit.not_measured
                .as_deref()
                .unwrap()
                .contains("does not cache prefixes"),
            "{fit:?}"
        );
        // Saying nothing is not enough to be doubted: a cached prefix fits.
        let fit = fit_context(&[c(4096.0, 512.0, 1e-5, false)]);
        assert_eq!(fit.not_measured, None);
        assert!((fit.prefill_context_ms - 1e-5).abs() < 1e-15);
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
