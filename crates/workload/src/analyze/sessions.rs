//! Sessions recovered from a flat trace through its prefix chains.
//!
//! A conversation's next turn sends the previous prompt, the previous answer and something
//! new: its hash ids start with every hash id the previous prompt filled whole (the block
//! the previous prompt ended in changes, as the answer fills it). So a row continues the
//! latest earlier row whose whole blocks are exactly its own first blocks, the longest such
//! prefix winning. Blocks nearly every row starts with (a shared system prompt) prove
//! nothing: a match must include a block that fewer rows carry.
//!
//! How sure it is: a row whose prefix matches several earlier rows (a retried or branched
//! turn) takes the latest, and is counted as ambiguous; and a true continuation carries the
//! previous answer, so its prompt grows by at least the parent's output length (counted).

use std::collections::HashMap;
use std::fmt;

use serde::Serialize;
use switchyard_core::trace::MooncakeRecord;

use crate::stats::Summary;

/// A block carried by at least this share of rows (and [`COMMON_MIN_ROWS`]) is common.
const COMMON_SHARE: f64 = 0.05;
const COMMON_MIN_ROWS: usize = 50;

/// Each row's recovered parent (the turn it continues), by index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recovered {
    pub parent: Vec<Option<usize>>,
    /// Rows whose prefix matched more than one earlier row.
    pub ambiguous: usize,
}

impl Recovered {
    /// The first turn of row `i`'s session.
    pub fn root(&self, mut i: usize) -> usize {
        while let Some(p) = self.parent[i] {
            i = p;
        }
        i
    }
}

/// Finds each row's parent (rows in any order; earlier means an earlier timestamp, then
/// an earlier row).
pub fn recover(records: &[MooncakeRecord], block_size: u32) -> Recovered {
    let block = u64::from(block_size.max(1));
    let mut carriers: HashMap<u64, usize> = HashMap::new();
    for r in records {
        let mut ids = r.hash_ids.clone();
        ids.sort_unstable();
        ids.dedup();
        for id in ids {
            *carriers.entry(id).or_default() += 1;
        }
    }
    let threshold = COMMON_MIN_ROWS.max((records.len() as f64 * COMMON_SHARE).ceil() as usize);
    let common = |id: &u64| carriers.get(id).copied().unwrap_or(0) >= threshold;
    let mut order: Vec<usize> = (0..records.len()).collect();
    order.sort_by_key(|&i| records[i].timestamp);
    // Rows by the blocks they filled whole: the prefix a continuation starts with.
    let mut by_prefix: HashMap<&[u64], (usize, usize)> = HashMap::new();
    let mut recovered = Recovered {
        parent: vec![None; records.len()],
        ambiguous: 0,
    };
    for i in order {
        let ids = &records[i].hash_ids;
        let whole = ((records[i].input_length / block) as usize).min(ids.len());
        for k in (1..=ids.len()).rev() {
            let prefix = &ids[..k];
            if let Some(&(parent, count)) = by_prefix.get(prefix)
                && !prefix.iter().all(common)
            {
                recovered.parent[i] = Some(parent);
                recovered.ambiguous += usize::from(count > 1);
                break;
            }
        }
        let entry = by_prefix.entry(&ids[..whole]).or_insert((i, 0));
        *entry = (i, entry.1 + 1);
    }
    recovered
}

/// What `synth analyze` reports of the sessions it recovered.
#[derive(Debug, Clone, Serialize)]
pub struct SessionShape {
    pub sessions: usize,
    /// Rows that continue an earlier one.
    pub continuing: usize,
    /// Of those, rows whose prefix matched several earlier rows (the latest was taken).
    pub ambiguous: usize,
    /// Of those, rows whose prompt grew by at least the parent's output (as a continuation
    /// that carries the answer does).
    pub carrying_the_answer: usize,
    pub turns_per_session: Summary,
    /// Sessions by their number of turns (index 0: one turn); the last counts that many
    /// turns or more.
    pub sessions_by_turns: Vec<usize>,
    /// Prompt tokens added from one turn to the next.
    pub growth_tokens: Summary,
    /// Of those, the tokens beyond the parent's answer (the user's or the tool's part).
    pub new_tokens: Summary,
    /// From one turn's arrival to the next one's, in milliseconds.
    pub gap_ms: Summary,
}

const TURN_BUCKETS: usize = 10;

