//! One line of an etcd watch stream (JSON from the gRPC gateway), as the discovery watch
//! parses it: `parse_watch_line` in crates/runtime/src/net/etcd/client.rs. Private today;
//! needs it made `#[doc(hidden)] pub` (README.md); build with `--features watch-hook`.
//!
//! Properties, against the line read as plain JSON: an `error` ends the watch; a cancelled
//! result ends it; otherwise the events returned are the line's events, in order, with
//! `DELETE` as a deletion and anything else as a put.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use switchyard_fuzz::seed;
use switchyard_runtime::net::etcd::client::{WatchEvent, parse_watch_line};

/// Lines as etcd's gateway writes them (keys and values in base64).
const SEEDS: [&str; 5] = [
    r#"{"result":{"header":{"cluster_id":"1","member_id":"2","revision":"5","raft_term":"2"},"created":true}}"#,
    r#"{"result":{"header":{"revision":"6"},"events":[{"kv":{"key":"c3dpdGNoeWFyZC93b3JrZXJzLzE=","create_revision":"6","mod_revision":"6","version":"1","value":"eyJ3b3JrZXJfaWQiOjF9","lease":"7587"}},{"type":"DELETE","kv":{"key":"c3dpdGNoeWFyZC93b3JrZXJzLzI=","mod_revision":"7"}}]}}"#,
    r#"{"result":{"header":{"revision":"9"},"canceled":true,"compact_revision":"3"}}"#,
    r#"{"result":{"header":{"revision":"9"},"canceled":true,"cancel_reason":"permission denied"}}"#,
    r#"{"error":{"grpc_code":14,"http_code":503,"message":"etcdserver: no leader","http_status":"Service Unavailable"}}"#,
];

fuzz_target!(init: seed(SEEDS.iter().map(|s| s.as_bytes().to_vec())), |data: &[u8]| {
    let parsed = parse_watch_line(data);
    // The reference reading: only for lines serde_json reads as a `Value` too (the typed
    // parse skips ignored fields without checking their UTF-8 or escapes: harmless).
    let Ok(value) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    let Ok(events) = parsed else {
        return;
    };
    assert!(value.get("error").is_none_or(Value::is_null), "an error line was accepted");
    let result = value.get("result").filter(|r| !r.is_null());
    let listed = result
        .and_then(|r| r.get("events"))
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    match events {
        None => assert!(listed.is_empty(), "{} events were dropped", listed.len()),
        Some(events) => {
            assert!(!events.is_empty(), "Some(empty) instead of None");
            assert_eq!(events.len(), listed.len());
            assert!(result.and_then(|r| r.get("canceled")).and_then(Value::as_bool) != Some(true));
            for (event, raw) in events.iter().zip(&listed) {
                let delete = raw.get("type").and_then(Value::as_str) == Some("DELETE");
                assert_eq!(matches!(event, WatchEvent::Delete { .. }), delete, "{raw}");
            }
        }
    }
});
