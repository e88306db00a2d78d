//! The CPU engine on the real SmolLM2-135M GGUF (`SWITCHYARD_SMOLLM2_GGUF`, fetched by
//! `scripts/test`): greedy output as llama.cpp computes it, batching that changes nothing,
//! the prefix cache (skipped prefill, events, eviction), seeded sampling, stop tokens, and
//! clear errors for bad model files and prompts.

#![allow(clippy::unwrap_used)]

use std::path::PathBuf;

use switchyard_candle::{CandleConfig, CandleEngine, CandleWorker, Gguf, Model};
use switchyard_core::protocol::{EngineError, FinishReason, GenerateRequest, TokenOutput};
use switchyard_core::{KvEvent, KvEventData, Prompt, RequestId, WorkerKey, blocks_for};
use switchyard_worker::driver::StepEngine;

fn model_path() -> PathBuf {
    let path = std::env::var("SWITCHYARD_SMOLLM2_GGUF").unwrap_or_default();
    let path = PathBuf::from(path);
    assert!(
        path.is_file(),
        "SWITCHYARD_SMOLLM2_GGUF must name the SmolLM2-135M-Instruct Q4_1 GGUF (got {path:?}); run scripts/test, which fetches it"
    );
    path
}

/// An engine over a fresh load of the model.
fn engine(config: CandleConfig) -> CandleEngine {
    let mut gguf = Gguf::open(&model_path()).unwrap();
    let model = Model::load(&mut gguf, config.dense_weights).unwrap();
    CandleEngine::new(model, config, WorkerKey::new(3, 0))
}

fn config() -> CandleConfig {
    CandleConfig {
        model: model_path(),
        ..CandleConfig::default()
    }
}

/// "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n".
const FRANCE: [u32; 16] = [
    1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198,
];
/// llama.cpp's greedy continuation of it (llama-cpp-python 0.3.16, same file): "The
/// capital of France is Paris." and on.
const FRANCE_GREEDY: [u32; 24] = [
    504, 3575, 282, 4649, 314, 7042, 30, 2, 198, 2, 1, 9690, 198, 2, 198, 1, 4093, 198, 57, 5248,
    3946, 288, 7198, 253,
];

/// An engine that runs three sequences at once and prefills prompts in chunks of 32
/// tokens: set by the token budget alone (paced by the measured step time, a loaded
/// machine would chunk differently, and a near tie in the logits could fall either way).
fn chunking() -> CandleEngine {
    engine(CandleConfig {
        max_batched_tokens: 32,
        max_num_seqs: 3,
        step_target: std::time::Duration::from_secs(3600),
        ..config()
    })
}

fn greedy(id: u64, prompt: Vec<u32>, max_tokens: u32) -> GenerateRequest {
    let mut r = GenerateRequest::text(RequestId(id), prompt, max_tokens);
    r.sampling.temperature = Some(0.0);
    r
}

/// Steps until idle; every token and event, in order.
fn run(engine: &mut CandleEngine) -> (Vec<TokenOutput>, Vec<KvEvent>) {
    let (mut tokens, mut events) = (Vec::new(), Vec::new());
    let mut steps = 0;
    while engine.has_work() {
        engine.step(std::time::Duration::ZERO, &mut tokens, &mut events);
        steps += 1;
        assert!(steps < 10_000, "the engine never finishes");
    }
    (tokens, events)
}

fn of(tokens: &[TokenOutput], id: u64) -> Vec<u32> {
    tokens
        .iter()
        .filter(|t| t.request == RequestId(id))
        .map(|t| t.token)
        .collect()
}

/// A prompt of `n` tokens of ordinary text-like ids.
fn long_prompt(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| 300 + (i * 7 + salt * 13) % 20_000)
        .collect()
}

