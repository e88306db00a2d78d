//! `switchyard sim` as a user runs it: a sweep with its plot, faults, and bad input.

#![allow(clippy::unwrap_used)]

use std::process::Command;

use serde_json::Value;

const TRACE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../testdata/mooncake_conversation_head3000.jsonl"
);

fn sim(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .arg("sim")
        .args(["--trace", TRACE, "--limit", "300"])
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn a_sweep_runs_every_policy_on_every_fleet_and_load_and_plots_it() {
    let dir = tempfile::tempdir().unwrap();
    let plot = dir.path().join("ttft.svg");
    let out = sim(&[
        "--workers",
        "2,3",
        "--speedup",
        "1,2",
        "--policy",
        "kv,latency",
        "--plot",
        plot.to_str().unwrap(),
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let points: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(points.len(), 8);
    let mut seen: Vec<(u64, f64, String)> = points
        .iter()
        .map(|p| {
            let r = &p["report"];
            let settled = ["completed", "rejected", "failed"]
                .iter()
                .map(|k| r[k].as_u64().unwrap())
                .sum::<u64>();
            assert_eq!(settled, 300, "{p}");
            (
                p["workers"].as_u64().unwrap(),
                p["speedup"].as_f64().unwrap(),
                p["report"]["policy"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    seen.sort_by(|a, b| a.partial_cmp(b).unwrap());
    seen.dedup();
    assert_eq!(seen.len(), 8, "every combination once");
    // Twice the speedup on the same fleet: twice the offered load per worker.
    let load = |w: u64, s: f64| {
        points
            .iter()
            .find(|p| p["workers"] == w && p["speedup"].as_f64() == Some(s))
            .unwrap()["offered_per_worker"]
            .as_f64()
            .unwrap()
    };
    assert!((load(2, 2.0) / load(2, 1.0) - 2.0).abs() < 1e-9);
    assert!((load(2, 1.0) / load(3, 1.0) - 1.5).abs() < 1e-9);
    let svg = std::fs::read_to_string(&plot).unwrap();
    assert!(svg.starts_with("<svg"));
    for label in ["kv, 2 workers", "latency, 3 workers", "TTFT p90"] {
        assert!(svg.contains(label), "no {label:?} in the plot");
    }
    // The table form: a row per point.
    let out = sim(&["--workers", "2,3", "--policy", "latency"]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        text.lines().filter(|l| l.starts_with("latency ")).count(),
        2
    );
}

#[test]
fn faults_are_reported_and_bad_flags_are_named() {
    let out = sim(&[
        "--workers",
        "3",
        "--policy",
        "latency",
        "--fault",
        "2:crash@20s+10s",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let failures = &report["policies"]["latency"]["failures"];
    assert_eq!(failures["faults"], 1, "{failures}");
    let r = &report["policies"]["latency"];
    let settled = ["completed", "rejected", "failed"]
        .iter()
        .map(|k| r[k].as_u64().unwrap())
        .sum::<u64>();
    assert_eq!(settled, 300);
    for (args, message) in [
        (vec!["--plot", "x.svg"], "--plot draws a sweep"),
        (vec!["--workers", "2,0"], "--workers must be at least 1"),
        (
            vec!["--speedup", "1,-2"],
            "--speedup must be a positive number",
        ),
        (vec!["--fault", "9:crash@1s"], "there are only 4 workers"),
        (vec!["--workers", "2,3", "--mtbf", "10m"], "not in a sweep"),
        (vec!["--policy", "fastest"], "unknown routing policy"),
    ] {
        let out = sim(&args);
        assert!(!out.status.success(), "{args:?} succeeded");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(message), "{args:?}: {err}");
    }
}
