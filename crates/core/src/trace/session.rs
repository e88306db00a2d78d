//! Sessions of a trace: which rows wait for which, and for how long.
//!
//! Two forms, Dynamo's, so a user's trace reads unchanged:
//!
//! - **Session form**: rows sharing a `session_id` are a session's turns, in file order.
//!   The first is sent at its `timestamp`; each later one `delay` milliseconds (plus
//!   `tool_wait_ms`) after the previous turn completes. A later turn without `delay` waits
//!   as long as its `timestamp` is past the session's previous one, or not at all without a
//!   `timestamp`.
//! - **Agentic form** (any row of the file has a `wait_for`): a row with `wait_for` is sent
//!   `delay + tool_wait_ms` after the last of the requests it names completes (by their
//!   `request_id`, in any session, earlier or later in the file); a row without one is sent
//!   at its `timestamp`. Siblings of a fan-out wait for the same parent; a join waits for
//!   several. `session_id` then only groups rows for reports.
//!
//! A row without a `session_id` is a session of its own: flat traces stay valid. Completion
//! is the last token, or the refusal or failure that ended the request: a turn is sent
//! either way, as an agent carries on after an error.

use std::collections::HashMap;
use std::ops::Add;
use std::time::Duration;

use serde::{Deserialize, Deserializer};

use super::MooncakeRecord;

/// When one row of a trace is sent, and where it sits in its session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Turn {
    /// Its session, numbered by first appearance in the file.
    pub session: u32,
    /// Its place among its session's rows, in file order (0 for the first).
    pub turn: u32,
    /// What releases it; none: its `timestamp`.
    pub after: Option<After>,
}

/// A row released by other rows' completions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct After {
    /// The rows (by index) that must complete first; the last to complete starts the clock.
    pub parents: Vec<u32>,
    /// The client's own wait after that (`delay`).
    pub delay: Duration,
    /// The tool's run after that (`tool_wait_ms`).
    pub tool_wait: Duration,
}

impl After {
    /// The whole wait from the last parent's completion to this row's sending.
    pub fn wait(&self) -> Duration {
        self.delay + self.tool_wait
    }
}

/// The release rule of a closed-loop replay: a row is sent its wait after the last of the
/// rows it waits for ends. Shared by the simulator (virtual time) and the benchmark client
/// (the wall clock), so both release alike.
#[derive(Debug, Clone)]
pub struct Releases<T> {
    /// The rows each row releases (taken when it ends: only its first end counts).
    children: Vec<Vec<u32>>,
    /// Per row, the rows it still waits for.
    waiting: Vec<u32>,
    /// Per row, the latest end of those it waited for so far.
    latest: Vec<Option<T>>,
    /// Per row, its wait after that end.
    waits: Vec<Duration>,
    unreleased: usize,
    min_wait: Duration,
}

impl<T: Copy + Ord + Add<Duration, Output = T>> Releases<T> {
    /// `afters[i]` releases row `i` (none: it is sent at its own time), its waits divided
    /// by `speedup`. A row waiting only for rows outside the slice (cut off) waits for
    /// nothing: it is returned, with its time from `start`.
    pub fn new<'a>(
        afters: impl ExactSizeIterator<Item = Option<&'a After>>,
        speedup: f64,
        start: T,
    ) -> (Self, Vec<(T, u32)>) {
        let n = afters.len();
        let mut releases = Releases {
            children: vec![Vec::new(); n],
            waiting: vec![0; n],
            latest: vec![None; n],
            waits: vec![Duration::ZERO; n],
            unreleased: 0,
            min_wait: Duration::MAX,
        };
        let afters: Vec<_> = afters.collect();
        let mut orphans = Vec::new();
        for (index, after) in afters.iter().enumerate() {
            let Some(after) = after else { continue };
            let wait = after.wait().div_f64(speedup);
            releases.waits[index] = wait;
            releases.min_wait = releases.min_wait.min(wait);
            for &parent in &after.parents {
                if let Some(siblings) = releases.children.get_mut(parent as usize) {
                    siblings.push(index as u32);
                    releases.waiting[index] += 1;
                }
            }
            if releases.waiting[index] == 0 {
                orphans.push((start + wait, index as u32));
            } else {
                releases.unreleased += 1;
            }
        }
        (releases, orphans)
    }

    /// Row `row` ended at `at`: each row that waited only for it and rows already ended is
    /// released, with when it is to be sent.
    pub fn ended(&mut self, row: u32, at: T, mut release: impl FnMut(T, u32)) {
        let Some(children) = self.children.get_mut(row as usize) else {
            return;
        };
        for child in std::mem::take(children) {
            let c = child as usize;
            let latest = self.latest[c].map_or(at, |t| t.max(at));
            self.latest[c] = Some(latest);
            self.waiting[c] -= 1;
            if self.waiting[c] == 0 {
                self.unreleased -= 1;
                release(latest + self.waits[c], child);
            }
        }
    }

    /// Rows not yet released.
    pub fn unreleased(&self) -> usize {
        self.unreleased
    }

    /// The shortest wait of any released row: none can be sent sooner after an end.
    pub fn min_wait(&self) -> Duration {
        self.min_wait
    }
}

