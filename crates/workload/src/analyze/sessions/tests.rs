use proptest::prelude::*;
use switchyard_core::trace::session;

use super::*;

/// Rows of conversations: turn t of session s sends the shared block 0, the first
/// `full[t]` blocks of the session's own stream, and a partial block of its own.
/// Returns the rows (in the given order of (session, turn, timestamp)) and each row's true
/// parent.
fn conversations(turns: &[(u64, Vec<u64>)]) -> (Vec<MooncakeRecord>, Vec<Option<usize>>) {
    let mut rows = Vec::new();
    let mut truth = Vec::new();
    // (session, turn, timestamp) in arrival order.
    let mut events: Vec<(u64, usize, u64)> = Vec::new();
    for (s, (start, fulls)) in turns.iter().enumerate() {
        for t in 0..fulls.len() {
            events.push((s as u64, t, start + 1000 * t as u64));
        }
    }
    events.sort_by_key(|e| e.2);
    let mut index: HashMap<(u64, usize), usize> = HashMap::new();
    for (s, t, at) in events {
        let full = turns[s as usize].1[t];
        let mut ids = vec![0];
        ids.extend((1..=full).map(|b| s * 10_000 + b));
        ids.push(1_000_000 + rows.len() as u64);
        index.insert((s, t), rows.len());
        truth.push(t.checked_sub(1).map(|p| index[&(s, p)]));
        rows.push(MooncakeRecord {
            timestamp: at,
            input_length: (1 + full) * 512 + 100,
            output_length: 40,
            hash_ids: ids,
            ..MooncakeRecord::default()
        });
    }
    (rows, truth)
}

#[test]
fn turns_are_chained_and_a_shared_system_prompt_links_nothing() {
    // 60 single-turn rows that share only block 0 (common), and two conversations.
    let mut spec: Vec<(u64, Vec<u64>)> = (0..60).map(|i| (i * 10, vec![1])).collect();
    spec.push((5, vec![2, 4, 5]));
    spec.push((7, vec![1, 3]));
    let (mut rows, truth) = conversations(&spec);
    // A row with nothing but the system prompt filled whole: it is no one's parent.
    rows.push(MooncakeRecord {
        timestamp: 0,
        input_length: 600,
        output_length: 1,
        hash_ids: vec![0, 5_000_000],
        ..MooncakeRecord::default()
    });
    let recovered = recover(&rows, 512);
    assert_eq!(recovered.parent[..truth.len()], truth[..]);
    assert_eq!(recovered.parent[truth.len()], None);
    assert_eq!(recovered.ambiguous, 0);
    let shape = SessionShape::of(&rows, &recovered);
    assert_eq!(shape.sessions, 63);
    assert_eq!(shape.continuing, 3);
    assert_eq!(shape.sessions_by_turns[..3], [61, 1, 1]);
    // Each turn grows by whole blocks; the answer (40 tokens) is inside that growth.
    assert_eq!(shape.carrying_the_answer, 3);
    assert_eq!(shape.gap_ms.p50, 1000.0);
}

#[test]
fn a_retried_turn_is_ambiguous_and_the_latest_is_taken() {
    let (mut rows, _) = conversations(&[(0, vec![2, 3])]);
    // The first turn sent again (the same prompt) before the second turn.
    let mut again = rows[0].clone();
    again.timestamp = 500;
    rows.push(again);
    let recovered = recover(&rows, 512);
    assert_eq!(recovered.parent, [None, Some(2), Some(0)]);
    assert_eq!(recovered.ambiguous, 1);
}

#[test]
fn the_session_trace_resolves_to_the_recovered_chains() {
    let (rows, truth) = conversations(&[(0, vec![1, 2, 4]), (300, vec![3, 5])]);
    let recovered = recover(&rows, 512);
    assert_eq!(recovered.parent, truth);
    let written = session_trace(&rows, &recovered, 5.0);
    let turns = session::resolve(&written).unwrap();
    for (i, turn) in turns.iter().enumerate() {
        let original: usize = written[i].request_id.as_ref().unwrap()[1..]
            .parse()
            .unwrap();
        match truth[original] {
            None => assert!(turn.after.is_none()),
            Some(p) => {
                let after = turn.after.as_ref().unwrap();
                let parent = &written[after.parents[0] as usize];
                assert_eq!(parent.request_id.as_deref(), Some(format!("r{p}").as_str()));
                // A 1,000 ms gap less 40 output tokens at 5 ms each.
                assert_eq!(after.delay.as_millis(), 800);
            }
        }
    }
    assert!(session::has_sessions(&written));
    assert_eq!(written[0].timestamp, 0);
}

proptest! {
    /// Against the generator's truth: interleaved conversations whose turns each grow by
    /// at least one whole block are chained back exactly.
    #[test]
    fn interleaved_conversations_are_recovered(
        spec in prop::collection::vec(
            (0u64..5_000, prop::collection::vec(1u64..4, 1..6)),
            1..12,
        )
    ) {
        let spec: Vec<(u64, Vec<u64>)> = spec
            .into_iter()
            .map(|(start, steps)| {
                let fulls = steps.iter().scan(0, |acc, s| { *acc += s; Some(*acc) }).collect();
                (start, fulls)
            })
            .collect();
        let (rows, truth) = conversations(&spec);
        let recovered = recover(&rows, 512);
        prop_assert_eq!(&recovered.parent, &truth);
        let shape = SessionShape::of(&rows, &recovered);
        prop_assert_eq!(shape.sessions, spec.len());
    }
}
