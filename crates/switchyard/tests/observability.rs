//! Observability: the metric catalogue (`docs/metrics.md`) against what `serve` exposes,
//! the Grafana dashboard's queries and the alert rules checked by `promtool`, and a real
//! Prometheus scraping `serve`.

#![allow(clippy::unwrap_used)]

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::*;
use switchyard::deploy::SHUTDOWN_GRACE;
use switchyard_runtime::testing::{PrometheusServer, promtool};
use switchyard_worker::faults::Fault;

const MODEL: &str = "switchyard-mock";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// One documented metric: its type and label names (besides `model`).
#[derive(Debug, Clone, PartialEq)]
struct Documented {
    kind: String,
    labels: BTreeSet<String>,
}

/// The catalogue's tables: every row whose first cell is a backquoted metric name.
fn catalogue() -> BTreeMap<String, Documented> {
    let text = std::fs::read_to_string(repo().join("docs/metrics.md")).unwrap();
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        // "| `name` | type | `a`, `b` | meaning |" splits into ["", name, type, labels, ..].
        if cells.len() < 5 || !cells[1].starts_with("`switchyard_") {
            continue;
        }
        let name = cells[1].trim_matches('`').to_string();
        let labels = cells[3]
            .split(',')
            .map(|l| l.trim().trim_matches('`'))
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect();
        let previous = out.insert(
            name.clone(),
            Documented {
                kind: cells[2].to_string(),
                labels,
            },
        );
        assert!(previous.is_none(), "{name} is listed twice");
    }
    assert!(out.len() > 20, "the catalogue's tables were not found");
    out
}

/// What a scrape exposes: per metric family (named as the catalogue names it: counters
/// with `_total`), its type and the label names seen on its series (besides `model` and
/// histograms' `le`); also whether every series carried `model="<model>"`.
fn exposed(text: &str) -> (BTreeMap<String, Documented>, Vec<String>) {
    let mut families: BTreeMap<String, Documented> = BTreeMap::new();
    let mut without_model = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            let name = match kind {
                "counter" => format!("{name}_total"),
                _ => name.to_string(),
            };
            families.insert(
                name,
                Documented {
                    kind: kind.to_string(),
                    labels: BTreeSet::new(),
                },
            );
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let series = line.split(' ').next().unwrap();
        let (name, labels) = match series.split_once('{') {
            Some((name, labels)) => (name, labels.trim_end_matches('}')),
            None => (series, ""),
        };
        if !labels.contains(&format!("model=\"{MODEL}\"")) {
            without_model.push(line.to_string());
        }
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| {
                name.strip_suffix(suffix)
                    .filter(|base| families.get(*base).is_some_and(|f| f.kind == "histogram"))
            })
            .unwrap_or(name);
        let entry = families
            .get_mut(family)
            .unwrap_or_else(|| panic!("series {name} has no TYPE line"));
        for pair in labels.split("\",").filter(|p| !p.is_empty()) {
            let key = pair.split('=').next().unwrap();
            if key != "model" && key != "le" {
                entry.labels.insert(key.to_string());
            }
        }
    }
    (families, without_model)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metric_catalogue_lists_exactly_what_serve_exposes() {
    let d = start(&[
        ("WORKERS__COUNT", "3"),
        ("WORKERS__MOCKER__SPEEDUP_RATIO", "5"),
        ("FRONTEND__HEALTH__CANARY_INTERVAL", "200ms"),
        ("FRONTEND__HEALTH__CANARY_IDLE", "200ms"),
    ])
    .await;
    // Traffic on every worker, then one crashes under streams (failures, migrations).
    let body = |i: u64| {
        json!({"model": MODEL, "prompt": format!("metrics {i} ").repeat(20),
               "max_tokens": 60, "stream": true})
    };
    let target = url(&d, "/v1/completions");
    let bodies: Vec<Value> = (0..9).map(body).collect();
    let open = futures::future::join_all(bodies.iter().map(|b| open_stream(&target, b))).await;
    inject(&d, busiest(&d), Fault::Crash);
    futures::future::join_all(open.into_iter().map(OpenStream::finish)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let text = scrape(&url(&d, "/metrics")).await;
    d.shutdown(SHUTDOWN_GRACE).await.unwrap();

    let documented = catalogue();
    let (families, without_model) = exposed(&text);
    assert!(
        without_model.is_empty(),
        "series without the model label: {without_model:?}"
    );
    for (name, family) in &families {
        let doc = documented.get(name).unwrap_or_else(|| {
            panic!(
                "{name} ({}) is exposed but not in docs/metrics.md",
                family.kind
            )
        });
        assert_eq!(doc.kind, family.kind, "{name}: type");
        assert!(
            family.labels.is_subset(&doc.labels),
            "{name}: labels {:?} exposed, {:?} documented",
            family.labels,
            doc.labels
        );
    }
    // A labelled family appears with its first series; every other documented metric is
    // always there.
    for (name, doc) in &documented {
        assert!(
            families.contains_key(name) || !doc.labels.is_empty(),
            "{name} is documented but not exposed"
        );
    }
    // The traffic above reached the labelled families that matter most.
    for name in [
        "switchyard_http_requests_total",
        "switchyard_dispatched_requests_total",
        "switchyard_worker_health",
        "switchyard_worker_failures_total",
        "switchyard_migrations_total",
        "switchyard_canaries_total",
        "switchyard_engine_kv_usage",
    ] {
        assert_eq!(
            families[name].labels, documented[name].labels,
            "{name}: every documented label shows up\n{text}"
        );
    }
    assert!(metric_value(&text, "switchyard_queue_time_seconds_count", None) >= 9.0);
}

/// Metric names a PromQL text refers to (histogram series named by their family).
fn metric_names(promql: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let bytes = promql.as_bytes();
    let mut i = 0;
    while let Some(at) = promql[i..].find("switchyard_") {
        let start = i + at;
        let mut end = start;
        while end < bytes.len() && (bytes[end].is_ascii_alphanumeric() || bytes[end] == b'_') {
            end += 1;
        }
        let name = &promql[start..end];
        let name = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .unwrap_or(name);
        names.insert(name.to_string());
        i = end;
    }
    names
}

fn run(tool: &Path, args: &[&str], dir: &Path) -> String {
    let out = Command::new(tool)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", tool.display()));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "{} {args:?} failed:\n{text}",
        tool.display()
    );
    text
}

