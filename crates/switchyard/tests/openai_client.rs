//! The official `openai` Python client against a running deployment.
//!
//! `scripts/test` installs the client into a virtualenv and points `SWITCHYARD_PYTHON` at
//! it; without it the test fails and says how to fix that.

#![allow(clippy::unwrap_used)]

mod support;

use std::process::Command;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_python_client_works() {
    let python = std::env::var("SWITCHYARD_PYTHON").unwrap_or_else(|_| "python3".into());
    let probe = Command::new(&python).args(["-c", "import openai"]).output();
    assert!(
        probe.as_ref().is_ok_and(|o| o.status.success()),
        "the `openai` package is not importable with {python}; run scripts/test (it creates the virtualenv) or set SWITCHYARD_PYTHON"
    );
    let d = support::start(&[
        ("WORKERS__COUNT", "2"),
        ("WORKERS__MOCKER__SPEEDUP_RATIO", "20"),
    ])
    .await;
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/python/openai_e2e.py"
    );
    let base = format!("http://{}/v1", d.address);
    let output = tokio::process::Command::new(&python)
        .args([script, &base, "switchyard-mock"])
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("all checks passed"));
    d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
        .await
        .unwrap();
}
