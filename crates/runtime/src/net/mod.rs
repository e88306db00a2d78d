//! The distributed planes: NATS for events, etcd for discovery, HTTP/2 for requests.

pub mod conns;
pub mod deadline;
pub mod etcd;
pub mod http;
pub mod kv;
pub mod nats;
pub mod secret;
pub mod server;

/// A name safe to use as one NATS subject token or one etcd key segment.
pub fn token(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}