#[test]
fn every_dashboard_query_and_alert_rule_passes_promtool_and_uses_catalogued_metrics() {
    let documented = catalogue();
    let promtool = promtool();
    // The dashboard: every panel's queries, with Grafana's variables given values, become
    // recording rules that promtool parses.
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(repo().join("deploy/grafana/switchyard.json")).unwrap(),
    )
    .unwrap();
    let mut exprs = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().unwrap();
            exprs.push((
                panel["title"].as_str().unwrap().to_string(),
                expr.to_string(),
            ));
        }
    }
    assert!(exprs.len() >= 20, "{} queries", exprs.len());
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, (title, expr)) in exprs.iter().enumerate() {
        for name in metric_names(expr) {
            assert!(
                documented.contains_key(&name) || documented.contains_key(&format!("{name}_total")),
                "panel {title:?} uses {name}, which docs/metrics.md does not list"
            );
        }
        let expr = expr
            .replace("$__rate_interval", "5m")
            .replace("$model", ".*");
        assert!(
            !expr.contains('$'),
            "panel {title:?}: unknown variable in {expr}"
        );
        rules.push_str(&format!(
            "      - record: dashboard:panel_{i}\n        expr: {}\n",
            serde_json::to_string(&expr).unwrap()
        ));
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("dashboard.yml"), rules).unwrap();
    let checked = run(&promtool, &["check", "rules", "dashboard.yml"], dir.path());
    assert!(
        checked.contains(&format!("{} rules found", exprs.len())),
        "{checked}"
    );

    // The alert rules: valid, on catalogued metrics, and their unit tests pass.
    let alerts_dir = repo().join("deploy/prometheus");
    let alerts = std::fs::read_to_string(alerts_dir.join("alerts.yml")).unwrap();
    for name in metric_names(&alerts) {
        assert!(
            documented.contains_key(&name) || documented.contains_key(&format!("{name}_total")),
            "alerts.yml uses {name}, which docs/metrics.md does not list"
        );
    }
    run(&promtool, &["check", "rules", "alerts.yml"], &alerts_dir);
    let tested = run(
        &promtool,
        &["test", "rules", "alerts_test.yml"],
        &alerts_dir,
    );
    assert!(tested.contains("SUCCESS"), "{tested}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_prometheus_scrapes_serve_and_answers_a_query() {
    let d = start(&[
        ("WORKERS__COUNT", "2"),
        ("WORKERS__MOCKER__SPEEDUP_RATIO", "10"),
    ])
    .await;
    let prometheus =
        tokio::task::block_in_place(|| PrometheusServer::start(&[d.admin_address.unwrap()]));
    for i in 0..5 {
        let (status, _, body) = post(
            &d,
            "/v1/completions",
            &json!({"model": MODEL, "prompt": format!("scraped {i}"), "max_tokens": 5}),
        )
        .await;
        assert_eq!(status, 200, "{body}");
    }
    let since = Instant::now();
    let answered = loop {
        let answer = query(
            &prometheus,
            "sum(switchyard_http_requests_total{route=\"/v1/completions\",status=\"200\"})",
        )
        .await;
        let value = answer["data"]["result"][0]["value"][1]
            .as_str()
            .and_then(|v| v.parse::<f64>().ok());
        if value == Some(5.0) {
            break answer;
        }
        assert!(
            since.elapsed() < Duration::from_secs(30),
            "no answer of 5 within 30 s; last: {answer}\n{}",
            prometheus.log()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert_eq!(answered["status"], "success");
    // The scrape itself was healthy and carried the model label.
    let up = query(&prometheus, "up{job=\"switchyard\"}").await;
    assert_eq!(up["data"]["result"][0]["value"][1], "1", "{up}");
    let by_model = query(&prometheus, "switchyard_workers").await;
    assert_eq!(
        by_model["data"]["result"][0]["metric"]["model"], MODEL,
        "{by_model}"
    );
    assert_eq!(by_model["data"]["result"][0]["value"][1], "2", "{by_model}");
    d.shutdown(SHUTDOWN_GRACE).await.unwrap();
}

/// An instant query's answer from Prometheus's HTTP API.
async fn query(prometheus: &PrometheusServer, expr: &str) -> Value {
    let url = reqwest::Url::parse_with_params(
        &format!("{}/api/v1/query", prometheus.url()),
        [("query", expr)],
    )
    .unwrap();
    support::cluster::get_json(url.as_str()).await
}
