//! The request plane: streaming generate calls from a frontend to a worker.
//!
//! A call returns a stream of [`GenerateOutput`] items ending with `Finished`. Dropping the
//! stream cancels the request on the worker. A stream that ends without `Finished` or with
//! [`RequestPlaneError::Disconnected`] means the worker was lost mid-request.

use async_trait::async_trait;
use futures::stream::BoxStream;
use switchyard_core::protocol::{GenerateOutput, GenerateRequest};
use thiserror::Error;

use crate::discovery::WorkerInstance;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RequestPlaneError {
    #[error("worker {0} is not reachable here")]
    UnknownWorker(String),
    #[error("the worker refused the request: {0}")]
    Rejected(String),
    #[error("cannot reach the worker: {0}")]
    Unavailable(String),
    #[error("the connection to the worker was lost mid-request")]
    Disconnected,
}

/// A response stream.
pub type ResponseStream = BoxStream<'static, Result<GenerateOutput, RequestPlaneError>>;

/// The frontend side: send a request to a worker.
#[async_trait]
pub trait RequestPlane: Send + Sync + std::fmt::Debug {
    async fn generate(
        &self,
        worker: &WorkerInstance,
        request: GenerateRequest,
    ) -> Result<ResponseStream, RequestPlaneError>;
}

/// The worker side: what serves requests.
#[async_trait]
pub trait EngineService: Send + Sync + std::fmt::Debug {
    async fn generate(&self, request: GenerateRequest)
    -> Result<ResponseStream, RequestPlaneError>;
}