#[test]
fn greedy_decoding_matches_llama_cpp_and_batching_changes_nothing() {
    let mut alone = engine(config());
    alone.add(greedy(1, FRANCE.to_vec(), 24)).unwrap();
    let (tokens, _) = run(&mut alone);
    assert_eq!(of(&tokens, 1), FRANCE_GREEDY);
    let last = tokens.last().unwrap();
    assert_eq!(last.finish, Some(FinishReason::Length));
    assert_eq!(
        tokens.iter().map(|t| t.index).collect::<Vec<_>>(),
        (0..24).collect::<Vec<_>>()
    );

    // The same request among others, with prompts prefilled in chunks over several steps
    // while others decode.
    let mut batched = chunking();
    batched.add(greedy(10, long_prompt(90, 1), 12)).unwrap();
    batched.add(greedy(11, FRANCE.to_vec(), 24)).unwrap();
    batched.add(greedy(12, long_prompt(50, 2), 30)).unwrap();
    batched.add(greedy(13, long_prompt(70, 3), 5)).unwrap();
    let (tokens, _) = run(&mut batched);
    assert_eq!(of(&tokens, 11), FRANCE_GREEDY);
    for (id, n) in [(10, 12), (12, 30), (13, 5)] {
        assert_eq!(of(&tokens, id).len(), n, "request {id}");
    }
    // Each of them alone gives what it gave in the batch.
    let mut single = engine(config());
    single.add(greedy(20, long_prompt(70, 3), 5)).unwrap();
    let (alone_tokens, _) = run(&mut single);
    assert_eq!(of(&alone_tokens, 20), of(&tokens, 13));
}

/// A token, its log probability, and the likeliest tokens' at its step.
type Scored = (u32, f32, Vec<(u32, f32)>);

/// The log probabilities of request `id`'s tokens.
fn logprobs_of(tokens: &[TokenOutput], id: u64) -> Vec<Scored> {
    tokens
        .iter()
        .filter(|t| t.request == RequestId(id))
        .map(|t| {
            let l = t.logprobs.as_deref().expect("log probabilities, as asked");
            (t.token, l.logprob, l.top.clone())
        })
        .collect()
}

#[test]
fn log_probabilities_are_the_models_and_batching_changes_them_little() {
    let asking = |id: u64, prompt: Vec<u32>, n: u32| {
        let mut r = greedy(id, prompt, 12);
        r.sampling.logprobs = Some(n);
        r
    };
    let mut alone = engine(config());
    alone.add(asking(1, FRANCE.to_vec(), 5)).unwrap();
    let (tokens, _) = run(&mut alone);
    let single = logprobs_of(&tokens, 1);
    assert_eq!(single.len(), 12);
    for (token, logprob, top) in &single {
        assert_eq!(top.len(), 5);
        assert!(top.windows(2).all(|w| w[0].1 >= w[1].1), "{top:?}");
        assert!(
            top.iter().all(|&(_, l)| l <= 0.0 && l.is_finite()),
            "{top:?}"
        );
        let mass: f32 = top.iter().map(|&(_, l)| l.exp()).sum();
        assert!(mass <= 1.0 + 1e-4, "{top:?}");
        // Greedy: the token drawn is the likeliest.
        assert_eq!((*token, *logprob), top[0]);
    }
    // "The capital of France is Paris.": the model is sure of "Paris".
    let paris = single.iter().find(|t| t.0 == 7042).expect("Paris");
    assert!(paris.1 > -0.5, "{paris:?}");

    // In a batch, chunked: the same tokens, each with its log probability within 0.1. A
    // batched step computes its logits along another path than a step of one sequence
    // (the quantised weights dequantised, not the activations quantised): 0.03 apart on
    // the first token here, and up to 0.27 on the alternatives, enough to reorder them.
    let mut batched = chunking();
    batched.add(asking(10, long_prompt(90, 1), 3)).unwrap();
    batched.add(asking(11, FRANCE.to_vec(), 5)).unwrap();
    batched.add(greedy(12, long_prompt(50, 2), 8)).unwrap();
    let (tokens, _) = run(&mut batched);
    let batch = logprobs_of(&tokens, 11);
    assert_eq!(batch.len(), single.len());
    for ((token, logprob, top), (t, l, _)) in batch.iter().zip(&single) {
        assert_eq!(token, t);
        assert!((logprob - l).abs() < 0.1, "{logprob} against {l}");
        assert_eq!(top.len(), 5);
    }
    assert!(logprobs_of(&tokens, 10).iter().all(|t| t.2.len() == 3));
    // Not asked, not computed.
    assert!(
        tokens
            .iter()
            .filter(|t| t.request == RequestId(12))
            .all(|t| t.logprobs.is_none())
    );

    // Under a constraint the token drawn may not be the model's likeliest: its own log
    // probability is reported, under the model's distribution.
    let mut constrained = engine(config());
    let grammars = {
        let gguf = Gguf::open(&model_path()).unwrap();
        switchyard_candle::grammars(&gguf).unwrap()
    };
    constrained = constrained.with_grammars(std::sync::Arc::clone(&grammars));
    let mut r = asking(30, FRANCE.to_vec(), 2);
    r.sampling.constraint = Some(switchyard_core::protocol::Constraint::Choice(vec![
        "Lyon".into(),
    ]));
    r.sampling.vocabulary = Some(grammars.vocabulary().to_owned());
    constrained.add(r).unwrap();
    let (tokens, _) = run(&mut constrained);
    let first = &logprobs_of(&tokens, 30)[0];
    assert_ne!(
        first.0, first.2[0].0,
        "the constraint overrode the model's choice"
    );
    assert!(first.1 < first.2[0].1, "{first:?}");
}

