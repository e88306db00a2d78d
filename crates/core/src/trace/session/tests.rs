use proptest::prelude::*;

use super::*;

fn rows(text: &str) -> Vec<MooncakeRecord> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| MooncakeRecord::parse(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect()
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn session_turns_wait_for_the_previous_turn() {
    let records = rows(
        r#"
        {"session_id":"a","timestamp":1000,"input_length":1024,"output_length":8,"hash_ids":[1,2]}
        {"session_id":"b","timestamp":1060,"input_length":512,"output_length":8,"hash_ids":[9]}
        {"session_id":"a","delay_ms":50,"tool_wait_ms":200.5,"input_length":1536,"output_length":8,"hash_ids":[1,2,3]}
        {"session_id":"a","timestamp":1900,"input_length":2048,"output_length":8,"hash_ids":[1,2,3,4]}
        {"session_id":"a","input_length":2560,"output_length":8,"hash_ids":[1,2,3,4,5]}
        {"timestamp":1070,"input_length":512,"output_length":8,"hash_ids":[7]}
        "#,
    );
    assert!(has_sessions(&records));
    let turns = resolve(&records).unwrap();
    let sessions: Vec<_> = turns.iter().map(|t| (t.session, t.turn)).collect();
    assert_eq!(sessions, [(0, 0), (1, 0), (0, 1), (0, 2), (0, 3), (2, 0)]);
    assert_eq!(turns[0].after, None);
    assert_eq!(turns[1].after, None);
    let after = turns[2].after.as_ref().unwrap();
    assert_eq!(after.parents, [0]);
    assert_eq!(after.delay, ms(50));
    assert_eq!(after.tool_wait, Duration::from_micros(200_500));
    // No delay: the gap between the session's timestamps (the previous turn had none, so
    // the one before it counts).
    assert_eq!(turns[3].after.as_ref().unwrap().delay, ms(900));
    assert_eq!(turns[3].after.as_ref().unwrap().parents, [2]);
    // Neither delay nor timestamp: sent as soon as the previous turn completes.
    assert_eq!(turns[4].after.as_ref().unwrap().wait(), Duration::ZERO);
    assert_eq!(turns[5].after, None);
}

#[test]
fn agentic_rows_fan_out_and_join_across_sessions() {
    let records = rows(
        r#"
        {"request_id":"root","session_id":"main","timestamp":0,"input_length":512,"output_length":8,"hash_ids":[1]}
        {"request_id":"join","session_id":"main","wait_for":["sub-1","sub-2"],"delay":10,"tool_wait_ms":2500,"input_length":1024,"output_length":8,"hash_ids":[1,2]}
        {"request_id":"sub-1","session_id":"s1","wait_for":["root"],"input_length":1024,"output_length":8,"hash_ids":[1,3]}
        {"request_id":"sub-2","session_id":"s2","wait_for":["root"],"delay":1.5,"input_length":1024,"output_length":8,"hash_ids":[1,4]}
        {"request_id":7,"timestamp":30.4,"input_length":512,"output_length":8,"hash_ids":[5]}
        "#,
    );
    let turns = resolve(&records).unwrap();
    assert_eq!(turns[0].after, None);
    let join = turns[1].after.as_ref().unwrap();
    assert_eq!(join.parents, [2, 3]);
    assert_eq!(join.wait(), ms(2510));
    assert_eq!(turns[2].after.as_ref().unwrap().parents, [0]);
    assert_eq!(
        turns[3].after.as_ref().unwrap().delay,
        Duration::from_micros(1500)
    );
    assert_eq!((turns[1].session, turns[1].turn), (0, 1));
    assert_eq!(records[4].request_id.as_deref(), Some("7"));
    assert_eq!(records[4].timestamp, 30);
    assert_eq!(turns[4].after, None);
}

#[test]
fn flat_traces_have_no_sessions() {
    let records = rows(
        r#"
        {"timestamp":0,"input_length":512,"output_length":8,"hash_ids":[1]}
        {"timestamp":5,"input_length":512,"output_length":8,"hash_ids":[1]}
        "#,
    );
    assert!(!has_sessions(&records));
    let turns = resolve(&records).unwrap();
    assert!(turns.iter().all(|t| t.after.is_none() && t.turn == 0));
    assert_eq!(turns[1].session, 1);
}

fn problem(text: &str) -> SessionError {
    resolve(&rows(text)).unwrap_err()
}

#[test]
fn broken_sessions_name_the_row_and_the_problem() {
    let head = r#"{"request_id":"a","timestamp":0,"input_length":1,"output_length":1}"#;
    let cases = [
        (
            format!(
                "{head}\n{}",
                r#"{"request_id":"a","wait_for":["a"],"input_length":1,"output_length":1}"#
            ),
            1,
            SessionProblem::DuplicateRequestId("a".into()),
        ),
        (
            format!(
                "{head}\n{}",
                r#"{"request_id":"b","wait_for":["zz"],"input_length":1,"output_length":1}"#
            ),
            1,
            SessionProblem::UnknownParent("zz".into()),
        ),
        (
            format!(
                "{head}\n{}",
                r#"{"request_id":"b","wait_for":["b"],"input_length":1,"output_length":1}"#
            ),
            1,
            SessionProblem::WaitsForItself("b".into()),
        ),
        (
            format!(
                "{head}\n{}\n{}",
                r#"{"request_id":"b","wait_for":["c"],"input_length":1,"output_length":1}"#,
                r#"{"request_id":"c","wait_for":["b"],"input_length":1,"output_length":1}"#
            ),
            1,
            SessionProblem::Cycle("b".into()),
        ),
        (
            format!(
                "{head}\n{}",
                r#"{"request_id":"b","wait_for":["a"],"delay":-1,"input_length":1,"output_length":1}"#
            ),
            1,
            SessionProblem::InvalidWait {
                field: "delay",
                value: -1.0,
            },
        ),
        (
            format!(
                "{head}\n{}\n{}",
                r#"{"request_id":"b","wait_for":["a"],"input_length":1,"output_length":1}"#,
                r#"{"request_id":"c","tool_wait_ms":3,"input_length":1,"output_length":1}"#
            ),
            2,
            SessionProblem::WaitWithoutParents,
        ),
        (
            r#"{"session_id":"s","delay":5,"input_length":1,"output_length":1}"#.to_string(),
            0,
            SessionProblem::DelayOnFirstTurn {
                session: "s".into(),
            },
        ),
        (
            format!(
                "{}\n{}",
                r#"{"session_id":"s","timestamp":50,"input_length":1,"output_length":1}"#,
                r#"{"session_id":"s","timestamp":20,"input_length":1,"output_length":1}"#
            ),
            1,
            SessionProblem::TimestampBackwards {
                session: "s".into(),
                timestamp: 20,
                previous: 50,
            },
        ),
    ];
    for (text, record, expected) in cases {
        let error = problem(&text);
        assert_eq!(error.problem, expected, "{text}");
        assert_eq!(error.record, record, "{text}");
        assert!(
            error
                .to_string()
                .starts_with(&format!("record {} ", record + 1))
        );
    }
    // A fraction of a millisecond in a timestamp rounds; a negative one is refused.
    assert!(
        MooncakeRecord::parse(r#"{"timestamp":-3,"input_length":1,"output_length":1}"#).is_err()
    );
}

/// A random session-form trace: `n` rows over a few sessions, some rows sessionless.
fn session_trace() -> impl Strategy<Value = Vec<(Option<u8>, Option<u16>, u16)>> {
    prop::collection::vec(
        (
            prop::option::weighted(0.8, 0u8..5),
            prop::option::of(0u16..500),
            0u16..2000,
        ),
        1..40,
    )
}

proptest! {
    /// Against a naive model: a turn's parent is the last earlier row of its session, its
    /// turn the number of earlier rows, its session numbered by first appearance.
    #[test]
    fn session_form_matches_a_naive_model(spec in session_trace()) {
        let mut records = Vec::new();
        for (i, &(session, delay, ts)) in spec.iter().enumerate() {
            let first = session.is_none_or(|s| !spec[..i].iter().any(|r| r.0 == Some(s)));
            records.push(MooncakeRecord {
                timestamp: u64::from(ts),
                input_length: 1,
                output_length: 1,
                session_id: session.map(|s| format!("s{s}")),
                delay: delay.filter(|_| !first).map(f64::from),
                ..MooncakeRecord::default()
            });
        }
        let turns = match resolve(&records) {
            Ok(turns) => turns,
            // Only timestamps going backwards without a delay are refused.
            Err(e) => {
                prop_assert!(matches!(e.problem, SessionProblem::TimestampBackwards { .. }), "{e}");
                return Ok(());
            }
        };
        let mut names: Vec<Option<u8>> = Vec::new();
        for (i, turn) in turns.iter().enumerate() {
            let session = spec[i].0;
            let earlier: Vec<usize> = (0..i).filter(|&j| session.is_some() && spec[j].0 == session).collect();
            prop_assert_eq!(turn.turn as usize, earlier.len());
            let number = match session {
                Some(_) => names.iter().position(|&n| n == session),
                None => None,
            };
            let number = number.unwrap_or_else(|| { names.push(session); names.len() - 1 });
            prop_assert_eq!(turn.session as usize, number);
            match earlier.last() {
                None => prop_assert!(turn.after.is_none()),
                Some(&parent) => {
                    let after = turn.after.as_ref().unwrap();
                    prop_assert_eq!(&after.parents, &vec![parent as u32]);
                    if let Some(d) = spec[i].1 {
                        prop_assert_eq!(after.delay, ms(u64::from(d)));
                    }
                }
            }
        }
    }

    /// What is written reads back the same, sessions included.
    #[test]
    fn session_rows_round_trip(
        ts in 0u64..1_000_000,
        session in prop::option::of("[a-z0-9:-]{1,12}"),
        id in prop::option::of("[a-z0-9-]{1,8}"),
        wait_for in prop::collection::vec("[a-z0-9-]{1,8}", 0..4),
        delay in prop::option::of(0u32..100_000),
        tool in prop::option::of(0u32..100_000),
    ) {
        let record = MooncakeRecord {
            timestamp: ts,
            input_length: 700,
            output_length: 3,
            hash_ids: vec![1, 2],
            session_id: session,
            request_id: id,
            wait_for,
            delay: delay.map(|d| f64::from(d) / 4.0),
            tool_wait_ms: tool.map(f64::from),
            ..MooncakeRecord::default()
        };
        let line = serde_json::to_string(&record).unwrap();
        prop_assert_eq!(MooncakeRecord::parse(&line).unwrap(), record);
    }
}

#[test]
fn a_join_is_released_after_its_last_parent_and_a_cut_off_one_at_once() {
    let after = |parents: Vec<u32>, ms_wait: u64| After {
        parents,
        delay: ms(ms_wait),
        tool_wait: ms(ms_wait),
    };
    // Row 2 joins 0 and 1; row 3 waits for row 9, outside the slice.
    let afters = [
        None,
        None,
        Some(after(vec![0, 1], 10)),
        Some(after(vec![9], 5)),
    ];
    let (mut releases, orphans) = Releases::new(afters.iter().map(Option::as_ref), 2.0, ms(1000));
    assert_eq!(orphans, [(ms(1005), 3)]);
    assert_eq!((releases.unreleased(), releases.min_wait()), (1, ms(5)));
    let mut released = Vec::new();
    releases.ended(1, ms(300), |at, row| released.push((at, row)));
    assert!(released.is_empty());
    releases.ended(0, ms(200), |at, row| released.push((at, row)));
    // The later end counts, plus 20 ms of waits at twice the speed.
    assert_eq!(released, [(ms(310), 2)]);
    // Only a row's first end counts.
    releases.ended(0, ms(900), |at, row| released.push((at, row)));
    assert_eq!((released.len(), releases.unreleased()), (1, 0));
}
