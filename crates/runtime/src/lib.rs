//! The planes a Switchyard deployment runs on, behind traits, so the same frontend and
//! workers run in one process or across machines by configuration alone:
//!
//! - [`discovery`]: which workers exist (registration under a lease, and a watch);
//! - [`events`]: KV events and load reports from workers to every frontend;
//! - [`request`]: streaming generate requests from a frontend to a worker.
//!
//! [`local`] implements all three in-process, with no external service; [`net`] over NATS,
//! etcd and HTTP/2. Beside them:
//!
//! - [`channel`]: bounded subscriptions that drop (and say so) rather than grow;
//! - [`replicas`]: replica sync, the frontends of a model telling each other what they
//!   routed where;
//! - [`snapshot`]: a worker's whole KV cache for resynchronisation, and an index's view to
//!   compare;
//! - [`trace_context`]: W3C trace context carried across the request plane;
//! - [`vllm`]: vLLM's (and SGLang's) KV events over ZMQ, decoded, as an event-plane input;
//! - `testing` (feature `testing`): real NATS and etcd servers for tests.

pub mod channel;
pub mod discovery;
pub mod events;
pub mod local;
pub mod net;
pub mod replicas;
pub mod request;
pub mod snapshot;
#[cfg(feature = "testing")]
pub mod testing;
pub mod trace_context;
pub mod vllm;

pub use discovery::{Discovery, DiscoveryError, Instances, Lease, WorkerInstance};
pub use events::{EventPlane, EventPlaneError, EventSubscription, WorkerEvent};
pub use local::LocalKvSnapshots;
pub use replicas::{
    ReplicaEvent, ReplicaMessage, ReplicaPlane, ReplicaSubscription, TrafficCounters,
};
pub use request::{EngineError, EngineService, RequestPlane, ResponseStream};
pub use snapshot::{IndexView, KvSnapshotSource, SnapshotError, StreamView};
