//! A run's throughput over time, in fixed buckets, for the plots.

use std::time::Duration;

use super::record::RequestRecord;

/// Bucket widths that read well on an axis; the smallest giving at most `MAX_BUCKETS`.
const WIDTHS_MS: [u64; 14] = [
    100, 200, 500, 1_000, 2_000, 5_000, 10_000, 30_000, 60_000, 120_000, 300_000, 600_000,
    1_800_000, 3_600_000,
];
const MAX_BUCKETS: u64 = 60;

/// Output tokens and completed requests per second, bucket by bucket from the run's start.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Timeline {
    pub bucket: Duration,
    pub output_tokens_per_s: Vec<f64>,
    pub completions_per_s: Vec<f64>,
}

impl Timeline {
    /// Counts tokens when they arrived (streamed chunks carry an equal share of the
    /// request's output tokens; a whole response counts at its end) and requests when they
    /// ended. Failed requests count in neither.
    pub fn of(records: &[RequestRecord]) -> Self {
        let end = records
            .iter()
            .map(|r| r.start + r.latency)
            .max()
            .unwrap_or_default();
        let end_ms = end.as_millis() as u64;
        let width_ms = WIDTHS_MS
            .into_iter()
            .find(|w| end_ms / w < MAX_BUCKETS)
            .unwrap_or(WIDTHS_MS[WIDTHS_MS.len() - 1]);
        let buckets = (end_ms / width_ms + 1) as usize;
        let mut tokens = vec![0.0; buckets];
        let mut completions = vec![0.0; buckets];
        let slot = |at: Duration| ((at.as_millis() as u64 / width_ms) as usize).min(buckets - 1);
        for record in records.iter().filter(|r| r.succeeded()) {
            completions[slot(record.start + record.latency)] += 1.0;
            match record.ttft {
                Some(ttft) => {
                    let chunks = record.itl.len() + 1;
                    let share = record.output_tokens as f64 / chunks as f64;
                    let mut at = record.start + ttft;
                    tokens[slot(at)] += share;
                    for gap in &record.itl {
                        at += *gap;
                        tokens[slot(at)] += share;
                    }
                }
                None => tokens[slot(record.start + record.latency)] += record.output_tokens as f64,
            }
        }
        let per_second = 1e3 / width_ms as f64;
        Self {
            bucket: Duration::from_millis(width_ms),
            output_tokens_per_s: tokens.into_iter().map(|t| t * per_second).collect(),
            completions_per_s: completions.into_iter().map(|c| c * per_second).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_land_in_the_bucket_they_arrived_in() {
        let streamed = RequestRecord {
            index: 0,
            scheduled: None,
            start: Duration::from_millis(50),
            ttft: Some(Duration::from_millis(100)),
            itl: vec![Duration::from_millis(100); 3],
            latency: Duration::from_millis(400),
            input_tokens: 1,
            output_tokens: 8,
            usage_reported: true,
            cached_tokens: None,
            error: None,
        };
        let timeline = Timeline::of(&[streamed]);
        assert_eq!(timeline.bucket, Duration::from_millis(100));
        // Chunks at 150, 250, 350 and 450 ms, two tokens each; 20 tokens/s per 100 ms bucket.
        assert_eq!(
            timeline.output_tokens_per_s,
            vec![0.0, 20.0, 20.0, 20.0, 20.0]
        );
        assert_eq!(timeline.completions_per_s, vec![0.0, 0.0, 0.0, 0.0, 10.0]);
    }
}
