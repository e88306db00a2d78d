//! Shared by the benchmark tests; each test binary uses a different part.
#![allow(dead_code)]

pub mod mock_server;

use std::time::Duration;

use switchyard_workload::bench::{BenchConfig, LoadShape, RequestSource};

/// A streaming chat run of synthetic prompts against `url`, `clients` at a time.
pub fn config(url: String, clients: usize, requests: usize, output_tokens: u64) -> BenchConfig {
    let mut config = BenchConfig::new(url, "mock-model");
    config.shape = LoadShape::Concurrency { clients };
    config.max_requests = Some(requests);
    config.source = RequestSource::Synthetic {
        input_tokens: 64,
        output_tokens,
    };
    config.request_timeout = Duration::from_secs(30);
    config
}

/// Asserts `value` is within `tolerance` (relative) of `target`.
pub fn assert_within(what: &str, value: f64, target: f64, tolerance: f64) {
    let off = (value - target).abs() / target;
    assert!(
        off <= tolerance,
        "{what}: measured {value:.2}, profile {target:.2} ({:.1}% off, tolerance {:.0}%)",
        off * 100.0,
        tolerance * 100.0
    );
}