/// A prompt's log probabilities, asked: one per token after the first, on its first output
/// token, across prompt chunks; computed whole though the prompt is cached; never for a
/// resumed request.
#[test]
fn a_prompts_log_probabilities_come_whole_with_its_first_token() {
    let prompt = long_prompt(90, 3);
    let mut engine = chunking();
    engine.add(greedy(1, prompt.clone(), 1)).unwrap();
    run(&mut engine);
    let mut asking = greedy(2, prompt.clone(), 2);
    asking.sampling.prompt_logprobs = Some(2);
    engine.add(asking.clone()).unwrap();
    let (tokens, _) = run(&mut engine);
    let first = tokens.iter().find(|t| t.request == RequestId(2)).unwrap();
    assert_eq!(first.cached_tokens, 0, "computed whole");
    let entries = first
        .prompt_logprobs
        .as_deref()
        .expect("the prompt's, as asked");
    assert_eq!(entries.len(), prompt.len() - 1);
    for entry in entries {
        assert_eq!(entry.top.len(), 2);
        assert!(entry.top[0].1 >= entry.top[1].1, "{entry:?}");
        assert!(entry.logprob <= entry.top[0].1 + 1e-5, "{entry:?}");
        assert!(
            entry.logprob.is_finite() && entry.logprob <= 0.0,
            "{entry:?}"
        );
    }
    // The same as a prompt computed in one step, within what the split moves them.
    let mut whole = engine_with_budget(1024);
    asking.id = RequestId(3);
    whole.add(asking.clone()).unwrap();
    let (tokens, _) = run(&mut whole);
    let once = tokens.iter().find(|t| t.request == RequestId(3)).unwrap();
    let once = once.prompt_logprobs.as_deref().unwrap();
    for (a, b) in entries.iter().zip(once) {
        assert!((a.logprob - b.logprob).abs() < 0.5, "{a:?} against {b:?}");
    }
    // Only the first output token carries them.
    assert_eq!(
        tokens
            .iter()
            .filter(|t| t.prompt_logprobs.is_some())
            .count(),
        1
    );
    // A resumed request's prompt went out before: none.
    asking.id = RequestId(4);
    asking.resume = Some(switchyard_core::protocol::Resume { generated: 1 });
    whole.add(asking).unwrap();
    let (tokens, _) = run(&mut whole);
    assert!(tokens.iter().all(|t| t.prompt_logprobs.is_none()));
}

fn engine_with_budget(tokens: u32) -> CandleEngine {
    engine(CandleConfig {
        max_batched_tokens: tokens,
        step_target: std::time::Duration::from_secs(3600),
        ..config()
    })
}

