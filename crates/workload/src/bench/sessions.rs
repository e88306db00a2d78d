//! A session trace replayed closed loop against a live server.
//!
//! A session's first turn is sent at its timestamp (divided by the speedup); a later turn,
//! or a row with `wait_for`, once what it waits for has ended (answered, refused or
//! failed) plus its `delay` and `tool_wait_ms` (divided by the speedup). Each turn carries
//! its session's conversation so far: the earlier turns' text and the answers the server
//! really gave, then the text that is new in this row (as many words as its
//! `input_length` exceeds what the conversation already holds, from its hash ids past
//! the blocks the conversation covers). So the prompt grows by the real answer, as an
//! agent's does, and the server's prefix cache sees what it would see.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use switchyard_core::trace::MooncakeRecord;
use switchyard_core::trace::session::{self, Releases};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::plan::PlannedRequest;
use super::prompt::PromptBuilder;
use super::record::RequestRecord;
use super::runner::Dispatch;
use crate::stats::Summary;

/// Turns past this index are reported with it.
const TURNS_REPORTED: usize = 8;

/// A session replay's first tokens by turn.
#[derive(Debug, Clone, Serialize)]
pub struct SessionTurns {
    pub sessions: usize,
    /// TTFT (ms) of each turn index (0: a session's first); the last gathers that turn
    /// and every later one.
    pub ttft_ms_by_turn: Vec<Option<Summary>>,
    /// Requests with a first token behind each entry.
    pub requests_by_turn: Vec<usize>,
}

impl SessionTurns {
    /// None unless the trace has sessions.
    pub fn of(rows: &[MooncakeRecord], records: &[RequestRecord]) -> Option<Self> {
        if !session::has_sessions(rows) {
            return None;
        }
        let turns = session::resolve(rows).ok()?;
        let mut by_turn: Vec<Vec<f64>> = Vec::new();
        for record in records {
            let Some(turn) = turns.get(record.index) else {
                continue;
            };
            let slot = (turn.turn as usize).min(TURNS_REPORTED - 1);
            if by_turn.len() <= slot {
                by_turn.resize(slot + 1, Vec::new());
            }
            if let Some(ttft) = record.ttft {
                by_turn[slot].push(ttft.as_secs_f64() * 1e3);
            }
        }
        let sent: std::collections::HashSet<u32> = records
            .iter()
            .filter_map(|r| turns.get(r.index).map(|t| t.session))
            .collect();
        Some(SessionTurns {
            sessions: sent.len(),
            requests_by_turn: by_turn.iter().map(Vec::len).collect(),
            ttft_ms_by_turn: by_turn.into_iter().map(Summary::of).collect(),
        })
    }
}

impl fmt::Display for SessionTurns {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let turns = self
            .ttft_ms_by_turn
            .iter()
            .enumerate()
            .filter_map(|(i, s)| {
                let s = s.as_ref()?;
                let plus = if i + 1 == TURNS_REPORTED { "+" } else { "" };
                Some(format!("{}{plus} {:.0}/{:.0}", i + 1, s.p50, s.p99))
            })
            .collect::<Vec<_>>()
            .join(", ");
        writeln!(
            f,
            "Sessions     {} (closed loop); TTFT p50/p99 ms by turn: {turns}",
            self.sessions
        )
    }
}

