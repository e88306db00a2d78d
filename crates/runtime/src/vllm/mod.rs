//! vLLM's (and SGLang's) KV events over ZMQ, as an input of the event plane.
//!
//! A vLLM engine started with `--kv-events-config '{"enable_kv_cache_events": true,
//! "publisher": "zmq", "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558"}'`
//! publishes three-frame messages `[topic, seq (u64 big-endian), batch]` on a PUB socket
//! and answers replay requests on a ROUTER socket: send a start sequence number (8 bytes,
//! big-endian), receive `[seq, batch]` for each batch it still holds from there, then
//! `[-1, empty]`.
//!
//! [`subscribe`] follows such a publisher: it decodes every batch ([`decode`]), tracks the
//! sequence numbers ([`SeqTracker`]), fills a gap from the replay socket, and, when the gap
//! cannot be filled (no replay socket, the batches are gone, no answer in time) or the
//! publisher restarted (its numbers start again), says the cache view is lost
//! ([`Update::Lost`]): the consumer clears what it knows of that engine's cache and
//! rebuilds it from the events that follow. The SUB socket reconnects by itself after the
//! publisher goes away.

pub mod decode;

use std::num::ParseIntError;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use serde::Serialize;
use thiserror::Error;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use zeromq::{
    DealerSocket, Socket, SocketRecv, SocketSend, SubSocket, ZmqEmptyMessageError, ZmqError,
    ZmqMessage,
};

pub use decode::{DecodeError, DecodedBatch, EventError, decode_batch};

/// Where a vLLM publisher is, and how its events are read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZmqEventsConfig {
    /// The PUB socket, e.g. `tcp://127.0.0.1:5557`.
    pub endpoint: String,
    /// The replay ROUTER socket, if the engine has one.
    pub replay_endpoint: Option<String>,
    /// The topic to subscribe to (vLLM's default is empty: everything).
    pub topic: String,
    /// Tokens per KV block of the engine (vLLM's default: 16).
    pub block_size: u32,
    /// How long a replay may take before the gap counts as unfillable.
    pub replay_timeout: Duration,
}

/// Why a KV event endpoint (or its settings) is not one to follow.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum EndpointError {
    #[error("a KV event endpoint looks like zmq://HOST:PORT, got {0:?}")]
    Scheme(String),
    #[error("{0:?} names no port")]
    NoPort(String),
    #[error("{url:?}: {port:?} is not a port")]
    Port {
        url: String,
        port: String,
        #[source]
        source: ParseIntError,
    },
    #[error("{0:?} names no host")]
    NoHost(String),
    #[error("the engine's block size must be at least 1")]
    BlockSize,
}

impl ZmqEventsConfig {
    /// Parses `zmq://HOST:PORT` (or `tcp://HOST:PORT`); the replay socket is the next port
    /// unless `replay` names one (`none` for no replay).
    pub fn parse(url: &str, replay: Option<&str>, block_size: u32) -> Result<Self, EndpointError> {
        let rest = url
            .strip_prefix("zmq://")
            .or_else(|| url.strip_prefix("tcp://"))
            .ok_or_else(|| EndpointError::Scheme(url.to_owned()))?;
        let (host, port) = rest
            .rsplit_once(':')
            .ok_or_else(|| EndpointError::NoPort(url.to_owned()))?;
        let port: u16 = port.parse().map_err(|source| EndpointError::Port {
            url: url.to_owned(),
            port: port.to_owned(),
            source,
        })?;
        if host.is_empty() {
            return Err(EndpointError::NoHost(url.to_owned()));
        }
        let replay_endpoint = match replay {
            Some("none") => None,
            Some(other) => Some(Self::parse(other, Some("none"), block_size)?.endpoint),
            None => port
                .checked_add(1)
                .map(|next| format!("tcp://{host}:{next}")),
        };
        if block_size == 0 {
            return Err(EndpointError::BlockSize);
        }
        Ok(ZmqEventsConfig {
            endpoint: format!("tcp://{host}:{port}"),
            replay_endpoint,
            topic: String::new(),
            block_size,
            replay_timeout: Duration::from_secs(2),
        })
    }
}

