//! The official `openai` Python client against a running deployment.
//!
//! `scripts/test` installs the client into a virtualenv and points `SWITCHYARD_PYTHON` at
//! it; without it the test fails and says how to fix that.

#![allow(clippy::unwrap_used)]

mod support;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_python_client_works() {
    let d = support::start(&[
        ("WORKERS__COUNT", "2"),
        ("WORKERS__MOCKER__SPEEDUP_RATIO", "20"),
    ])
    .await;
    support::python_checks(&d, "openai_e2e.py", "switchyard-mock").await;
    d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
        .await
        .unwrap();
}
