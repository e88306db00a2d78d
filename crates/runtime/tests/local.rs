//! The in-process planes.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use async_trait::async_trait;
use futures::StreamExt;
use switchyard_core::protocol::{FinishReason, GenerateOutput, GenerateRequest};
use switchyard_core::{LoadSnapshot, RequestId, WorkerId, WorkerKey};
use switchyard_runtime::local::{LocalDiscovery, LocalEventPlane, LocalRequestPlane};
use switchyard_runtime::{
    Discovery, EngineError, EngineService, EventPlane, RequestPlane, ResponseStream, WorkerEvent,
    WorkerInstance,
};

fn instance(id: u64) -> WorkerInstance {
    WorkerInstance {
        block_size: Some(16),
        capacity_blocks: Some(100),
        max_num_seqs: Some(8),
        ..WorkerInstance::new(WorkerId(id), "m")
    }
}

#[tokio::test]
async fn leases_register_and_deregister() {
    let discovery = LocalDiscovery::new();
    let mut watch = discovery.watch();
    let lease = discovery.register(instance(1)).await.unwrap();
    assert!(
        discovery.register(instance(1)).await.is_err(),
        "no duplicate ids"
    );
    watch.changed().await.unwrap();
    assert!(watch.borrow_and_update().contains_key(&WorkerId(1)));
    drop(lease);
    watch.changed().await.unwrap();
    assert!(watch.borrow().is_empty());
}

#[tokio::test]
async fn events_fan_out_per_model() {
    let plane = LocalEventPlane::new();
    let mut a = plane.subscribe("m").await.unwrap();
    let mut b = plane.subscribe("m").await.unwrap();
    let mut other = plane.subscribe("x").await.unwrap();
    let event = WorkerEvent::Load {
        worker: WorkerKey::new(1, 0),
        load: LoadSnapshot::default(),
    };
    plane.publish("m", event.clone()).await.unwrap();
    assert_eq!(a.recv().await.unwrap(), event);
    assert_eq!(b.recv().await.unwrap(), event);
    assert!(other.try_recv().is_err());
    drop(a);
    plane.publish("m", event.clone()).await.unwrap();
    assert_eq!(b.recv().await.unwrap(), event);
}

#[derive(Debug)]
struct Fixed;

#[async_trait]
impl EngineService for Fixed {
    async fn generate(&self, request: GenerateRequest) -> Result<ResponseStream, EngineError> {
        let items = vec![
            Ok(GenerateOutput::Tokens {
                token_ids: request.prompt.token_ids.clone(),
                cached_tokens: Some(0),
                logprobs: Vec::new(),
            }),
            Ok(GenerateOutput::Finished {
                reason: FinishReason::Length,
                completion_tokens: request.prompt.token_ids.len() as u32,
                cached_tokens: None,
            }),
        ];
        Ok(futures::stream::iter(items).boxed())
    }
}

#[tokio::test]
async fn requests_reach_the_registered_service() {
    let plane = LocalRequestPlane::new();
    let request = GenerateRequest::text(RequestId(1), vec![1, 2], 2);
    assert!(matches!(
        plane.generate(&instance(7), request.clone()).await,
        Err(EngineError::Unreachable(_))
    ));
    plane.serve(WorkerId(7), Arc::new(Fixed));
    let items: Vec<_> = plane
        .generate(&instance(7), request)
        .await
        .unwrap()
        .collect()
        .await;
    assert_eq!(items.len(), 2);
    plane.remove(WorkerId(7));
    let request = GenerateRequest::text(RequestId(2), vec![], 1);
    assert!(plane.generate(&instance(7), request).await.is_err());
}

#[tokio::test]
async fn a_subscriber_that_falls_behind_is_told_events_were_lost() {
    let plane = LocalEventPlane::new();
    let mut slow = plane.subscribe("m").await.unwrap();
    let event = WorkerEvent::Load {
        worker: WorkerKey::new(1, 0),
        load: LoadSnapshot::default(),
    };
    let capacity = switchyard_runtime::channel::SUBSCRIPTION_CAPACITY;
    for _ in 0..capacity + 10 {
        plane.publish("m", event.clone()).await.unwrap();
    }
    for _ in 0..capacity {
        assert_eq!(slow.recv().await.unwrap(), event);
    }
    // Room again: the loss is announced before the next event.
    plane.publish("m", event.clone()).await.unwrap();
    assert_eq!(slow.recv().await.unwrap(), WorkerEvent::EventsLost);
    assert_eq!(slow.recv().await.unwrap(), event);
    assert!(slow.try_recv().is_err());
}