/// What the subscriber hands on.
#[derive(Debug, Clone, PartialEq)]
pub enum Update {
    /// A batch, in sequence order.
    Batch(DecodedBatch),
    /// Batches were missed and could not be replayed, or the publisher restarted: what was
    /// known of the engine's cache is no longer right.
    Lost { reason: String },
}

/// What a sequence number means, given the ones seen before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeqCheck {
    /// The next one (or the first one seen).
    Next,
    /// Batches `from..seq` were missed.
    Gap { from: u64 },
    /// Already seen.
    Duplicate,
    /// Lower than what was seen: the publisher started again (its numbers restart at 0).
    Restarted,
}

/// The sequence numbers of one publisher.
#[derive(Debug, Clone, Default)]
pub struct SeqTracker {
    last: Option<u64>,
}

impl SeqTracker {
    pub fn check(&self, seq: u64) -> SeqCheck {
        match self.last {
            None => SeqCheck::Next,
            Some(last) if seq == last.wrapping_add(1) => SeqCheck::Next,
            Some(last) if seq > last => SeqCheck::Gap { from: last + 1 },
            Some(last) if seq == last => SeqCheck::Duplicate,
            Some(_) => SeqCheck::Restarted,
        }
    }

    /// Records `seq` as handled.
    pub fn accept(&mut self, seq: u64) {
        self.last = Some(seq);
    }

    pub fn last(&self) -> Option<u64> {
        self.last
    }
}

/// Counters of a subscription.
#[derive(Debug, Default, Serialize)]
pub struct ZmqStats {
    pub batches: AtomicU64,
    pub events: AtomicU64,
    pub gaps: AtomicU64,
    pub replayed: AtomicU64,
    pub lost: AtomicU64,
    pub restarts: AtomicU64,
    pub decode_errors: AtomicU64,
    /// Events of types this decoder does not know, skipped.
    pub skipped_events: AtomicU64,
    pub connects: AtomicU64,
}

impl ZmqStats {
    fn inc(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}

/// Why missed batches could not be replayed (the view is then reset).
#[derive(Debug, Error)]
enum ReplayError {
    #[error("the engine has no replay socket")]
    NoSocket,
    #[error("no connection to {endpoint} in {timeout:?}")]
    ConnectTimeout { endpoint: String, timeout: Duration },
    #[error("cannot connect to {endpoint}: {source}")]
    Connect {
        endpoint: String,
        #[source]
        source: ZmqError,
    },
    /// Never for the two frames sent; ZeroMQ's error type for it is no `Error`.
    #[error("{0}")]
    EmptyMessage(ZmqEmptyMessageError),
    #[error(transparent)]
    Socket(ZmqError),
    #[error("a replayed batch without an 8-byte sequence number")]
    NoSequence,
    #[error("the publisher no longer holds batch {0}")]
    Gone(u64),
    #[error("the replay starts at {got}, not {want}")]
    Misaligned { got: u64, want: u64 },
    #[error("the replay did not complete in {0:?}")]
    Timeout(Duration),
}

/// One message of the publisher: its sequence number and payload.
fn split_published(message: ZmqMessage) -> Option<(u64, Bytes)> {
    let mut frames = message.into_vec();
    // [topic, seq, payload]; tolerate a publisher that sends no topic frame.
    let payload = frames.pop()?;
    let seq = frames.pop()?;
    Some((u64::from_be_bytes(seq.as_ref().try_into().ok()?), payload))
}

/// Follows a publisher until `cancel`, sending what it publishes to `updates`. Returns when
/// cancelled or when the receiver is gone.
pub async fn subscribe(
    config: ZmqEventsConfig,
    updates: mpsc::Sender<Update>,
    stats: Arc<ZmqStats>,
    cancel: CancellationToken,
) {
    let mut follower = Follower {
        config,
        updates,
        stats,
        tracker: SeqTracker::default(),
        replay: None,
    };
    let mut socket = tokio::select! {
        () = cancel.cancelled() => return,
        socket = follower.connect() => socket,
    };
    loop {
        let message = tokio::select! {
            () = cancel.cancelled() => return,
            message = socket.recv() => message,
        };
        let message = match message {
            Ok(message) => message,
            Err(error) => {
                tracing::warn!(endpoint = %follower.config.endpoint, %error, "KV event subscription failed; connecting again");
                socket = tokio::select! {
                    () = cancel.cancelled() => return,
                    socket = follower.connect() => socket,
                };
                continue;
            }
        };
        let Some((seq, payload)) = split_published(message) else {
            ZmqStats::inc(&follower.stats.decode_errors);
            continue;
        };
        if !follower.on_published(seq, payload).await {
            return;
        }
    }
}

struct Follower {
    config: ZmqEventsConfig,
    updates: mpsc::Sender<Update>,
    stats: Arc<ZmqStats>,
    tracker: SeqTracker,
    replay: Option<DealerSocket>,
}

impl Follower {
    /// A SUB socket connected to the publisher, trying until it is there.
    async fn connect(&mut self) -> SubSocket {
        let mut wait = Duration::from_millis(50);
        loop {
            let mut socket = SubSocket::new();
            let connected = async {
                socket.subscribe(&self.config.topic).await?;
                socket.connect(&self.config.endpoint).await
            }
            .await;
            match connected {
                Ok(()) => {
                    ZmqStats::inc(&self.stats.connects);
                    tracing::info!(endpoint = %self.config.endpoint, "following the engine's KV events");
                    return socket;
                }
                Err(error) => {
                    tracing::debug!(endpoint = %self.config.endpoint, %error, "KV event publisher not reachable yet");
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_secs(2));
                }
            }
        }
    }

