//! A small etcd v3 client over etcd's JSON gateway (`/v3/...` on the client port, served by
//! every etcd since 3.4): the calls discovery needs, over plain HTTP with `reqwest`. Keys
//! and values travel base64-encoded, 64-bit integers as decimal strings, and fields equal to
//! their default are left out (proto3 JSON): a watch event without a `type` is a put, a
//! keep-alive answer without a `TTL` means the lease is gone.
//!
//! Going through the gateway rather than gRPC keeps the build free of protobuf code
//! generation (no `protoc`).

use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use bytes::{Buf, BytesMut};
use futures::StreamExt;
use futures::stream::BoxStream;
use serde::{Deserialize, Deserializer, Serialize};
use thiserror::Error;

/// Longest time a call other than a watch may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest watch message accepted (a listing of thousands of workers fits easily).
const MAX_WATCH_LINE: usize = 16 << 20;

#[derive(Debug, Error)]
pub enum EtcdError {
    #[error("cannot reach etcd at {endpoint}: {source}")]
    Http {
        endpoint: String,
        source: reqwest::Error,
    },
    #[error("etcd at {endpoint} answered {status}: {message}")]
    Status {
        endpoint: String,
        status: u16,
        message: String,
    },
    #[error("etcd sent what this client cannot read: {0}")]
    Decode(String),
    #[error("the watch ended: {0}")]
    WatchEnded(String),
}

/// One key and its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyValue {
    pub key: Vec<u8>,
    pub value: Vec<u8>,
}

/// A change under a watched prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchEvent {
    Put(KeyValue),
    Delete { key: Vec<u8> },
}

/// A lease, by id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseId(pub i64);

#[derive(Debug, Clone)]
pub struct EtcdClient {
    http: reqwest::Client,
    /// `http://host:port`
    base: String,
}

/// A 64-bit integer the gateway may write as a string or a number.
fn int64<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Int {
        Text(String),
        Number(i64),
    }
    match Int::deserialize(d)? {
        Int::Number(n) => Ok(n),
        Int::Text(s) => s.parse().map_err(serde::de::Error::custom),
    }
}

fn bytes<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
    let text = String::deserialize(d)?;
    STANDARD.decode(text).map_err(serde::de::Error::custom)
}

#[derive(Debug, Default, Deserialize)]
struct Header {
    #[serde(default, deserialize_with = "int64")]
    revision: i64,
}

#[derive(Debug, Deserialize)]
struct RawKeyValue {
    #[serde(deserialize_with = "bytes")]
    key: Vec<u8>,
    #[serde(default, deserialize_with = "bytes")]
    value: Vec<u8>,
}

#[derive(Debug, Deserialize)]
struct RangeResponse {
    #[serde(default)]
    header: Header,
    #[serde(default)]
    kvs: Vec<RawKeyValue>,
}

#[derive(Debug, Deserialize)]
struct LeaseGrantResponse {
    #[serde(rename = "ID", deserialize_with = "int64")]
    id: i64,
}

#[derive(Debug, Deserialize)]
struct KeepAliveResult {
    #[serde(rename = "TTL", default, deserialize_with = "int64")]
    ttl: i64,
}

#[derive(Debug, Deserialize)]
struct Streamed<T> {
    result: Option<T>,
    error: Option<serde_json::Value>,
}

#[derive(Debug, Deserialize)]
struct RawEvent {
    #[serde(rename = "type", default)]
    kind: Option<String>,
    kv: RawKeyValue,
}

#[derive(Debug, Default, Deserialize)]
struct WatchResult {
    #[serde(default)]
    canceled: bool,
    #[serde(default)]
    cancel_reason: String,
    #[serde(default, deserialize_with = "int64")]
    compact_revision: i64,
    #[serde(default)]
    events: Vec<RawEvent>,
}

#[derive(Serialize)]
struct RangeRequest {
    key: String,
    range_end: String,
}

#[derive(Serialize)]
struct PutRequest {
    key: String,
    value: String,
    lease: String,
}

#[derive(Serialize)]
struct LeaseRequest {
    #[serde(rename = "ID")]
    id: String,
}

#[derive(Serialize)]
struct GrantRequest {
    #[serde(rename = "TTL")]
    ttl: String,
}

#[derive(Serialize)]
struct WatchRequest {
    create_request: WatchCreate,
}

#[derive(Serialize)]
struct WatchCreate {
    key: String,
    range_end: String,
    start_revision: String,
}

/// The end of the range of every key starting with `prefix`: the prefix with its last byte
/// that is not 0xff incremented (and what follows dropped).
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // Every byte 0xff (or empty): to the end of the keyspace.
    vec![0]
}