impl SessionShape {
    pub fn of(records: &[MooncakeRecord], recovered: &Recovered) -> Self {
        let mut turns: HashMap<usize, usize> = HashMap::new();
        for i in 0..records.len() {
            *turns.entry(recovered.root(i)).or_default() += 1;
        }
        let mut sessions_by_turns = vec![0; TURN_BUCKETS];
        for &n in turns.values() {
            sessions_by_turns[n.clamp(1, TURN_BUCKETS) - 1] += 1;
        }
        let pairs: Vec<(&MooncakeRecord, &MooncakeRecord)> = (0..records.len())
            .filter_map(|i| Some((&records[recovered.parent[i]?], &records[i])))
            .collect();
        let growth = |(p, c): &(&MooncakeRecord, &MooncakeRecord)| {
            c.input_length as f64 - p.input_length as f64
        };
        SessionShape {
            sessions: turns.len(),
            continuing: pairs.len(),
            ambiguous: recovered.ambiguous,
            carrying_the_answer: pairs
                .iter()
                .filter(|(p, c)| c.input_length >= p.input_length + p.output_length)
                .count(),
            turns_per_session: Summary::of(turns.values().map(|&n| n as f64)).unwrap_or_default(),
            sessions_by_turns,
            growth_tokens: Summary::of(pairs.iter().map(growth)).unwrap_or_default(),
            new_tokens: Summary::of(
                pairs
                    .iter()
                    .map(|pair| growth(pair) - pair.0.output_length as f64),
            )
            .unwrap_or_default(),
            gap_ms: Summary::of(
                pairs
                    .iter()
                    .map(|(p, c)| c.timestamp as f64 - p.timestamp as f64),
            )
            .unwrap_or_default(),
        }
    }
}

impl fmt::Display for SessionShape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let share = |n: usize, of: usize| 100.0 * n as f64 / of.max(1) as f64;
        writeln!(
            f,
            "Sessions        {} recovered from prefix chains; {} rows continue an earlier one \
             ({:.1} % of those matched several earlier rows, the latest taken; {:.1} % grew by \
             at least the previous answer)",
            self.sessions,
            self.continuing,
            share(self.ambiguous, self.continuing),
            share(self.carrying_the_answer, self.continuing)
        )?;
        let t = &self.turns_per_session;
        let by_turns = self
            .sessions_by_turns
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let plus = if i + 1 == TURN_BUCKETS { "+" } else { "" };
                format!("{}{plus}: {n}", i + 1)
            })
            .collect::<Vec<_>>()
            .join(", ");
        writeln!(
            f,
            "  turns         mean {:.2}, p90 {:.0}, max {:.0}; sessions by turns {by_turns}",
            t.mean, t.p90, t.max
        )?;
        let (g, n, gap) = (&self.growth_tokens, &self.new_tokens, &self.gap_ms);
        writeln!(
            f,
            "  growth        p50 {:.0}, p90 {:.0} tokens per turn (beyond the previous answer: p50 {:.0}, p90 {:.0})",
            g.p50, g.p90, n.p50, n.p90
        )?;
        writeln!(
            f,
            "  gap           p50 {:.1} s, p90 {:.1} s from a turn's arrival to the next",
            gap.p50 / 1e3,
            gap.p90 / 1e3
        )
    }
}

/// The rows as a session trace, in arrival order, in the agentic form (exact when a turn
/// was branched): every row is named (`request_id` `r` and its row index) and each
/// recovered session's rows share a `session_id`; a continuing row waits for its parent
/// (`wait_for`) and is sent `delay` after it ends: the recorded gap less
/// `answer_ms_per_token` for each of the parent's output tokens (the time its answer took
/// in the recording, which the replay spends again), never below zero. Timestamps stay,
/// so the rows replay open loop as they were recorded too.
pub fn session_trace(
    records: &[MooncakeRecord],
    recovered: &Recovered,
    answer_ms_per_token: f64,
) -> Vec<MooncakeRecord> {
    let mut order: Vec<usize> = (0..records.len()).collect();
    order.sort_by_key(|&i| records[i].timestamp);
    order
        .into_iter()
        .map(|i| {
            let r = &records[i];
            let mut row = r.clone();
            row.session_id = Some(format!("s{}", recovered.root(i)));
            row.request_id = Some(format!("r{i}"));
            row.wait_for = recovered.parent[i]
                .map(|p| vec![format!("r{p}")])
                .unwrap_or_default();
            row.delay = recovered.parent[i].map(|p| {
                let parent = &records[p];
                let gap = r.timestamp.saturating_sub(parent.timestamp) as f64;
                (gap - parent.output_length as f64 * answer_ms_per_token).max(0.0)
            });
            row
        })
        .collect()
}

#[cfg(test)]
mod tests;
