//! Durations in reports: milliseconds in JSON, human-readable text in terminal reports.

use std::time::Duration;

use serde::Serializer;

/// Milliseconds as a float, the unit of every latency in reports.
pub fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}

/// Milliseconds rounded to the microsecond: finer digits are timer noise, and they would
/// double the size of a JSON report.
fn ms_for_json(duration: Duration) -> f64 {
    (ms(duration) * 1e3).round() / 1e3
}

/// Serialises a `Duration` as float milliseconds (field names carry the `_ms` suffix).
pub fn serialize_ms<S: Serializer>(duration: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_f64(ms_for_json(*duration))
}

/// Serialises an optional `Duration` as float milliseconds or null.
pub fn serialize_opt_ms<S: Serializer>(
    duration: &Option<Duration>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    match duration {
        Some(d) => serializer.serialize_some(&ms_for_json(*d)),
        None => serializer.serialize_none(),
    }
}

/// Serialises a list of `Duration`s as float milliseconds.
pub fn serialize_ms_list<S: Serializer>(
    durations: &[Duration],
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.collect_seq(durations.iter().map(|d| ms_for_json(*d)))
}

/// Parses a human duration such as `90s`, `5m`, `1h 30m` or `250ms`.
pub fn parse_duration(text: &str) -> Result<Duration, humantime::DurationError> {
    humantime::parse_duration(text)
}

/// Why a text is not a positive number of milliseconds ([`parse_millis`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MillisError {
    #[error("{text:?} is not a number of milliseconds")]
    NotANumber {
        text: String,
        #[source]
        source: std::num::ParseFloatError,
    },
    #[error("{text} ms must be a finite number above 0")]
    NotPositive { text: String },
}

/// Parses a positive number of milliseconds (fractions allowed), e.g. `200` or `12.5`.
pub fn parse_millis(text: &str) -> Result<Duration, MillisError> {
    let value: f64 = text
        .trim()
        .parse()
        .map_err(|source| MillisError::NotANumber {
            text: text.to_owned(),
            source,
        })?;
    if !(value.is_finite() && value > 0.0) {
        return Err(MillisError::NotPositive {
            text: text.to_owned(),
        });
    }
    Ok(Duration::from_secs_f64(value / 1e3))
}

/// Formats a duration to the precision a report needs: `850 ms`, `12.3 s`, `16m 27s`.
pub fn format_duration(duration: Duration) -> String {
    let secs = duration.as_secs_f64();
    if secs < 1.0 {
        format!("{:.0} ms", secs * 1e3)
    } else if secs < 60.0 {
        format!("{secs:.1} s")
    } else if secs < 3600.0 {
        format!(
            "{}m {:02}s",
            duration.as_secs() / 60,
            duration.as_secs() % 60
        )
    } else {
        let whole = duration.as_secs();
        format!(
            "{}h {:02}m {:02}s",
            whole / 3600,
            whole / 60 % 60,
            whole % 60
        )
    }
}

/// Formats an integer with thousands separators.
pub fn thousands(value: u64) -> String {
    let digits = value.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_durations_at_report_precision() {
        assert_eq!(format_duration(Duration::from_millis(850)), "850 ms");
        assert_eq!(format_duration(Duration::from_millis(12_340)), "12.3 s");
        assert_eq!(format_duration(Duration::from_secs(987)), "16m 27s");
        assert_eq!(format_duration(Duration::from_secs(3_537)), "58m 57s");
        assert_eq!(format_duration(Duration::from_secs(7_384)), "2h 03m 04s");
    }

    #[test]
    fn groups_thousands() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(12_031), "12,031");
        assert_eq!(thousands(1_000_168), "1,000,168");
    }

    #[test]
    fn parses_human_durations() {
        assert_eq!(parse_duration("90s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert!(parse_duration("soon").is_err());
    }

    #[test]
    fn parses_positive_millis() {
        assert_eq!(parse_millis("12.5").unwrap(), Duration::from_micros(12_500));
        assert!(parse_millis("0").is_err());
        assert!(parse_millis("-3").is_err());
        assert!(
            parse_millis("fast")
                .unwrap_err()
                .to_string()
                .contains("not a number")
        );
    }
}