impl EtcdClient {
    /// A client of the etcd member at `host:port`.
    pub fn new(endpoint: &str) -> Result<Self, EtcdError> {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(2))
            .tcp_nodelay(true)
            .build()
            .map_err(|source| EtcdError::Http {
                endpoint: endpoint.to_string(),
                source,
            })?;
        Ok(EtcdClient {
            http,
            base: format!("http://{endpoint}"),
        })
    }

    fn endpoint(&self) -> String {
        self.base.trim_start_matches("http://").to_string()
    }

    async fn send(
        &self,
        path: &str,
        body: &impl Serialize,
        timeout: Option<Duration>,
    ) -> Result<reqwest::Response, EtcdError> {
        let body = serde_json::to_vec(body).map_err(|e| EtcdError::Decode(e.to_string()))?;
        let mut request = self
            .http
            .post(format!("{}{path}", self.base))
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body);
        if let Some(timeout) = timeout {
            request = request.timeout(timeout);
        }
        let response = request.send().await.map_err(|source| EtcdError::Http {
            endpoint: self.endpoint(),
            source,
        })?;
        let status = response.status();
        if !status.is_success() {
            let message = response.text().await.unwrap_or_default();
            return Err(EtcdError::Status {
                endpoint: self.endpoint(),
                status: status.as_u16(),
                message: message.chars().take(500).collect(),
            });
        }
        Ok(response)
    }

    async fn call<T: for<'de> Deserialize<'de>>(
        &self,
        path: &str,
        body: &impl Serialize,
    ) -> Result<T, EtcdError> {
        let response = self.send(path, body, Some(CALL_TIMEOUT)).await?;
        let bytes = response.bytes().await.map_err(|source| EtcdError::Http {
            endpoint: self.endpoint(),
            source,
        })?;
        serde_json::from_slice(&bytes).map_err(|e| EtcdError::Decode(format!("{path}: {e}")))
    }

    /// Every key under `prefix`, and the store's revision they were read at.
    pub async fn list(&self, prefix: &[u8]) -> Result<(i64, Vec<KeyValue>), EtcdError> {
        let request = RangeRequest {
            key: STANDARD.encode(prefix),
            range_end: STANDARD.encode(prefix_end(prefix)),
        };
        let response: RangeResponse = self.call("/v3/kv/range", &request).await?;
        let kvs = response
            .kvs
            .into_iter()
            .map(|kv| KeyValue {
                key: kv.key,
                value: kv.value,
            })
            .collect();
        Ok((response.header.revision, kvs))
    }

    /// Puts `key` attached to `lease` (deleted when the lease ends).
    pub async fn put(&self, key: &[u8], value: &[u8], lease: LeaseId) -> Result<(), EtcdError> {
        let request = PutRequest {
            key: STANDARD.encode(key),
            value: STANDARD.encode(value),
            lease: lease.0.to_string(),
        };
        let _: serde_json::Value = self.call("/v3/kv/put", &request).await?;
        Ok(())
    }

    /// A new lease of `ttl` (whole seconds, at least one).
    pub async fn grant(&self, ttl: Duration) -> Result<LeaseId, EtcdError> {
        let request = GrantRequest {
            ttl: ttl.as_secs().max(1).to_string(),
        };
        let response: LeaseGrantResponse = self.call("/v3/lease/grant", &request).await?;
        Ok(LeaseId(response.id))
    }

    /// Renews a lease; returns the TTL left, 0 when the lease no longer exists.
    pub async fn keep_alive(&self, lease: LeaseId) -> Result<i64, EtcdError> {
        let request = LeaseRequest {
            id: lease.0.to_string(),
        };
        let response: Streamed<KeepAliveResult> =
            self.call("/v3/lease/keepalive", &request).await?;
        if let Some(error) = response.error {
            return Err(EtcdError::Decode(format!("keep-alive failed: {error}")));
        }
        Ok(response.result.map_or(0, |r| r.ttl))
    }

    /// Ends a lease now: its keys are deleted.
    pub async fn revoke(&self, lease: LeaseId) -> Result<(), EtcdError> {
        let request = LeaseRequest {
            id: lease.0.to_string(),
        };
        let _: serde_json::Value = self.call("/v3/lease/revoke", &request).await?;
        Ok(())
    }

    /// Every change under `prefix` from `start_revision` on, until the stream ends or fails.
    pub async fn watch(
        &self,
        prefix: &[u8],
        start_revision: i64,
    ) -> Result<BoxStream<'static, Result<Vec<WatchEvent>, EtcdError>>, EtcdError> {
        let request = WatchRequest {
            create_request: WatchCreate {
                key: STANDARD.encode(prefix),
                range_end: STANDARD.encode(prefix_end(prefix)),
                start_revision: start_revision.to_string(),
            },
        };
        let response = self.send("/v3/watch", &request, None).await?;
        let endpoint = self.endpoint();
        let lines = WatchLines {
            body: response.bytes_stream().boxed(),
            buffer: BytesMut::new(),
            endpoint,
            done: false,
        };
        Ok(futures::stream::unfold(lines, WatchLines::next).boxed())
    }
}

/// Splits a watch response into its messages, one JSON object per line.
struct WatchLines {
    body: BoxStream<'static, Result<bytes::Bytes, reqwest::Error>>,
    buffer: BytesMut,
    endpoint: String,
    done: bool,
}

