//! The profile's report: the measured points, the context cost, and what the targets allow
//! (with the load planner's thresholds), as Markdown.

use super::{ProfileConfig, ProfileResult};

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
