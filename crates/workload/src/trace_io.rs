//! Reading and writing Mooncake JSONL trace files.
//!
//! Parsing a row is `switchyard_core::trace::MooncakeRecord`'s business; this module adds
//! files, line numbers in errors, and blank-line tolerance (trailing newlines are common).

use std::fs::File;
use std::io::{self, BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};

use switchyard_core::trace::MooncakeRecord;
use switchyard_core::trace::session::{SessionError, SessionProblem};

/// Why a trace could not be read or written. The underlying cause is the error's `source()`
/// (print the chain, e.g. anyhow's `{:#}`, to see it).
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("cannot open trace {path}")]
    Open { path: PathBuf, source: io::Error },
    #[error("cannot read trace {path} at line {line}")]
    Read {
        path: PathBuf,
        line: usize,
        source: io::Error,
    },
    #[error("{path}:{line}: not a Mooncake record")]
    Parse {
        path: PathBuf,
        line: usize,
        source: serde_json::Error,
    },
    #[error("{path}:{line}: {problem}")]
    Record {
        path: PathBuf,
        line: usize,
        problem: RecordProblem,
    },
    #[error("trace {path} holds no requests")]
    Empty { path: PathBuf },
    #[error("cannot write trace {path}")]
    Write { path: PathBuf, source: io::Error },
}

/// A problem with one record of an in-memory trace; `record` is its 0-based index.
/// [`Trace::locate`] turns it into a file line.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("record {} of the trace: {problem}", .record + 1)]
pub struct RecordError {
    pub record: usize,
    pub problem: RecordProblem,
}

impl From<SessionError> for RecordError {
    fn from(e: SessionError) -> Self {
        RecordError {
            record: e.record,
            problem: RecordProblem::Session(e.problem),
        }
    }
}

/// What is wrong with a record.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RecordProblem {
    #[error(transparent)]
    Session(SessionProblem),
    #[error(
        "hash id {id} follows {found} here but followed {expected} in an earlier request, \
         so the hash ids do not form a prefix tree"
    )]
    NotATree {
        id: u64,
        expected: Parent,
        found: Parent,
    },
    #[error(
        "input_length {input_length} does not fit {blocks} hash ids of {block_size} tokens \
         (expected {min}..={max}); is the block size right?"
    )]
    LengthMismatch {
        input_length: u64,
        blocks: u64,
        block_size: u32,
        min: u64,
        max: u64,
    },
}

/// What precedes a hash id in a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parent {
    Start,
    Id(u64),
}

impl std::fmt::Display for Parent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Start => f.write_str("the start of the prompt"),
            Self::Id(id) => write!(f, "hash id {id}"),
        }
    }
}

/// A parsed trace, remembering where each record came from so later checks can name the line.
#[derive(Debug, Clone)]
pub struct Trace {
    pub path: PathBuf,
    pub records: Vec<MooncakeRecord>,
    lines: Vec<usize>,
}

impl Trace {
    /// Reads a Mooncake JSONL file. Blank lines are skipped; an empty trace is an error.
    pub fn read(path: &Path) -> Result<Self, TraceError> {
        let file = File::open(path).map_err(|source| TraceError::Open {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(path, BufReader::new(file))
    }

    /// Parses JSONL from any reader; `path` only names the source in errors.
    pub fn parse(path: &Path, reader: impl BufRead) -> Result<Self, TraceError> {
        let mut records = Vec::new();
        let mut lines = Vec::new();
        for (index, line) in reader.lines().enumerate() {
            let number = index + 1;
            let line = line.map_err(|source| TraceError::Read {
                path: path.to_path_buf(),
                line: number,
                source,
            })?;
            if line.trim().is_empty() {
                continue;
            }
            let record = MooncakeRecord::parse(&line).map_err(|source| TraceError::Parse {
                path: path.to_path_buf(),
                line: number,
                source,
            })?;
            records.push(record);
            lines.push(number);
        }
        if records.is_empty() {
            return Err(TraceError::Empty {
                path: path.to_path_buf(),
            });
        }
        Ok(Self {
            path: path.to_path_buf(),
            records,
            lines,
        })
    }

    /// The file line that record `index` was read from.
    pub fn line_of(&self, index: usize) -> usize {
        self.lines.get(index).copied().unwrap_or(index + 1)
    }

    /// Names the file line of a record problem.
    pub fn locate(&self, error: RecordError) -> TraceError {
        TraceError::Record {
            path: self.path.clone(),
            line: self.line_of(error.record),
            problem: error.problem,
        }
    }
}

/// Writes records as Mooncake JSONL, one per line.
pub fn write_mooncake(path: &Path, records: &[MooncakeRecord]) -> Result<(), TraceError> {
    let write_err = |source| TraceError::Write {
        path: path.to_path_buf(),
        source,
    };
    let file = File::create(path).map_err(write_err)?;
    let mut out = BufWriter::new(file);
    for record in records {
        serde_json::to_writer(&mut out, record).map_err(|e| write_err(io::Error::other(e)))?;
        out.write_all(b"\n").map_err(write_err)?;
    }
    out.flush().map_err(write_err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_line_is_reported_with_its_number() {
        let text = "{\"timestamp\":0,\"input_length\":10,\"output_length\":1,\"hash_ids\":[1]}\n\n\
                    {\"timestamp\":\"soon\"}\n";
        let err = Trace::parse(Path::new("t.jsonl"), text.as_bytes()).unwrap_err();
        let message = err.to_string();
        assert!(
            message.starts_with("t.jsonl:3: not a Mooncake record"),
            "{message}"
        );
    }

    #[test]
    fn blank_lines_are_skipped_and_lines_remembered() {
        let row = "{\"timestamp\":0,\"input_length\":10,\"output_length\":1,\"hash_ids\":[1]}";
        let text = format!("{row}\n\n{row}\n\n");
        let trace = Trace::parse(Path::new("t"), text.as_bytes()).unwrap();
        assert_eq!(trace.records.len(), 2);
        assert_eq!(trace.line_of(1), 3);
    }

    #[test]
    fn a_broken_session_names_its_line() {
        let text = "{\"session_id\":\"s\",\"timestamp\":9,\"input_length\":1,\"output_length\":1}\n\n\
                    {\"session_id\":\"s\",\"delay\":-4,\"input_length\":1,\"output_length\":1}\n";
        let trace = Trace::parse(Path::new("s.jsonl"), text.as_bytes()).unwrap();
        let error = switchyard_core::trace::session::resolve(&trace.records).unwrap_err();
        let message = trace.locate(error.into()).to_string();
        assert_eq!(
            message,
            "s.jsonl:3: delay is -4 ms; it must be a finite number of milliseconds, 0 or more"
        );
    }

    #[test]
    fn empty_trace_is_an_error() {
        let err = Trace::parse(Path::new("e"), "\n \n".as_bytes()).unwrap_err();
        assert!(matches!(err, TraceError::Empty { .. }));
    }

    #[test]
    fn missing_file_names_the_path() {
        let err = Trace::read(Path::new("/nonexistent/trace.jsonl")).unwrap_err();
        assert!(
            err.to_string().contains("/nonexistent/trace.jsonl"),
            "{err}"
        );
    }

    #[test]
    fn written_records_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.jsonl");
        let records = vec![MooncakeRecord {
            media: Vec::new(),
            timestamp: 5,
            input_length: 600,
            output_length: 7,
            hash_ids: vec![3, 4],
            ..MooncakeRecord::default()
        }];
        write_mooncake(&path, &records).unwrap();
        assert_eq!(Trace::read(&path).unwrap().records, records);
    }
}