    /// Handles one published batch; false once nobody listens.
    async fn on_published(&mut self, seq: u64, payload: Bytes) -> bool {
        match self.tracker.check(seq) {
            SeqCheck::Next => {}
            SeqCheck::Duplicate => return true,
            SeqCheck::Gap { from } => {
                ZmqStats::inc(&self.stats.gaps);
                if !self.fill(from, seq).await {
                    return false;
                }
            }
            SeqCheck::Restarted => {
                ZmqStats::inc(&self.stats.restarts);
                tracing::warn!(seq, last = ?self.tracker.last(), "the KV event publisher restarted");
                if !self
                    .lose(format!(
                        "the publisher restarted (sequence {seq} after {:?})",
                        self.tracker.last()
                    ))
                    .await
                {
                    return false;
                }
                // Its first batches since the restart may have gone by before we saw it.
                if seq > 0 && !self.fill(0, seq).await {
                    return false;
                }
            }
        }
        self.tracker.accept(seq);
        self.deliver(&payload).await
    }

    /// Replays `from..until`; when that cannot be done, the view is lost.
    async fn fill(&mut self, from: u64, until: u64) -> bool {
        match self.replay(from, until).await {
            Ok(batches) => {
                for (seq, payload) in batches {
                    ZmqStats::inc(&self.stats.replayed);
                    self.tracker.accept(seq);
                    if !self.deliver(&payload).await {
                        return false;
                    }
                }
                true
            }
            Err(why) => {
                tracing::warn!(from, until, %why, "missed KV event batches cannot be replayed; the engine's cache view is reset");
                self.lose(format!("batches {from}..{until} were missed: {why}"))
                    .await
            }
        }
    }