#[test]
fn the_prefix_cache_skips_prefill_publishes_events_and_evicts() {
    let mut e = engine(config());
    let prompt = long_prompt(100, 5);
    e.add(greedy(1, prompt.clone(), 8)).unwrap();
    let (first, events) = run(&mut e);
    assert_eq!(first[0].cached_tokens, 0);
    // Its full blocks were stored, as the router hashes them.
    let expected = blocks_for(&Prompt::tokens(prompt.clone()), 16).unwrap();
    let stored: Vec<_> = events
        .iter()
        .flat_map(|e| match &e.data {
            KvEventData::Stored { blocks, .. } => blocks.clone(),
            _ => Vec::new(),
        })
        .collect();
    assert!(stored.len() >= expected.full_blocks(), "{stored:?}");
    for (i, block) in stored.iter().take(expected.full_blocks()).enumerate() {
        assert_eq!(block.seq_hash, expected.sequence_hashes()[i]);
        assert_eq!(block.local_hash, expected.local_hashes()[i]);
    }
    let ids: Vec<u64> = events.iter().map(|e| e.event_id).collect();
    assert!(ids.windows(2).all(|w| w[1] == w[0] + 1), "{ids:?}");
    assert_eq!(e.held_prefix(expected.sequence_hashes()), 6);

    // Again: 96 of its 100 tokens come from the cache, and the output is the same.
    e.add(greedy(2, prompt.clone(), 8)).unwrap();
    let (second, _) = run(&mut e);
    assert_eq!(second[0].cached_tokens, 96);
    assert_eq!(of(&second, 2), of(&first, 1));

    // A cache of two blocks: storing more evicts the oldest, and says so.
    let tiny_mib = 1; // SmolLM2-135M: 46 KiB a token, 720 KiB a block of 16: one block.
    let mut small = engine(CandleConfig {
        cache_mib: tiny_mib,
        ..config()
    });
    small.add(greedy(3, long_prompt(64, 7), 1)).unwrap();
    let (_, events) = run(&mut small);
    let removed: usize = events
        .iter()
        .map(|e| match &e.data {
            KvEventData::Removed { seq_hashes } => seq_hashes.len(),
            _ => 0,
        })
        .sum();
    assert_eq!(small.capacity_blocks(), 1);
    assert_eq!(removed, 3, "four blocks through a cache of one: {events:?}");
}

#[test]
fn seeded_sampling_is_reproducible_and_stop_tokens_stop() {
    let sampled = |seed: u64| {
        let mut e = engine(config());
        let mut r = GenerateRequest::text(RequestId(1), FRANCE.to_vec(), 16);
        r.sampling.temperature = Some(1.0);
        r.sampling.top_p = Some(0.95);
        r.sampling.top_k = Some(50);
        r.sampling.seed = Some(seed);
        e.add(r).unwrap();
        of(&run(&mut e).0, 1)
    };
    let a = sampled(7);
    assert_eq!(a, sampled(7));
    assert_ne!(a, sampled(8));

    let mut e = engine(config());
    let mut r = greedy(2, FRANCE.to_vec(), 24);
    r.sampling.stop_token_ids = vec![FRANCE_GREEDY[3]];
    e.add(r).unwrap();
    let (tokens, _) = run(&mut e);
    assert_eq!(of(&tokens, 2), FRANCE_GREEDY[..4]);
    assert_eq!(tokens.last().unwrap().finish, Some(FinishReason::Stop));
}

#[test]
fn bad_models_and_prompts_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let load = |path: PathBuf| {
        CandleWorker::load(
            &CandleConfig {
                model: path,
                ..CandleConfig::default()
            },
            WorkerKey::new(1, 0),
        )
        .err()
        .unwrap()
        .to_string()
    };
    let missing = load(dir.path().join("none.gguf"));
    assert!(missing.contains("cannot read the model file"), "{missing}");
    std::fs::write(dir.path().join("text.gguf"), b"hello, not a model").unwrap();
    let foreign = load(dir.path().join("text.gguf"));
    assert!(foreign.contains("is not a GGUF file"), "{foreign}");
    let bytes = std::fs::read(model_path()).unwrap();
    std::fs::write(dir.path().join("cut.gguf"), &bytes[..bytes.len() / 3]).unwrap();
    let truncated = load(dir.path().join("cut.gguf"));
    assert!(truncated.contains("not a usable GGUF model"), "{truncated}");
    let none = CandleWorker::load(&CandleConfig::default(), WorkerKey::new(1, 0))
        .err()
        .unwrap()
        .to_string();
    assert!(none.contains("needs a model file"), "{none}");

    let mut e = engine(config());
    let err = e.add(greedy(1, vec![1; 9000], 4)).err().unwrap();
    assert!(
        matches!(&err, EngineError::Invalid(m) if m.contains("context is 8192")),
        "{err}"
    );
    let err = e.add(greedy(2, vec![60_000], 4)).err().unwrap();
    assert!(matches!(err, EngineError::Invalid(_)), "{err}");
    assert!(!e.has_work());
}

