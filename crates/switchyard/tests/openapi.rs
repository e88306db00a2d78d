//! The OpenAPI document describes the API the server really has: schemathesis (PyPI) fuzzes
//! every documented operation from `/openapi.json` and checks that nothing answers 5xx and
//! that every status, content type and body is the one documented.

#![allow(clippy::unwrap_used)]

mod support;

use std::collections::BTreeSet;

use serde_json::Value;
use support::*;

#[tokio::test]
async fn the_document_lists_every_public_route_and_its_errors() {
    let d = start(&[("WORKERS__COUNT", "1"), ("WORKERS__ENGINE", "echo")]).await;
    let doc: Value = client()
        .get(url(&d, "/openapi.json"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3.1"));
    let paths: BTreeSet<&str> = doc["paths"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    // With an admin listener (as here), /metrics is not on the public port, but documented
    // for the deployments that keep it there.
    let expected: BTreeSet<&str> = [
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/responses",
        "/v1/responses/{response_id}",
        "/v1/models",
        "/v1/tokenize",
        "/v1/detokenize",
        "/health",
        "/live",
        "/metrics",
    ]
    .into();
    assert_eq!(paths, expected);
    for path in [
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/responses",
        "/v1/tokenize",
        "/v1/detokenize",
    ] {
        let responses = &doc["paths"][path]["post"]["responses"];
        for code in ["200", "400", "401", "404", "413", "415", "429", "503"] {
            assert!(
                responses[code].is_object(),
                "{path} does not document {code}"
            );
        }
        let streams = path.ends_with("completions") || path == "/v1/responses";
        assert_eq!(
            responses["200"]["content"]["text/event-stream"].is_object(),
            streams,
            "{path}"
        );
    }
    assert_eq!(
        doc["components"]["schemas"]["ChatCompletionRequest"]["properties"]["model"]["enum"][0],
        "switchyard-mock"
    );
    // Every request field is in the parameter table, honoured, a no-op or refused.
    let table = std::fs::read_to_string(format!(
        "{}/../../docs/api-parameters.md",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    for schema in [
        "ChatCompletionRequest",
        "CompletionRequest",
        "ResponsesRequest",
    ] {
        let properties = doc["components"]["schemas"][schema]["properties"]
            .as_object()
            .unwrap_or_else(|| panic!("{schema} has no properties"));
        assert!(properties.len() > 12, "{schema}");
        for field in properties.keys() {
            assert!(
                table.contains(&format!("`{field}`")),
                "docs/api-parameters.md does not say what becomes of `{field}` ({schema})"
            );
        }
    }
    d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemathesis_finds_no_server_error_and_nothing_undocumented() {
    let python = std::env::var("SWITCHYARD_PYTHON").unwrap_or_else(|_| "python3".into());
    let probe = std::process::Command::new(&python)
        .args(["-c", "import schemathesis"])
        .output();
    assert!(
        probe.as_ref().is_ok_and(|o| o.status.success()),
        "`schemathesis` is not importable with {python}; run scripts/test or set SWITCHYARD_PYTHON"
    );
    let d = start(&[
        ("WORKERS__COUNT", "2"),
        ("WORKERS__MOCKER__SPEEDUP_RATIO", "50"),
        ("FRONTEND__DEFAULT_MAX_TOKENS", "16"),
    ])
    .await;
    let base = format!("http://{}", d.address);
    let cwd = tempfile::tempdir().unwrap();
    let run = tokio::process::Command::new(&python)
        .current_dir(cwd.path())
        .kill_on_drop(true)
        .args([
            "-m",
            "schemathesis.cli",
            "run",
            &format!("{base}/openapi.json"),
            "--url",
            &base,
            "--checks",
            "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance",
            // /metrics is on the admin listener here.
            "--exclude-path",
            "/metrics",
            "--max-examples",
            "40",
            "--seed",
            "42",
            "--generation-database",
            "none",
            "--workers",
            "1",
            "--request-timeout",
            "20",
            "--no-color",
            "--output-sanitize",
            "false",
        ])
        .output();
    let out = tokio::time::timeout(std::time::Duration::from_secs(600), run)
        .await
        .expect("schemathesis finishes within 10 minutes")
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    println!("{stdout}");
    d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
        .await
        .unwrap();
}
