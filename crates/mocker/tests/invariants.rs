//! Invariants of the engine under random workloads, with a real indexer fed its events.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use proptest::prelude::*;
use switchyard_core::{HashSeed, RequestId, TokenBlocks, WorkerKey};
use switchyard_mocker::tokens::token_at;
use switchyard_mocker::{
    EngineArgs, MockEngine, MockRequest, PerfModel, PreemptionMode, StepOutput,
};
use switchyard_router::{Indexer, IndexerConfig};

#[derive(Debug, Clone)]
struct Arrival {
    at_step: usize,
    prefix: usize,
    suffix: Vec<u32>,
    max_output: u32,
    cancel_after: Option<usize>,
}

fn arrival() -> impl Strategy<Value = Arrival> {
    (
        0usize..30,
        0usize..3,
        prop::collection::vec(0u32..1000, 0..10),
        1u32..12,
        prop::option::weighted(0.2, 0usize..20),
    )
        .prop_map(
            |(at_step, prefix, suffix, max_output, cancel_after)| Arrival {
                at_step,
                prefix,
                suffix,
                max_output,
                cancel_after,
            },
        )
}

fn args() -> impl Strategy<Value = EngineArgs> {
    (
        prop_oneof![Just(2u32), Just(4)],
        6u32..40,
        1u32..6,
        4u32..32,
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(
            |(
                block_size,
                num_gpu_blocks,
                max_num_seqs,
                max_num_batched_tokens,
                caching,
                chunked,
                lifo,
            )| EngineArgs {
                block_size,
                num_gpu_blocks,
                max_num_seqs,
                max_num_batched_tokens,
                enable_prefix_caching: caching,
                enable_chunked_prefill: chunked,
                preemption_mode: if lifo {
                    PreemptionMode::Lifo
                } else {
                    PreemptionMode::Fifo
                },
                speedup_ratio: 1.0,
                ..EngineArgs::default()
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn engine_invariants_hold(args in args(), arrivals in prop::collection::vec(arrival(), 1..12)) {
        let worker = WorkerKey::new(3, 1);
        let mut engine = MockEngine::new(worker, args, PerfModel::Polynomial, 11).unwrap();
        let mut indexer = Indexer::new(IndexerConfig::default());
        let prefixes: [Vec<u32>; 3] = [vec![], (0..7).collect(), (100..112).collect()];

        let mut accepted: BTreeMap<RequestId, (u32, Option<usize>)> = BTreeMap::new();
        let mut outputs: BTreeMap<RequestId, Vec<(u32, u32, bool)>> = BTreeMap::new();
        let mut cancelled: HashSet<RequestId> = HashSet::new();
        let mut prompt_lens: BTreeMap<RequestId, u32> = BTreeMap::new();
        let mut now = Duration::ZERO;
        let mut out = StepOutput::default();
        let last_arrival = arrivals.iter().map(|a| a.at_step).max().unwrap_or(0);
        let mut step = 0usize;
        while step <= last_arrival || engine.has_work() {
            for (i, a) in arrivals.iter().enumerate().filter(|(_, a)| a.at_step == step) {
                let mut prompt = prefixes[a.prefix].clone();
                prompt.extend(&a.suffix);
                if prompt.is_empty() {
                    prompt.push(7);
                }
                let id = RequestId(i as u64);
                let blocks = TokenBlocks::new(&prompt, args.block_size, HashSeed::default()).unwrap();
                let prompt_len = prompt.len() as u32;
                if engine.add_request(MockRequest::new(id, blocks, a.max_output)).is_ok() {
                    accepted.insert(id, (a.max_output, a.cancel_after.map(|c| step + c)));
                    prompt_lens.insert(id, prompt_len);
                }
            }
            for (&id, &(_, cancel_at)) in &accepted {
                if cancel_at == Some(step) && engine.cancel(id) {
                    cancelled.insert(id);
                }
            }
            engine.step(now, &mut out);
            now = out.finished_at();
            for t in &out.tokens {
                outputs.entry(t.request).or_default().push((t.index, t.token, t.finish.is_some()));
            }
            for event in &out.events {
                indexer.apply(event);
            }

            engine.validate().map_err(|e| TestCaseError::fail(e.to_string()))?;
            let blocks = engine.block_manager();
            prop_assert!(blocks.in_use() + blocks.inactive() <= blocks.capacity());
            indexer.validate().map_err(|e| TestCaseError::fail(e.to_string()))?;
            // With no event delay the indexer's view is exactly the engine's cache.
            let engine_view: HashSet<_> = blocks.cached_hashes().collect();
            let indexer_view: HashSet<_> = indexer.worker_hashes(worker).into_iter().collect();
            prop_assert_eq!(&indexer_view, &engine_view, "after step {}", step);
            if !args.enable_prefix_caching {
                prop_assert!(engine_view.is_empty());
            }
            step += 1;
            prop_assert!(step < 20_000, "engine does not converge");
        }

        // Every accepted request completed with its full deterministic stream, or was cancelled.
        for (&id, &(max_output, _)) in &accepted {
            let stream = outputs.get(&id).cloned().unwrap_or_default();
            if cancelled.contains(&id) {
                prop_assert!(stream.iter().all(|t| !t.2));
                continue;
            }
            prop_assert_eq!(stream.len() as u32, max_output, "request {}", id);
            for (i, &(index, token, finished)) in stream.iter().enumerate() {
                prop_assert_eq!(index, i as u32);
                prop_assert_eq!(token, token_at(11, id.0, prompt_lens[&id] + i as u32));
                prop_assert_eq!(finished, i as u32 + 1 == max_output);
            }
        }
        prop_assert_eq!(engine.load().active_blocks, 0);
    }
}