#[test]
fn the_gguf_files_tokenizer_and_template_serve_a_frontend() {
    use switchyard_frontend::preprocess::{ChatMessage, Preprocessor};
    let gguf = Gguf::open(&model_path()).unwrap();
    let files = gguf.tokenizer_files().unwrap();
    let from_gguf = Preprocessor::from_files(
        "gguf",
        &files.tokenizer,
        &files.tokenizer_config,
        &files.config,
        None,
    )
    .unwrap();
    // SmolLM2's own tokenizer.json, built into the frontend, is the reference.
    let reference = Preprocessor::smollm2(None).unwrap();
    assert_eq!(from_gguf.context_length(), 8192);
    assert_eq!(from_gguf.eos_token_ids(), reference.eos_token_ids());
    let messages = [ChatMessage::new("user", "What is the capital of France?")];
    let rendered = from_gguf.render_chat(&messages).unwrap();
    assert_eq!(rendered, reference.render_chat(&messages).unwrap());
    for text in [
        rendered.as_str(),
        "Freight yards sort railway cars onto tracks by destination.",
        "Prices rose 12.5% in 2026; see https://example.com/a_b?c=1 for more!",
        "  indented\n\n\tcode() {}  ",
        "naïve café, 東京, emoji 🚂",
    ] {
        assert_eq!(
            from_gguf.encode(text).unwrap(),
            reference.encode(text).unwrap(),
            "{text:?}"
        );
    }
}

/// A profile of 1 ms a prompt token.
fn linear_profile(dir: &std::path::Path) -> PathBuf {
    let path = dir.join("profile.json");
    let profile = serde_json::json!({
        "prefill_isl": [10.0, 1000.0],
        "prefill_ttft_ms": [10.0, 1000.0],
        "decode_active_kv_tokens": [1.0, 10000.0],
        "decode_context_length": [1.0, 10000.0],
        "decode_itl": [[20.0, 20.0], [40.0, 40.0]],
    });
    std::fs::write(&path, profile.to_string()).unwrap();
    path
}

#[test]
fn a_timing_profile_is_announced_and_sizes_every_prompt_chunk() {
    use switchyard_worker::Engine;

    let dir = tempfile::tempdir().unwrap();
    let profile = linear_profile(dir.path());
    let settings = CandleConfig {
        perf_profile: Some(profile.clone()),
        step_target: std::time::Duration::from_millis(100),
        ..config()
    };
    let worker = CandleWorker::load(&settings, WorkerKey::new(1, 0)).unwrap();
    let (perf, tokens) = worker.timing().expect("announced");
    assert_eq!(perf, switchyard_mocker::perf::load(&profile).unwrap());
    assert_eq!(tokens, 100, "1 ms a token within a 100 ms step");
    let without = CandleWorker::load(&config(), WorkerKey::new(1, 0)).unwrap();
    assert!(without.timing().is_none());

    // A 250-token prompt is computed in chunks of 100, 100 and 50 tokens: its first token
    // comes out of the third step, whatever the steps measured.
    let mut e = engine(settings.clone()).with_timing(perf);
    e.add(greedy(1, long_prompt(250, 7), 2)).unwrap();
    let (mut out, mut events) = (Vec::new(), Vec::new());
    let mut steps = 0;
    while out.is_empty() {
        e.step(std::time::Duration::ZERO, &mut out, &mut events);
        steps += 1;
        assert!(steps < 10, "no first token");
    }
    assert_eq!(steps, 3);

    // A profile that cannot be read fails the start, before the model loads.
    let bad = CandleWorker::load(
        &CandleConfig {
            perf_profile: Some(dir.path().join("missing.json")),
            ..config()
        },
        WorkerKey::new(1, 0),
    )
    .err()
    .unwrap()
    .to_string();
    assert!(bad.contains("cannot read profile"), "{bad}");
    std::fs::write(dir.path().join("bad.json"), "{\"prefill_isl\": [1]}").unwrap();
    let bad = CandleWorker::load(
        &CandleConfig {
            perf_profile: Some(dir.path().join("bad.json")),
            ..config()
        },
        WorkerKey::new(1, 0),
    )
    .err()
    .unwrap()
    .to_string();
    assert!(bad.contains("invalid profile"), "{bad}");
}