/// A session's conversation so far.
#[derive(Debug, Default, Clone)]
struct Conversation {
    messages: Arc<Vec<(&'static str, String)>>,
    /// Its tokens: the prompts' words (one word, one token) and the answers' tokens (the
    /// server's count when it reports usage).
    tokens: u64,
}

/// An ended request: its row, when it ended, its new text (and its tokens) and its answer.
struct Ended {
    row: usize,
    at: Instant,
    prompt: String,
    prompt_tokens: u64,
    answer: String,
    answer_tokens: u64,
}

/// Sends the trace's rows as their sessions release them, at most `limit` of them.
pub(super) async fn dispatch_sessions(
    rows: Vec<MooncakeRecord>,
    speedup: f64,
    prompts: PromptBuilder,
    limit: Option<usize>,
    dispatch: Dispatch,
) {
    let Ok(turns) = session::resolve(&rows) else {
        return; // The config's validation resolved them already.
    };
    let scale = |d: Duration| d.div_f64(speedup);
    let origin = rows
        .iter()
        .zip(&turns)
        .filter(|(_, t)| t.after.is_none())
        .map(|(r, _)| r.timestamp)
        .min()
        .unwrap_or(0);
    let (mut releases, orphans) = Releases::new(
        turns.iter().map(|t| t.after.as_ref()),
        speedup,
        dispatch.start,
    );
    // (when it may be sent, row); a min-heap.
    let mut ready: BinaryHeap<Reverse<(Instant, u32)>> = orphans.into_iter().map(Reverse).collect();
    for (index, (row, turn)) in rows.iter().zip(&turns).enumerate() {
        if turn.after.is_none() {
            let offset = Duration::from_millis(row.timestamp.saturating_sub(origin));
            ready.push(Reverse((dispatch.start + scale(offset), index as u32)));
        }
    }
    let sessions = turns.iter().map(|t| t.session).max().map_or(0, |s| s + 1);
    let mut conversations = vec![Conversation::default(); sessions as usize];
    let (ended_tx, mut ended_rx) = mpsc::unbounded_channel::<Ended>();
    let (mut sent, mut in_flight) = (0usize, 0usize);
    loop {
        let next = ready.peek().map(|Reverse((at, _))| *at);
        let sending = next
            .filter(|&at| !dispatch.past_deadline(at) && limit.is_none_or(|limit| sent < limit));
        if sending.is_none() && in_flight == 0 {
            break;
        }
        tokio::select! {
            () = sleep_until(sending) => {
                let Some(Reverse((at, index))) = ready.pop() else { continue };
                let index = index as usize;
                let row = &rows[index];
                let turn = &turns[index];
                let conversation = &conversations[turn.session as usize];
                let request = planned(index, row, conversation, prompts, at - dispatch.start);
                let new_tokens = request.prompt_tokens - conversation.tokens;
                sent += 1;
                in_flight += 1;
                let (task, ended) = (dispatch.clone(), ended_tx.clone());
                dispatch.tracker.spawn(async move {
                    let prompt = request.prompt.clone();
                    let (record, answer) =
                        task.client.send_for_answer(request, task.start, &task.cancel).await;
                    let answer_tokens = if record.usage_reported {
                        record.output_tokens
                    } else {
                        answer.split_whitespace().count() as u64
                    };
                    let _ = task.records.send(record);
                    let _ = ended.send(Ended {
                        row: index,
                        at: Instant::now(),
                        prompt,
                        prompt_tokens: new_tokens,
                        answer,
                        answer_tokens,
                    });
                });
            }
            Some(ended) = ended_rx.recv() => {
                in_flight -= 1;
                let session = turns[ended.row].session as usize;
                let conversation = &mut conversations[session];
                let messages = Arc::make_mut(&mut conversation.messages);
                messages.push(("user", ended.prompt));
                conversation.tokens += ended.prompt_tokens;
                if !ended.answer.is_empty() {
                    messages.push(("assistant", ended.answer));
                    conversation.tokens += ended.answer_tokens;
                }
                releases.ended(ended.row as u32, ended.at, |at, child| {
                    ready.push(Reverse((at, child)));
                });
            }
            () = dispatch.cancel.cancelled() => break,
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Row `index` as a request: the conversation so far, then the row's new text.
fn planned(
    index: usize,
    row: &MooncakeRecord,
    conversation: &Conversation,
    prompts: PromptBuilder,
    scheduled: Duration,
) -> PlannedRequest {
    let new_tokens = row.input_length.saturating_sub(conversation.tokens).max(1);
    let covered = (conversation.tokens / u64::from(prompts.block_size)) as usize;
    let ids = row.hash_ids.get(covered..).unwrap_or(&[]);
    // Past the row's own ids (its prompt shorter than the conversation already is): text
    // of its own, from its position in the trace.
    let own = [u64::MAX - index as u64];
    let ids = if ids.is_empty() { &own[..] } else { ids };
    PlannedRequest {
        index,
        scheduled: Some(scheduled),
        prompt: prompts.prompt(ids, new_tokens),
        history: (!conversation.messages.is_empty()).then(|| Arc::clone(&conversation.messages)),
        prompt_tokens: new_tokens + conversation.tokens,
        max_tokens: row.output_length.max(1),
    }
}