impl WatchLines {
    async fn next(mut self) -> Option<(Result<Vec<WatchEvent>, EtcdError>, Self)> {
        loop {
            if self.done {
                return None;
            }
            if let Some(end) = self.buffer.iter().position(|&b| b == b'\n') {
                let line = self.buffer.split_to(end + 1);
                let line = &line[..end];
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                match parse_watch_line(line) {
                    Ok(Some(events)) => return Some((Ok(events), self)),
                    Ok(None) => continue,
                    Err(e) => {
                        self.done = true;
                        return Some((Err(e), self));
                    }
                }
            }
            if self.buffer.len() > MAX_WATCH_LINE {
                self.done = true;
                return Some((
                    Err(EtcdError::Decode("a watch message is too long".into())),
                    self,
                ));
            }
            match self.body.next().await {
                Some(Ok(chunk)) => self.buffer.extend_from_slice(&chunk),
                Some(Err(source)) => {
                    self.done = true;
                    let endpoint = std::mem::take(&mut self.endpoint);
                    return Some((Err(EtcdError::Http { endpoint, source }), self));
                }
                None => {
                    self.done = true;
                    self.buffer.advance(self.buffer.len());
                    return Some((
                        Err(EtcdError::WatchEnded("etcd closed the stream".into())),
                        self,
                    ));
                }
            }
        }
    }
}

/// One watch message: its events (`None` for messages without any, such as the one
/// confirming the watch), or why the watch ended. Public for the fuzz targets (fuzz/).
#[doc(hidden)]
pub fn parse_watch_line(line: &[u8]) -> Result<Option<Vec<WatchEvent>>, EtcdError> {
    let message: Streamed<WatchResult> =
        serde_json::from_slice(line).map_err(|e| EtcdError::Decode(format!("watch: {e}")))?;
    if let Some(error) = message.error {
        return Err(EtcdError::WatchEnded(error.to_string()));
    }
    let Some(result) = message.result else {
        return Ok(None);
    };
    if result.canceled {
        let reason = if result.compact_revision > 0 {
            format!("compacted at revision {}", result.compact_revision)
        } else {
            result.cancel_reason
        };
        return Err(EtcdError::WatchEnded(format!("cancelled: {reason}")));
    }
    if result.events.is_empty() {
        return Ok(None);
    }
    let events = result
        .events
        .into_iter()
        .map(|e| match e.kind.as_deref() {
            Some("DELETE") => WatchEvent::Delete { key: e.kv.key },
            _ => WatchEvent::Put(KeyValue {
                key: e.kv.key,
                value: e.kv.value,
            }),
        })
        .collect();
    Ok(Some(events))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_ends_cover_exactly_the_prefix() {
        assert_eq!(prefix_end(b"/a/"), b"/a0".to_vec());
        assert_eq!(prefix_end(&[b'x', 0xff]), b"y".to_vec());
        assert_eq!(prefix_end(&[0xff, 0xff]), vec![0]);
    }

    #[test]
    fn watch_messages_as_etcd_writes_them() {
        // Taken down from etcd 3.4's gateway on this machine (keys and values base64).
        let created = br#"{"result":{"header":{"revision":"2"},"created":true}}"#;
        assert_eq!(parse_watch_line(created).ok(), Some(None));
        let put = br#"{"result":{"header":{"revision":"2"},"events":[{"kv":{"key":"L3N5L2E=","create_revision":"2","mod_revision":"2","version":"1","value":"aGVsbG8=","lease":"7"}}]}}"#;
        assert_eq!(
            parse_watch_line(put).ok(),
            Some(Some(vec![WatchEvent::Put(KeyValue {
                key: b"/sy/a".to_vec(),
                value: b"hello".to_vec()
            })]))
        );
        let delete = br#"{"result":{"header":{"revision":"3"},"events":[{"type":"DELETE","kv":{"key":"L3N5L2E=","mod_revision":"3"}}]}}"#;
        assert_eq!(
            parse_watch_line(delete).ok(),
            Some(Some(vec![WatchEvent::Delete {
                key: b"/sy/a".to_vec()
            }]))
        );
        let cancelled = br#"{"result":{"canceled":true,"compact_revision":"40"}}"#;
        assert!(matches!(
            parse_watch_line(cancelled),
            Err(EtcdError::WatchEnded(m)) if m.contains("40")
        ));
        assert!(parse_watch_line(b"{not json").is_err());
    }

    #[test]
    fn an_expired_lease_reads_as_no_ttl() {
        let gone: Streamed<KeepAliveResult> =
            serde_json::from_slice(br#"{"result":{"header":{"revision":"2"},"ID":"12345"}}"#)
                .expect("decodes");
        assert_eq!(gone.result.map(|r| r.ttl), Some(0));
        let alive: Streamed<KeepAliveResult> =
            serde_json::from_slice(br#"{"result":{"ID":"7","TTL":"5"}}"#).expect("decodes");
        assert_eq!(alive.result.map(|r| r.ttl), Some(5));
    }
}
