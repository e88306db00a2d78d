//! The sweeps: prefill over prompt lengths, decode over contexts and concurrencies, and a
//! chunk after each cached prefix, each point a run of the benchmark client.

use std::time::Duration;

use switchyard_core::perf::interpolate;
use switchyard_core::trace::MooncakeRecord;
use tokio_util::sync::CancellationToken;

use super::{
    ContextFit, ContextPoint, DecodePoint, PrefillPoint, ProfileConfig, ProfileError,
    ProfileResult, fit_context, recommend, to_profile,
};
use crate::bench::config::{LoadShape, RequestSource};
use crate::bench::{BenchConfig, RequestRecord};

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
pub(super) fn context_point(
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
        ..MooncakeRecord::default()
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