/// `rows` encoder embeddings of 384 values (DINOv2 ViT-S/14's width), seeded.
fn encoder_rows(rows: usize, seed: u32) -> Vec<f32> {
    (0..rows * 384)
        .map(|i| {
            (i as u32)
                .wrapping_add(seed.wrapping_mul(1_000_003))
                .wrapping_mul(2_654_435_761) as f32
                / u32::MAX as f32
                - 0.5
        })
        .collect()
}

/// `text` tokens, then an image of `length` placeholder positions (hash `hash`), then the
/// end of a chat turn.
fn with_media(hash: u64, length: u32, embeddings: Option<&[f32]>) -> GenerateRequest {
    let mut tokens = vec![1, 4093, 198];
    tokens.extend(long_prompt(29, 3));
    let offset = tokens.len() as u32;
    tokens.extend(std::iter::repeat_n(49_151, length as usize));
    tokens.extend([2, 198, 1, 520, 9531, 198]);
    let mut r = greedy(0, tokens, 6);
    r.prompt.media = vec![switchyard_core::MediaSpan {
        modality: switchyard_core::Modality::Image,
        media_hash: hash,
        offset,
        length,
    }];
    if let Some(values) = embeddings {
        r.media_inputs = vec![switchyard_core::protocol::MediaInput::embeddings(
            384, values,
        )];
    }
    r
}

#[test]
fn media_embeddings_take_their_positions_in_the_prefill() {
    let mut gguf = Gguf::open(&model_path()).unwrap();
    let model = Model::load(&mut gguf, false).unwrap();
    let projector = model.media_projector(384).unwrap();
    assert_eq!(projector.dims(), [384, model.shape.hidden]);
    // The same rows give the same embeddings; 257 encoder rows spread over 64 positions.
    let (a, b) = (encoder_rows(257, 1), encoder_rows(257, 2));
    let ea = model.media_embeddings(&projector, &a, 384, 64).unwrap();
    assert_eq!(ea.dims(), [64, model.shape.hidden]);
    let again = model.media_embeddings(&projector, &a, 384, 64).unwrap();
    let diff = |x: &candle_core::Tensor, y: &candle_core::Tensor| {
        (x - y)
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap()
    };
    assert_eq!(diff(&ea, &again), 0.0);
    let eb = model.media_embeddings(&projector, &b, 384, 64).unwrap();
    assert!(diff(&ea, &eb) > 0.1);
    assert!(
        model
            .media_embeddings(&projector, &a[..10], 384, 64)
            .is_err()
    );
    // The last token's logits after a prompt whose middle positions take the embeddings:
    // other embeddings, or none (the placeholders' own), give other logits; the same give
    // the same.
    let prompt: Vec<u32> = (0..80).map(|i| 300 + i * 11).collect();
    let logits = |embeds: Option<&candle_core::Tensor>| {
        let mut kv = switchyard_candle::model::SeqKv::new(&model.shape);
        kv.reserve(prompt.len()).unwrap();
        let out = model
            .forward(&mut [switchyard_candle::model::StepInput {
                tokens: &prompt,
                kv: &mut kv,
                logits: true,
                embeds: embeds.map(|e| vec![(8, e.clone())]).unwrap_or_default(),
                rows: None,
            }])
            .unwrap();
        out[0].clone().unwrap()
    };
    let gap = |x: &[f32], y: &[f32]| {
        x.iter()
            .zip(y)
            .map(|(p, q)| (p - q).abs())
            .fold(0f32, f32::max)
    };
    let (la, la2, lb, plain) = (
        logits(Some(&ea)),
        logits(Some(&ea)),
        logits(Some(&eb)),
        logits(None),
    );
    assert_eq!(gap(&la, &la2), 0.0);
    assert!(gap(&la, &lb) > 0.01, "{}", gap(&la, &lb));
    assert!(gap(&la, &plain) > 0.01, "{}", gap(&la, &plain));
}

