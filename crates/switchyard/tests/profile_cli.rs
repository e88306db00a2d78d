//! `switchyard profile` against `switchyard serve`: the profile it writes describes the
//! engine it measured, and `serve` runs it.

#![allow(clippy::unwrap_used)]

mod support;

use std::process::Command;

use serde_json::Value;
use support::process::Process;
use switchyard_mocker::PerfModel;
use switchyard_mocker::perf::Profile;

/// Profiles `server` into `out` (which must succeed) and reads back the profile written.
fn profile(server: &Process, out: &std::path::Path, extra: &[&str]) -> Profile {
    let url = format!("http://{}", server.address);
    let output = Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(["profile", "--url", &url, "--model", "switchyard-mock"])
        .args(["--isl", "128,2048", "--samples", "2"])
        .args(["--context", "256,1024", "--concurrency", "1,4"])
        .args(["--output-tokens", "24", "--out", out.to_str().unwrap()])
        .args(["--cached-prefix", "512,2048", "--chunk", "256"])
        .args(extra)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    match switchyard_mocker::perf::load(&out.join("profile.json")).unwrap() {
        PerfModel::Interpolated(p) => p,
        PerfModel::Polynomial => panic!("not a profile"),
    }
}

/// `serve` with one worker and these arguments (and environment).
fn serve(name: &str, dir: &std::path::Path, extra: &[&str], env: &[(&str, &str)]) -> Process {
    let args: Vec<String> = ["serve", "--port", "0", "--workers", "1"]
        .iter()
        .chain(extra)
        .map(|a| a.to_string())
        .collect();
    Process::spawn_with_env(name, &args, env, dir)
}

/// The cost of attending to cached tokens set in a profile, ms per cached token per chunk
/// token: 13 ms for a 256-token chunk after 512 cached, 52 ms after 2,048.
const CONTEXT_MS: f64 = 1e-4;

#[test]
fn a_profile_of_the_mocker_recovers_its_timing_and_serve_runs_it() {
    let dir = tempfile::tempdir().unwrap();
    // Four times slower than the model: its times, not the HTTP overhead, dominate.
    let slow = serve("serve", dir.path(), &["--speedup-ratio", "0.25"], &[]);
    let out_dir = dir.path().join("profile");
    // The mocker's default cache: 16,384 blocks of 16 tokens.
    let p = profile(
        &slow,
        &out_dir,
        &["--ttft-target", "1s", "--kv-capacity-tokens", "262144"],
    );
    assert_eq!(p.prefill_isl.len(), 2);
    assert_eq!(p.decode_context_length.len(), 2);
    assert_eq!(p.decode_active_kv_tokens.len(), 4);
    // The prefill it measured is the polynomial's, four times slower, plus the server's
    // overhead (never less; how much more depends on the machine's load, so only the
    // order of the two points is asserted beyond that).
    let measured: Value =
        serde_json::from_slice(&std::fs::read(out_dir.join("measurements.json")).unwrap()).unwrap();
    let points: Vec<(f64, f64)> = measured["prefill"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["isl"].as_f64().unwrap(), p["ttft_ms"].as_f64().unwrap()))
        .collect();
    for &(isl, ttft) in &points {
        let model_ms = 4.0 * PerfModel::Polynomial.prefill_ms(isl as u32);
        assert!(
            ttft >= 0.9 * model_ms,
            "TTFT {ttft} ms at {isl} tokens, faster than the model's {model_ms}"
        );
    }
    assert!(
        points[0].0 < points[1].0 && points[0].1 < points[1].1,
        "{points:?}"
    );
    let report = std::fs::read_to_string(out_dir.join("report.md")).unwrap();
    assert!(report.contains("## Prefill") && report.contains("## Decode"));
    assert!(report.contains("Prompts up to 2048 tokens"), "{report}");
    // The load planner's thresholds, as a `[load]` table the planner reads.
    let table = report
        .split("```toml\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .unwrap();
    let load: toml::Value = toml::from_str(table).unwrap();
    let up = load["load"]["kv_usage_up"].as_float().unwrap();
    assert!(up > 0.0 && up <= 1.0, "{table}");
    assert!(
        load["load"]["prefill_queue_up"].as_float().unwrap() >= 0.5,
        "{table}"
    );
    // The polynomial model prices no attention to cached tokens: what the context sweep
    // fits is noise, a small fraction of the cost set below.
    assert!(
        p.prefill_context_ms < 0.25 * CONTEXT_MS,
        "{}",
        p.prefill_context_ms
    );
    for point in measured["context"].as_array().unwrap() {
        // The mocker's frontend says what it served from the cache: the whole prefix.
        assert_eq!(point["cached_reported"], true, "{point}");
        assert!(point["cached"].as_f64().unwrap() >= 512.0, "{point}");
    }
    for plot in ["prefill.svg", "decode.svg"] {
        let svg = std::fs::read_to_string(out_dir.join(plot)).unwrap();
        assert!(svg.starts_with("<svg"), "{plot}");
    }
    drop(slow);

    // The profile drives a mocker: `serve --perf-profile`; with a cost of attending to
    // cached tokens set in it, a profile of that mocker finds the cost again.
    let mut with_context: Value =
        serde_json::from_slice(&std::fs::read(out_dir.join("profile.json")).unwrap()).unwrap();
    with_context["prefill_context_ms"] = CONTEXT_MS.into();
    let with_context_path = dir.path().join("with-context.json");
    std::fs::write(&with_context_path, with_context.to_string()).unwrap();
    let with_context_arg = ["--perf-profile", with_context_path.to_str().unwrap()];
    let served = serve("serve-profiled", dir.path(), &with_context_arg, &[]);
    let p = profile(&served, &dir.path().join("again"), &[]);
    assert!(
        (p.prefill_context_ms - CONTEXT_MS).abs() < 0.25 * CONTEXT_MS,
        "fitted {} for {CONTEXT_MS}",
        p.prefill_context_ms
    );
    drop(served);

    // A server without prefix caching: nothing to fit, and the report says why.
    let uncached = serve(
        "serve-uncached",
        dir.path(),
        &with_context_arg,
        &[("SWITCHYARD_WORKERS__MOCKER__ENABLE_PREFIX_CACHING", "false")],
    );
    let none = dir.path().join("none");
    let p = profile(&uncached, &none, &[]);
    assert_eq!(p.prefill_context_ms, 0.0);
    let report = std::fs::read_to_string(none.join("report.md")).unwrap();
    assert!(report.contains("no prefix caching"), "{report}");
    drop(uncached);

    // A server refusing the sweep's longest prompt (2,048 + 256 tokens): the profile is
    // still written, without the context cost, and the report names the refusal.
    let short = serve(
        "serve-short",
        dir.path(),
        &[],
        &[("SWITCHYARD_FRONTEND__CONTEXT_LENGTH", "2200")],
    );
    let refused = dir.path().join("refused");
    // Written all the same (read back by `profile`).
    profile(&short, &refused, &[]);
    let report = std::fs::read_to_string(refused.join("report.md")).unwrap();
    assert!(
        report.contains("the sweep failed") && report.contains("maximum context length"),
        "{report}"
    );

    // Bad input is named.
    let out = Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args([
            "profile",
            "--url",
            "http://127.0.0.1:9",
            "--model",
            "m",
            "--isl",
            "128",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("at least two prompt lengths"));
}
