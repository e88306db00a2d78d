//! The request plane: streaming generate calls from a frontend to a worker.
//!
//! A call returns a stream of [`GenerateOutput`] items ending with `Finished`. Dropping the
//! stream cancels the request on the worker. Failures are [`EngineError`]s, which say
//! whether another worker can help; a stream that ends without `Finished` ends with
//! [`EngineError::Disconnected`]: the worker was lost mid-request.

use async_trait::async_trait;
use futures::stream::BoxStream;
pub use switchyard_core::protocol::EngineError;
use switchyard_core::protocol::{GenerateOutput, GenerateRequest};
use switchyard_core::{RequestId, SequenceHash};

use crate::discovery::WorkerInstance;

/// A response stream.
pub type ResponseStream = BoxStream<'static, Result<GenerateOutput, EngineError>>;

/// The frontend side: send a request to a worker.
#[async_trait]
pub trait RequestPlane: Send + Sync + std::fmt::Debug {
    async fn generate(
        &self,
        worker: &WorkerInstance,
        request: GenerateRequest,
    ) -> Result<ResponseStream, EngineError>;

    /// How many of `blocks`, from the first, `worker` holds in its KV cache (what a decode
    /// worker asks a prefill worker before pulling a request's KV).
    async fn held_blocks(
        &self,
        worker: &WorkerInstance,
        blocks: Vec<SequenceHash>,
    ) -> Result<u32, EngineError> {
        let _ = blocks;
        Err(EngineError::Unsupported(format!(
            "this request plane cannot ask worker {} for KV blocks",
            worker.worker_id
        )))
    }

    /// Tells `worker` that request `id`'s media are encoded (it was sent with
    /// `media_pending`): its prefill may go past its first media position. Whether the
    /// request was there, held at its media.
    async fn media_ready(
        &self,
        worker: &WorkerInstance,
        id: RequestId,
    ) -> Result<bool, EngineError> {
        let _ = id;
        Err(EngineError::Unsupported(format!(
            "this request plane cannot tell worker {} that media are ready",
            worker.worker_id
        )))
    }
}

/// The worker side: what serves requests.
#[async_trait]
pub trait EngineService: Send + Sync + std::fmt::Debug {
    async fn generate(&self, request: GenerateRequest) -> Result<ResponseStream, EngineError>;

    /// How many of `blocks`, from the first, the engine holds in its KV cache; engines
    /// that cannot tell refuse.
    async fn held_blocks(&self, blocks: &[SequenceHash]) -> Result<u32, EngineError> {
        let _ = blocks;
        Err(EngineError::Unsupported(
            "this engine does not share its KV blocks".into(),
        ))
    }

    /// Request `id`'s media are encoded: its prefill may go past its first media position.
    /// Whether the request was here, held at its media; engines that do not hold requests
    /// at their media (they take the placeholders as they come) answer false.
    async fn media_ready(&self, id: RequestId) -> Result<bool, EngineError> {
        let _ = id;
        Ok(false)
    }
}
