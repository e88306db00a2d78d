//! The Azure LLM inference traces (CSV: `TIMESTAMP,ContextTokens,GeneratedTokens`).
//!
//! Timestamps are absolute (`2023-11-16 18:17:03.9799600`); arrivals are taken relative to
//! the first row. The traces carry no prefix information.

use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono::NaiveDateTime;

/// One request of an Azure trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AzureRecord {
    /// Arrival after the trace's first request.
    pub arrival: Duration,
    pub context_tokens: u32,
    pub generated_tokens: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum AzureError {
    #[error("cannot read trace {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{path}: the header must name TIMESTAMP, ContextTokens and GeneratedTokens, found {found:?}"
    )]
    Header { path: PathBuf, found: String },
    #[error("{path}:{line}: {problem}")]
    Row {
        path: PathBuf,
        line: usize,
        problem: String,
    },
    #[error("trace {path} holds no requests")]
    Empty { path: PathBuf },
}

/// Reads an Azure trace file.
pub fn read(path: &Path) -> Result<Vec<AzureRecord>, AzureError> {
    let text = std::fs::read_to_string(path).map_err(|source| AzureError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    parse(path, &text)
}

/// Parses an Azure trace; `path` only names the source in errors.
pub fn parse(path: &Path, text: &str) -> Result<Vec<AzureRecord>, AzureError> {
    let mut lines = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty());
    let header = lines.next().map(|(_, l)| l.trim()).unwrap_or_default();
    let columns: Vec<&str> = header.split(',').map(str::trim).collect();
    let position = |name: &str| columns.iter().position(|c| c.eq_ignore_ascii_case(name));
    let (Some(ts), Some(ctx), Some(gen_col)) = (
        position("TIMESTAMP"),
        position("ContextTokens"),
        position("GeneratedTokens"),
    ) else {
        return Err(AzureError::Header {
            path: path.to_path_buf(),
            found: header.to_string(),
        });
    };
    let mut first: Option<NaiveDateTime> = None;
    let mut records = Vec::new();
    for (index, line) in lines {
        let row = |problem: String| AzureError::Row {
            path: path.to_path_buf(),
            line: index + 1,
            problem,
        };
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        let field = |i: usize, name: &str| {
            fields
                .get(i)
                .copied()
                .ok_or_else(|| row(format!("missing {name}")))
        };
        let when = NaiveDateTime::parse_from_str(field(ts, "TIMESTAMP")?, "%Y-%m-%d %H:%M:%S%.f")
            .map_err(|e| row(format!("invalid TIMESTAMP: {e}")))?;
        let tokens = |i: usize, name: &str| -> Result<u32, AzureError> {
            field(i, name)?
                .parse::<u32>()
                .map_err(|e| row(format!("invalid {name}: {e}")))
        };
        let start = *first.get_or_insert(when);
        let offset = (when - start)
            .to_std()
            .map_err(|_| row("timestamps go back before the first row".to_string()))?;
        records.push(AzureRecord {
            arrival: offset,
            context_tokens: tokens(ctx, "ContextTokens")?,
            generated_tokens: tokens(gen_col, "GeneratedTokens")?,
        });
    }
    if records.is_empty() {
        return Err(AzureError::Empty {
            path: path.to_path_buf(),
        });
    }
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_relative_arrivals() {
        let text = "TIMESTAMP,ContextTokens,GeneratedTokens\n\
                    2023-11-16 18:17:03.9799600,4808,10\n\
                    2023-11-16 18:17:04.0319600,3180,8\n";
        let records = parse(Path::new("t.csv"), text).unwrap();
        assert_eq!(records.len(), 2);
        assert_eq!(
            records[0],
            AzureRecord {
                arrival: Duration::ZERO,
                context_tokens: 4808,
                generated_tokens: 10
            }
        );
        assert_eq!(records[1].arrival, Duration::from_millis(52));
    }

    #[test]
    fn errors_name_the_line() {
        let bad = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9,12,x\n";
        assert_eq!(
            parse(Path::new("t.csv"), bad).unwrap_err().to_string(),
            "t.csv:2: invalid GeneratedTokens: invalid digit found in string"
        );
        assert!(
            parse(Path::new("t.csv"), "a,b\n1,2\n")
                .unwrap_err()
                .to_string()
                .contains("header must name")
        );
        let back = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03,1,1\n2023-11-16 18:17:02,1,1\n";
        assert!(
            parse(Path::new("t.csv"), back)
                .unwrap_err()
                .to_string()
                .contains("t.csv:3")
        );
    }

    #[test]
    fn reads_the_shipped_slice() {
        let path = Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../testdata/azure_code_head1000.csv"
        ));
        let records = read(path).unwrap();
        assert_eq!(records.len(), 1000);
        assert!(records.windows(2).all(|w| w[0].arrival <= w[1].arrival));
    }
}
