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

#[test]
fn planners_are_compared_with_the_smallest_fixed_fleet_logged_and_plotted() {
    let dir = tempfile::tempdir().unwrap();
    let plot = dir.path().join("planner.svg");
    let log = dir.path().join("decisions.jsonl");
    let requests = dir.path().join("requests.jsonl");
    let config = dir.path().join("planner.toml");
    std::fs::write(
        &config,
        "adjustment_interval = \"10s\"\n[sla]\ntarget_utilization = 0.7\n",
    )
    .unwrap();
    let out = sim(&[
        "--planner",
        "load,sla",
        "--planner-config",
        config.to_str().unwrap(),
        "--workers",
        "1",
        "--policy",
        "kv",
        "--ttft-target",
        "3s",
        "--itl-target",
        "80ms",
        "--max-gpus",
        "8",
        "--cold-start",
        "5s",
        "--decision-log",
        log.to_str().unwrap(),
        "--requests-out",
        requests.to_str().unwrap(),
        "--plot",
        plot.to_str().unwrap(),
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let o: Value = serde_json::from_slice(&out.stdout).unwrap();
    let fleets = o["fleets"].as_array().unwrap();
    let names: Vec<&str> = fleets
        .iter()
        .map(|f| f["fleet"].as_str().unwrap())
        .collect();
    // The smallest fixed fleet meeting the targets comes first, when one does.
    match o["smallest_fixed"].as_u64() {
        Some(n) => {
            assert_eq!(names[0], format!("{n} fixed workers"));
            assert!(fleets[0]["report"]["sla"]["share"].as_f64().unwrap() >= 0.95);
            assert!(names[1..] == ["load planner", "sla planner"], "{names:?}");
        }
        None => assert_eq!(names, ["load planner", "sla planner"]),
    }
    // Every fleet ran behind the servers' admission, waiting at most the TTFT target.
    assert_eq!(
        o["admission"]["busy_kv_threshold"], 0.8,
        "{}",
        o["admission"]
    );
    assert_eq!(o["admission"]["wait_target"], "3s", "{}", o["admission"]);
    for f in &fleets[fleets.len() - 2..] {
        let r = &f["report"];
        let refused = r["rejected"].as_u64().unwrap();
        assert_eq!(r["completed"].as_u64().unwrap() + refused, 300, "{f}");
        assert_eq!(
            r["rejected_by_reason"]["wait_too_long"]
                .as_u64()
                .unwrap_or(0),
            refused
        );
        assert!(f["gpu_hours"].as_f64().unwrap() > 0.0);
        assert!(!r["planner"]["decisions"].as_array().unwrap().is_empty());
    }
    assert_eq!(o["predictors"].as_array().unwrap().len(), 5);
    // One line per decision of each planner, at the 10 s interval the file set.
    let lines: Vec<Value> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let of = |p: &str| lines.iter().filter(|l| l["planner"] == p).count();
    assert_eq!(
        of("load planner"),
        fleets[fleets.len() - 2]["report"]["planner"]["decisions"]
            .as_array()
            .unwrap()
            .len()
    );
    assert!(of("sla planner") > 0);
    let first_load = lines
        .iter()
        .find(|l| l["planner"] == "load planner")
        .unwrap();
    assert_eq!(first_load["at"], 10.0);
    // Every request of every fleet in the table, labelled with its fleet.
    let fates: Vec<Value> = std::fs::read_to_string(&requests)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    for name in &names {
        let of_fleet: Vec<&Value> = fates.iter().filter(|f| f["policy"] == *name).collect();
        assert_eq!(of_fleet.len(), 300, "{name}");
        assert!(
            of_fleet
                .iter()
                .all(|f| f["ttft_ms"].as_f64().is_some() || f["outcome"] == "wait_too_long")
        );
    }
    assert_eq!(fates.len(), 300 * names.len());
    let svg = std::fs::read_to_string(&plot).unwrap();
    for label in [
        "Workers over time",
        "sla planner",
        "requests/s",
        "mean TTFT",
    ] {
        assert!(svg.contains(label), "no {label:?} in the plot");
    }
    // The flags, given, win: the routing core's own admission.
    let out = sim(&[
        "--planner",
        "sla",
        "--max-gpus",
        "4",
        "--wait-target",
        "off",
        "--busy-kv-threshold",
        "0.95",
        "--json",
    ]);
    assert!(out.status.success());
    let o: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(o["admission"]["busy_kv_threshold"], 0.95);
    assert_eq!(o["admission"]["wait_target"], "off", "{}", o["admission"]);
    // Bad settings are named, with their key.
    let out = sim(&["--wait-target", "0s"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("frontend.admission.wait_target must be longer than zero"),
        "{stderr}"
    );
    let out = sim(&["--wait-target", "soon"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("frontend.admission.wait_target") && stderr.contains("\"off\""),
        "{stderr}"
    );
    let out = sim(&["--planner", "sla", "--sla-share", "1.5"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--sla-share"));
    std::fs::write(&config, "[load]\nkv_usage_down = 0.95\n").unwrap();
    let out = sim(&[
        "--planner",
        "load",
        "--planner-config",
        config.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("planner.load.kv_usage_down"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = sim(&["--planner", "sla", "--workers", "2,3"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("--planner runs one fleet"));
    let out = sim(&["--workers", "2,3", "--requests-out", "x.jsonl"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--requests-out"));
}

#[test]
fn disaggregated_splits_are_compared_with_the_aggregated_fleet_of_their_size() {
    let out = sim(&["--disagg", "1:2,2:1", "--policy", "kv", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    let fleets = json["fleets"].as_array().unwrap();
    let names: Vec<&str> = fleets
        .iter()
        .map(|f| f["fleet"].as_str().unwrap())
        .collect();
    // One aggregated fleet of 3 for both splits of 3.
    assert_eq!(names, ["aggregated 3", "disagg 1:2", "disagg 2:1"]);
    for f in fleets {
        let r = &f["report"];
        let settled = ["completed", "rejected", "failed"]
            .iter()
            .map(|k| r[k].as_u64().unwrap())
            .sum::<u64>();
        assert_eq!(settled, 300, "{f}");
        assert!(r["completed"].as_u64().unwrap() > 100, "{f}");
        assert_eq!(r["workers"].as_u64(), Some(3));
        assert_eq!(r["cache_view"].as_str(), Some("events"));
    }
    assert!(fleets[0]["report"].get("disagg").is_none());
    let d = &fleets[1]["report"]["disagg"];
    assert_eq!(d["prefill_workers"].as_u64(), Some(1));
    assert_eq!(d["decode_workers"].as_u64(), Some(2));
    assert!(d["remote_prefills"].as_u64().unwrap() > 0, "{d}");

    // The table names the fleets; bad splits are named.
    let out = sim(&["--disagg", "1:2"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("aggregated 3") && text.contains("disagg 1:2"),
        "{text}"
    );
    for (bad, says) in [("0:3", "PREFILL:DECODE"), ("3", "PREFILL:DECODE")] {
        let out = sim(&["--disagg", bad]);
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{bad}: {err}");
    }
    let out = sim(&["--disagg", "1:2", "--sweep"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--disagg"));

    // A planned disaggregated fleet, against the smallest fixed fleet of the same split.
    let out = sim(&[
        "--disagg",
        "1:1",
        "--planner",
        "load",
        "--policy",
        "kv",
        "--ttft-target",
        "3s",
        "--itl-target",
        "80ms",
        "--max-gpus",
        "6",
        "--adjustment-interval",
        "10s",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let o: Value = serde_json::from_slice(&out.stdout).unwrap();
    let fleets = o["fleets"].as_array().unwrap();
    let planned = fleets
        .iter()
        .find(|f| f["fleet"] == "load planner")
        .unwrap_or_else(|| panic!("{o}"));
    let first = &planned["report"]["planner"]["decisions"][0];
    assert_eq!(first["replicas"]["prefill"], 1, "{first}");
    assert_eq!(first["replicas"]["decode"], 1, "{first}");
    assert!(
        planned["report"]["disagg"]["remote_prefills"]
            .as_u64()
            .unwrap()
            > 0
    );
    if let Some(n) = o["smallest_fixed"].as_u64() {
        let fixed = fleets[0]["fleet"].as_str().unwrap();
        assert!(fixed.starts_with("fixed "), "{fixed}");
        let (p, d) = fixed["fixed ".len()..].split_once(':').unwrap();
        assert_eq!(p.parse::<u64>().unwrap() + d.parse::<u64>().unwrap(), n);
    }
    let out = sim(&["--disagg", "1:1,2:2", "--planner", "load"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("one P:D split"));
}

/// The example deployment's configuration file, as `serve --config` reads it.
const PRODUCTION: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../deploy/config/production.toml"
);

#[test]
fn a_serve_configuration_replays_in_the_simulator_as_it_is() {
    let served = switchyard::config::load(
        Some(std::path::Path::new(PRODUCTION)),
        &Default::default(),
        toml::Table::new(),
    )
    .unwrap();
    let out = sim(&["--config", PRODUCTION, "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let o: Value = serde_json::from_slice(&out.stdout).unwrap();
    // Every routing setting is the file's, as `serve` would run it, and so is the fleet.
    assert_eq!(
        o["routing"],
        serde_json::to_value(served.frontend.routing()).unwrap()
    );
    assert_eq!(o["routing"]["router"]["latency"]["itl_weight"], 0.2);
    assert_eq!(o["routing"]["admission"]["wait_target"], "3s");
    assert_eq!(o["routing"]["migration"]["max_migrations"], 2);
    assert_eq!(o["workers"], 6);
    assert_eq!(o["engine"]["block_size"], 32);
    assert_eq!(o["engine"]["num_gpu_blocks"], 8192);
    // One policy: the deployment's.
    let policies: Vec<&String> = o["policies"].as_object().unwrap().keys().collect();
    assert_eq!(policies, ["latency"]);
    // Keys and flags override the file; durations are durations.
    let out = sim(&[
        "--config",
        PRODUCTION,
        "--set",
        "frontend.router.latency.itl_weight=0.5",
        "--queue-timeout",
        "45s",
        "--workers",
        "3",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let o: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(o["routing"]["router"]["latency"]["itl_weight"], 0.5);
    assert_eq!(o["routing"]["router"]["latency"]["queue_delay_weight"], 0.4);
    assert_eq!(o["routing"]["admission"]["queue_timeout"], "45s");
    assert_eq!(o["workers"], 3);
    // A bad value is named by its key, by the one loader.
    for (set, key) in [
        (
            "frontend.router.latency.itl_weight=-1",
            "frontend.router.latency.itl_weight",
        ),
        (
            "frontend.router.latency.itl_weigth=1",
            "unknown field `itl_weigth`",
        ),
        (
            "frontend.migration.max_dispatch_attempts=0",
            "frontend.migration.max_dispatch_attempts",
        ),
    ] {
        let out = sim(&["--config", PRODUCTION, "--set", set]);
        assert!(!out.status.success(), "{set}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(key), "{set}: {stderr}");
    }
    let out = sim(&["--set", "frontend.router.seed"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("expected KEY=VALUE"));
}

#[test]
fn a_session_trace_is_replayed_closed_loop_and_a_broken_one_names_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sessions.jsonl");
    let mut rows = String::new();
    for turn in 0..3u64 {
        for s in 0..3u64 {
            let ids: Vec<String> = (0..turn + 2).map(|b| (s * 100 + b).to_string()).collect();
            let when = if turn == 0 {
                format!("\"timestamp\": {}", s * 30)
            } else {
                "\"delay\": 100, \"tool_wait_ms\": 900".to_string()
            };
            rows.push_str(&format!(
                "{{\"session_id\": \"s{s}\", {when}, \"input_length\": {}, \"output_length\": 12, \"hash_ids\": [{}]}}\n",
                (turn + 2) * 512,
                ids.join(", ")
            ));
        }
    }
    std::fs::write(&path, &rows).unwrap();
    let run = |path: &std::path::Path| {
        Command::new(env!("CARGO_BIN_EXE_switchyard"))
            .args(["sim", "--trace", path.to_str().unwrap(), "--workers", "2"])
            .output()
            .unwrap()
    };
    let out = run(&path);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("3 sessions (closed loop), 3.0 turns each (most 3)"),
        "{stdout}"
    );
    assert!(stdout.contains("TTFT p50/p99 ms by turn: 1 "), "{stdout}");
    // Sessions set their own pace: `bench` refuses a rate for them.
    let out = Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args([
            "bench",
            "--url",
            "http://127.0.0.1:9",
            "--model",
            "m",
            "--rate",
            "5",
        ])
        .arg("--trace")
        .arg(&path)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("drop --rate and --concurrency"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The third row waits for a request no row names.
    let broken = dir.path().join("broken.jsonl");
    std::fs::write(
        &broken,
        "{\"request_id\": \"a\", \"timestamp\": 0, \"input_length\": 512, \"output_length\": 4, \"hash_ids\": [1]}\n\
         {\"request_id\": \"b\", \"wait_for\": [\"a\"], \"input_length\": 512, \"output_length\": 4, \"hash_ids\": [1]}\n\
         {\"request_id\": \"c\", \"wait_for\": [\"z\"], \"input_length\": 512, \"output_length\": 4, \"hash_ids\": [1]}\n",
    )
    .unwrap();
    let out = run(&broken);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("broken.jsonl:3: wait_for names \"z\", which no row has as its request_id"),
        "{stderr}"
    );
}

#[test]
fn sessions_recovered_from_a_flat_trace_replay_closed_loop_or_open() {
    let dir = tempfile::tempdir().unwrap();
    let sessions = dir.path().join("recovered.jsonl");
    let out = Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(["synth", "analyze", TRACE, "--sessions-out"])
        .arg(&sessions)
        .args(["--answer-ms-per-token", "20"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("recovered from prefix chains"), "{stdout}");
    let written = std::fs::read_to_string(&sessions).unwrap();
    assert_eq!(written.lines().count(), 3000);
    assert!(
        written.contains("\"wait_for\":[\"r"),
        "no row continues another"
    );
    let replay = |extra: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_switchyard"))
            .args([
                "sim",
                "--trace",
                sessions.to_str().unwrap(),
                "--workers",
                "4",
            ])
            .args(["--limit", "600"])
            .args(extra)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let closed = replay(&[]);
    assert!(closed.contains("sessions (closed loop)"), "{closed}");
    let open = replay(&["--open-loop"]);
    assert!(
        open.contains("600 requests") && !open.contains("closed loop"),
        "{open}"
    );
    // A negative estimate of the answer's time is refused.
    let out = Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(["synth", "analyze", TRACE, "--sessions-out"])
        .arg(&sessions)
        .args(["--answer-ms-per-token=-1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--answer-ms-per-token must be 0 or more")
    );
}