/// Why a trace's sessions do not hold together; `record` is the row's 0-based index.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("record {} of the trace: {problem}", .record + 1)]
pub struct SessionError {
    pub record: usize,
    pub problem: SessionProblem,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SessionProblem {
    #[error("{field} is {value} ms; it must be a finite number of milliseconds, 0 or more")]
    InvalidWait { field: &'static str, value: f64 },
    #[error(
        "the first turn of session {session:?} sets a delay or tool_wait_ms (it is sent at its \
         timestamp)"
    )]
    DelayOnFirstTurn { session: String },
    #[error(
        "timestamp {timestamp} is before {previous}, the previous timestamp of session \
         {session:?}, and no delay is given"
    )]
    TimestampBackwards {
        session: String,
        timestamp: u64,
        previous: u64,
    },
    #[error("a delay or tool_wait_ms is set without wait_for (the row is sent at its timestamp)")]
    WaitWithoutParents,
    #[error("request_id {0:?} is used by an earlier row too")]
    DuplicateRequestId(String),
    #[error("wait_for names {0:?}, which no row has as its request_id")]
    UnknownParent(String),
    #[error("wait_for names the row itself ({0:?})")]
    WaitsForItself(String),
    #[error("the rows waiting for each other form a cycle through {0:?}")]
    Cycle(String),
}

/// Whether any row carries a session: the trace is then replayed closed loop.
pub fn has_sessions(records: &[MooncakeRecord]) -> bool {
    records
        .iter()
        .any(|r| r.session_id.is_some() || !r.wait_for.is_empty())
}

/// Resolves every row's session, turn and release.
pub fn resolve(records: &[MooncakeRecord]) -> Result<Vec<Turn>, SessionError> {
    let agentic = records.iter().any(|r| !r.wait_for.is_empty());
    let mut sessions: HashMap<&str, (u32, u32)> = HashMap::new();
    let mut next_session = 0u32;
    let mut turns = Vec::with_capacity(records.len());
    // Session form: each session's last row and last timestamp seen.
    let mut last: HashMap<&str, (u32, u64)> = HashMap::new();
    let mut ids: HashMap<&str, u32> = HashMap::new();
    for (index, record) in records.iter().enumerate() {
        let fail = |problem| SessionError {
            record: index,
            problem,
        };
        let delay = wait(record.delay, "delay").map_err(fail)?;
        let tool_wait = wait(record.tool_wait_ms, "tool_wait_ms").map_err(fail)?;
        if let Some(id) = &record.request_id
            && ids.insert(id, index as u32).is_some()
        {
            return Err(fail(SessionProblem::DuplicateRequestId(id.clone())));
        }
        let (session, turn) = match &record.session_id {
            Some(name) => {
                let entry = sessions.entry(name).or_insert_with(|| {
                    next_session += 1;
                    (next_session - 1, 0)
                });
                entry.1 += 1;
                (entry.0, entry.1 - 1)
            }
            None => {
                next_session += 1;
                (next_session - 1, 0)
            }
        };
        let mut after = None;
        if !agentic && let Some(name) = &record.session_id {
            match last.get(name.as_str()).copied() {
                None if !(delay + tool_wait).is_zero() => {
                    return Err(fail(SessionProblem::DelayOnFirstTurn {
                        session: name.clone(),
                    }));
                }
                None => {}
                Some((previous, previous_ts)) => {
                    let delay = match record.delay {
                        Some(_) => delay,
                        None if record.timestamp == 0 => Duration::ZERO,
                        None => {
                            let Some(gap) = record.timestamp.checked_sub(previous_ts) else {
                                return Err(fail(SessionProblem::TimestampBackwards {
                                    session: name.clone(),
                                    timestamp: record.timestamp,
                                    previous: previous_ts,
                                }));
                            };
                            Duration::from_millis(gap)
                        }
                    };
                    after = Some(After {
                        parents: vec![previous],
                        delay,
                        tool_wait,
                    });
                }
            }
            let ts = match last.get(name.as_str()) {
                Some(&(_, previous_ts)) if record.timestamp == 0 => previous_ts,
                _ => record.timestamp,
            };
            last.insert(name, (index as u32, ts));
        }
        if agentic && record.wait_for.is_empty() && !(delay + tool_wait).is_zero() {
            return Err(fail(SessionProblem::WaitWithoutParents));
        }
        if agentic && !record.wait_for.is_empty() {
            // Parents are resolved once every request_id is known (they may come later).
            after = Some(After {
                parents: Vec::new(),
                delay,
                tool_wait,
            });
        }
        turns.push(Turn {
            session,
            turn,
            after,
        });
    }
    if agentic {
        for (index, (record, turn)) in records.iter().zip(&mut turns).enumerate() {
            let Some(after) = &mut turn.after else {
                continue;
            };
            for name in &record.wait_for {
                let fail = |problem| SessionError {
                    record: index,
                    problem,
                };
                let &parent = ids
                    .get(name.as_str())
                    .ok_or_else(|| fail(SessionProblem::UnknownParent(name.clone())))?;
                if parent as usize == index {
                    return Err(fail(SessionProblem::WaitsForItself(name.clone())));
                }
                if !after.parents.contains(&parent) {
                    after.parents.push(parent);
                }
            }
        }
        check_acyclic(records, &turns)?;
    }
    Ok(turns)
}