#[test]
fn the_engine_merges_media_caches_them_by_hash_and_waits_for_them() {
    let mut e = engine(config());
    let a = encoder_rows(257, 1);
    // With its embeddings: served; the same again comes from the cache. (Its answer may
    // differ from the first in a near tie: a prefill of 6 rows and one of 102 take
    // different matrix products.)
    e.add(with_media(0xA, 64, Some(&a))).unwrap();
    let (first, _) = run(&mut e);
    assert_eq!(first.last().unwrap().finish, Some(FinishReason::Length));
    assert_eq!(of(&first, 0).len(), 6);
    let mut again = with_media(0xA, 64, Some(&a));
    again.id = RequestId(1);
    e.add(again).unwrap();
    let (second, _) = run(&mut e);
    assert_eq!(second[0].cached_tokens, 96);
    // Without embeddings, the cached KV of the same item stands in for them (the same
    // answer as with them, from the same cache); an item whose KV is not here cannot be
    // served without them.
    let mut cached = with_media(0xA, 64, None);
    cached.id = RequestId(2);
    e.add(cached).unwrap();
    let (third, _) = run(&mut e);
    assert_eq!(third[0].cached_tokens, 96);
    assert_eq!(of(&third, 2), of(&second, 1));
    assert!(matches!(
        e.add(with_media(0xB, 64, None)),
        Err(EngineError::Unsupported(m)) if m.contains("embeddings")
    ));
    // Other embeddings under another hash: computed afresh (the text before them cached).
    let mut other = with_media(0xB, 64, Some(&encoder_rows(257, 2)));
    other.id = RequestId(3);
    e.add(other).unwrap();
    let (fourth, _) = run(&mut e);
    assert_eq!(fourth[0].cached_tokens, 32);
    // Embeddings that do not fit the spans are refused.
    let mut ragged = with_media(0xC, 64, Some(&a));
    ragged.media_inputs.push(ragged.media_inputs[0].clone());
    assert!(matches!(e.add(ragged), Err(EngineError::Invalid(_))));

    // Sent ahead of its media: its text is computed and cached, then it waits, idle,
    // while another request is served.
    let mut fresh = engine(config());
    let mut ahead = with_media(0xD, 64, None);
    ahead.id = RequestId(10);
    ahead.media_pending = true;
    fresh.add(ahead).unwrap();
    fresh.add(greedy(11, FRANCE.to_vec(), 4)).unwrap();
    let (tokens, _) = run(&mut fresh);
    assert!(of(&tokens, 10).is_empty());
    assert_eq!(of(&tokens, 11).len(), 4);
    assert!(!fresh.has_work());
    let blocks = blocks_for(&with_media(0xD, 64, None).prompt, 16).unwrap();
    assert_eq!(
        fresh.held_prefix(blocks.sequence_hashes()),
        2,
        "the 32 text tokens before the media are cached, nothing after"
    );
    // Sent again with its embeddings: the text comes from the cache.
    assert!(fresh.cancel(RequestId(10)));
    let mut ready = with_media(0xD, 64, Some(&a));
    ready.id = RequestId(12);
    fresh.add(ready).unwrap();
    let (tokens, _) = run(&mut fresh);
    assert_eq!(tokens[0].cached_tokens, 32);
    assert_eq!(of(&tokens, 12).len(), 6);
}