    /// Every batch from `from` to `until` (excluded), in order, or why not.
    async fn replay(&mut self, from: u64, until: u64) -> Result<Vec<(u64, Bytes)>, ReplayError> {
        let Some(endpoint) = self.config.replay_endpoint.clone() else {
            return Err(ReplayError::NoSocket);
        };
        let timeout = self.config.replay_timeout;
        let socket = match &mut self.replay {
            Some(socket) => socket,
            slot => {
                let mut socket = DealerSocket::new();
                tokio::time::timeout(timeout, socket.connect(&endpoint))
                    .await
                    .map_err(|_| ReplayError::ConnectTimeout {
                        endpoint: endpoint.clone(),
                        timeout,
                    })?
                    .map_err(|source| ReplayError::Connect {
                        endpoint: endpoint.clone(),
                        source,
                    })?;
                slot.insert(socket)
            }
        };
        // A REQ-style envelope (an empty delimiter), which the ROUTER side expects.
        let request = ZmqMessage::try_from(vec![
            Bytes::new(),
            Bytes::copy_from_slice(&from.to_be_bytes()),
        ])
        .map_err(ReplayError::EmptyMessage)?;
        let result = async {
            socket.send(request).await.map_err(ReplayError::Socket)?;
            let mut batches = Vec::new();
            let mut next = from;
            while next < until {
                let message = socket.recv().await.map_err(ReplayError::Socket)?;
                let mut frames: Vec<Bytes> = message
                    .into_vec()
                    .into_iter()
                    .skip_while(|f| f.is_empty())
                    .collect();
                let Some(payload) = frames.pop() else {
                    continue;
                };
                let Some(seq) = frames.pop() else {
                    continue;
                };
                let Ok(seq) = <[u8; 8]>::try_from(seq.as_ref()) else {
                    return Err(ReplayError::NoSequence);
                };
                let seq = i64::from_be_bytes(seq);
                if seq < 0 || payload.is_empty() {
                    return Err(ReplayError::Gone(next));
                }
                let seq = seq as u64;
                if seq < next {
                    continue; // left over from an earlier replay
                }
                if seq > next {
                    return Err(ReplayError::Misaligned {
                        got: seq,
                        want: next,
                    });
                }
                batches.push((seq, payload));
                next += 1;
            }
            Ok(batches)
        };
        match tokio::time::timeout(timeout, result).await {
            Ok(Ok(batches)) => Ok(batches),
            Ok(Err(why)) => Err(why),
            Err(_) => {
                // Whatever it still sends belongs to this replay: start afresh next time.
                self.replay = None;
                Err(ReplayError::Timeout(timeout))
            }
        }
    }

    async fn deliver(&mut self, payload: &[u8]) -> bool {
        ZmqStats::inc(&self.stats.batches);
        match decode_batch(payload, self.config.block_size) {
            Ok(batch) => {
                self.stats
                    .events
                    .fetch_add(batch.events.len() as u64, Ordering::Relaxed);
                if !batch.skipped.is_empty() {
                    self.stats
                        .skipped_events
                        .fetch_add(batch.skipped.len() as u64, Ordering::Relaxed);
                    tracing::debug!(types = ?batch.skipped, "KV events of unknown types skipped");
                }
                self.updates.send(Update::Batch(batch)).await.is_ok()
            }
            // Its events are lost: the view would go on missing what they stored, or
            // holding what they removed, so it is reset (and rebuilt from later events).
            Err(error) => {
                ZmqStats::inc(&self.stats.decode_errors);
                tracing::warn!(%error, "an undecodable KV event batch; the engine's cache view is reset");
                self.lose(format!("an undecodable batch: {error}")).await
            }
        }
    }

    async fn lose(&mut self, reason: String) -> bool {
        ZmqStats::inc(&self.stats.lost);
        self.updates.send(Update::Lost { reason }).await.is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequence_numbers() {
        let mut t = SeqTracker::default();
        assert_eq!(t.check(7), SeqCheck::Next);
        t.accept(7);
        assert_eq!(t.check(8), SeqCheck::Next);
        assert_eq!(t.check(7), SeqCheck::Duplicate);
        assert_eq!(t.check(11), SeqCheck::Gap { from: 8 });
        assert_eq!(t.check(0), SeqCheck::Restarted);
        t.accept(0);
        assert_eq!(t.check(1), SeqCheck::Next);
    }

    #[test]
    fn endpoints() {
        let c = ZmqEventsConfig::parse("zmq://10.0.0.5:5557", None, 16).unwrap();
        assert_eq!(c.endpoint, "tcp://10.0.0.5:5557");
        assert_eq!(c.replay_endpoint.as_deref(), Some("tcp://10.0.0.5:5558"));
        let c = ZmqEventsConfig::parse("tcp://h:1", Some("none"), 16).unwrap();
        assert_eq!(c.replay_endpoint, None);
        let c = ZmqEventsConfig::parse("zmq://h:1", Some("zmq://r:9"), 16).unwrap();
        assert_eq!(c.replay_endpoint.as_deref(), Some("tcp://r:9"));
        for bad in ["http://h:1", "zmq://h", "zmq://:5", "zmq://h:99999"] {
            assert!(ZmqEventsConfig::parse(bad, None, 16).is_err(), "{bad}");
        }
        assert!(ZmqEventsConfig::parse("zmq://h:1", None, 0).is_err());
    }
}