/// Kahn's algorithm: every row must be reachable from the rows sent at their timestamp.
fn check_acyclic(records: &[MooncakeRecord], turns: &[Turn]) -> Result<(), SessionError> {
    let mut waiting: Vec<usize> = turns
        .iter()
        .map(|t| t.after.as_ref().map_or(0, |a| a.parents.len()))
        .collect();
    let mut children: Vec<Vec<u32>> = vec![Vec::new(); turns.len()];
    for (index, turn) in turns.iter().enumerate() {
        for &parent in turn.after.iter().flat_map(|a| &a.parents) {
            children[parent as usize].push(index as u32);
        }
    }
    let mut ready: Vec<usize> = (0..turns.len()).filter(|&i| waiting[i] == 0).collect();
    let mut seen = 0;
    while let Some(index) = ready.pop() {
        seen += 1;
        for &child in &children[index] {
            waiting[child as usize] -= 1;
            if waiting[child as usize] == 0 {
                ready.push(child as usize);
            }
        }
    }
    if seen == turns.len() {
        return Ok(());
    }
    let record = (0..turns.len())
        .find(|&i| waiting[i] > 0)
        .unwrap_or_default();
    Err(SessionError {
        record,
        problem: SessionProblem::Cycle(
            records[record]
                .request_id
                .clone()
                .unwrap_or_else(|| format!("row {}", record + 1)),
        ),
    })
}

fn wait(ms: Option<f64>, field: &'static str) -> Result<Duration, SessionProblem> {
    match ms {
        None => Ok(Duration::ZERO),
        Some(value) if value.is_finite() && value >= 0.0 => {
            Ok(Duration::from_secs_f64(value / 1000.0))
        }
        Some(value) => Err(SessionProblem::InvalidWait { field, value }),
    }
}

/// A JSON number or string, as a name (traces write session and request ids both ways).
#[derive(Deserialize)]
#[serde(untagged)]
enum Name {
    Text(String),
    Int(u64),
    Signed(i64),
}

impl From<Name> for String {
    fn from(name: Name) -> Self {
        match name {
            Name::Text(s) => s,
            Name::Int(n) => n.to_string(),
            Name::Signed(n) => n.to_string(),
        }
    }
}

pub(super) fn opt_name<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Ok(Option::<Name>::deserialize(d)?.map(String::from))
}

pub(super) fn names<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    Ok(Option::<Vec<Name>>::deserialize(d)?
        .unwrap_or_default()
        .into_iter()
        .map(String::from)
        .collect())
}

/// Milliseconds as a whole number: an integer, or a number with a fraction (rounded).
pub(super) fn whole_ms<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Ms {
        Int(u64),
        Float(f64),
    }
    match Ms::deserialize(d)? {
        Ms::Int(n) => Ok(n),
        Ms::Float(f) if f.is_finite() && f >= 0.0 && f < u64::MAX as f64 => Ok(f.round() as u64),
        Ms::Float(f) => Err(serde::de::Error::custom(format!(
            "timestamp {f} is not a number of milliseconds, 0 or more"
        ))),
    }
}

#[cfg(test)]
mod tests;
