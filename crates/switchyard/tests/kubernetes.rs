//! The Kubernetes connector against kube-rs's mock service: the requests it sends, and
//! what it makes of a refusal. (No API server can run on these machines.)

#![cfg(feature = "kubernetes")]
#![allow(clippy::unwrap_used)]

use http::{Method, Request, Response};
use kube::client::Body;
use serde_json::{Value, json};
use switchyard::kubernetes::{DeploymentScaler, ScaleError};

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

fn scaler() -> (DeploymentScaler, Handle) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(service, "default");
    (
        DeploymentScaler::new(client, "serving", "llm-workers"),
        handle,
    )
}

fn scale(replicas: u32) -> Value {
    json!({
        "apiVersion": "autoscaling/v1",
        "kind": "Scale",
        "metadata": {"name": "llm-workers", "namespace": "serving"},
        "spec": {"replicas": replicas},
        "status": {"replicas": replicas},
    })
}

/// Answers the next request after checking it is the scale PATCH for `replicas`.
async fn expect_patch(handle: &mut Handle, replicas: u32, status: u16, answer: Value) {
    let (request, send) = handle.next_request().await.unwrap();
    assert_eq!(request.method(), Method::PATCH);
    assert_eq!(
        request.uri().path(),
        "/apis/apps/v1/namespaces/serving/deployments/llm-workers/scale"
    );
    assert_eq!(
        request.headers()["content-type"],
        "application/merge-patch+json"
    );
    let body = request.into_body().collect_bytes().await.unwrap();
    let sent: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(sent, json!({"spec": {"replicas": replicas}}));
    send.send_response(
        Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(Body::from(serde_json::to_vec(&answer).unwrap()))
            .unwrap(),
    );
}

#[tokio::test]
async fn scale_up_and_down_are_patches_of_the_scale_subresource() {
    let (scaler, mut handle) = scaler();
    let server = tokio::spawn(async move {
        expect_patch(&mut handle, 4, 200, scale(4)).await;
        expect_patch(&mut handle, 2, 200, scale(2)).await;
    });
    scaler.scale_to(4).await.unwrap();
    scaler.scale_to(2).await.unwrap();
    server.await.unwrap();
}

fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    })
}

#[tokio::test]
async fn forbidden_and_conflict_are_clear_errors_not_crashes() {
    let (scaler, mut handle) = scaler();
    let server = tokio::spawn(async move {
        let forbidden = "deployments.apps \"llm-workers\" is forbidden: User \"system:serviceaccount:serving:planner\" cannot patch resource \"deployments/scale\"";
        expect_patch(&mut handle, 3, 403, status(403, "Forbidden", forbidden)).await;
        let conflict = "Operation cannot be fulfilled on deployments.apps \"llm-workers\": the object has been modified";
        expect_patch(&mut handle, 3, 409, status(409, "Conflict", conflict)).await;
    });
    let e = scaler.scale_to(3).await.unwrap_err();
    assert!(matches!(e, ScaleError::Refused { code: 403, .. }), "{e:?}");
    let text = e.to_string();
    assert!(text.contains("serving/llm-workers to 3"), "{text}");
    assert!(
        text.contains("Forbidden (403)") && text.contains("cannot patch"),
        "{text}"
    );
    let e = scaler.scale_to(3).await.unwrap_err();
    assert!(matches!(e, ScaleError::Refused { code: 409, .. }), "{e:?}");
    assert!(e.to_string().contains("Conflict (409)"));
    server.await.unwrap();
}
