//! Constraints compiled over the built-in vocabulary, and the mocker's draws under them.

use proptest::prelude::*;
use switchyard_core::Token;
use switchyard_core::builtin_vocab;

use super::guide::pressure;
use super::*;

fn grammars() -> std::sync::Arc<Grammars> {
    Grammars::builtin().expect("the built-in vocabulary compiles")
}

fn spell(tokens: &[Token]) -> String {
    let vocabulary = Vocabulary::builtin();
    let bytes: Vec<u8> = tokens
        .iter()
        .filter(|&&t| t != vocabulary.eos)
        .flat_map(|&t| vocabulary.tokens[t as usize].clone())
        .collect();
    String::from_utf8(bytes).expect("a constrained answer is UTF-8")
}

/// A whole answer under `constraint` from a stream of uniform draws (`draws` repeats if
/// short): its tokens, ended by the end of the sequence unless `budget` ran out first.
fn answer(constraint: &Constraint, draws: &[(u32, f64, f64)], budget: u32) -> Vec<Token> {
    let mut guide = grammars().guide(constraint).expect("compiles");
    let mut tokens = Vec::new();
    for generated in 0..budget {
        let (plain, close, other) = draws[generated as usize % draws.len()];
        let pick = Pick {
            // Some past the vocabulary: the mocker may draw from a larger one than the
            // constraint's.
            plain: plain % (2 * builtin_vocab::VOCAB_SIZE),
            close,
            other,
            pressure: pressure(generated, budget),
        };
        let token = guide.pick(&pick).expect("a draw under the mask");
        tokens.push(token);
        if token == guide.eos() {
            break;
        }
    }
    tokens
}

const PERSON: &str = r#"{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer","minimum":0},"tags":{"type":"array","items":{"enum":["red","green"]},"minItems":1},"admin":{"type":"boolean"}},"required":["name","age","tags","admin"],"additionalProperties":false}"#;

fn draws() -> impl Strategy<Value = Vec<(u32, f64, f64)>> {
    prop::collection::vec((any::<u32>(), 0.0..1.0f64, 0.0..1.0f64), 1..64)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Every answer under a schema ends within an ordinary budget and is an object the
    /// schema accepts (checked field by field here, not by the grammar).
    #[test]
    fn answers_under_a_schema_end_and_are_valid(draws in draws()) {
        let tokens = answer(&Constraint::JsonSchema(PERSON.into()), &draws, 256);
        prop_assert_eq!(tokens.last(), Some(&builtin_vocab::EOS), "{:?}", spell(&tokens));
        let text = spell(&tokens);
        let value: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| TestCaseError::fail(format!("{text:?}: {e}")))?;
        let object = value.as_object().expect("an object");
        prop_assert_eq!(object.len(), 4);
        prop_assert!(object["name"].is_string());
        // An integer (a long one reads as a double: whole, then).
        let age = &object["age"];
        let whole = age.as_f64().is_some_and(|a| a >= 0.0 && a.fract() == 0.0);
        prop_assert!(age.is_u64() || whole, "age {age}");
        let tags = object["tags"].as_array().expect("tags");
        prop_assert!(!tags.is_empty());
        prop_assert!(tags.iter().all(|t| t == "red" || t == "green"));
        prop_assert!(object["admin"].is_boolean());
    }

    /// JSON mode gives an object; a choice gives one of its strings; a regex what it
    /// matches (checked by hand).
    #[test]
    fn json_mode_choices_and_regexes_are_honoured(draws in draws()) {
        let tokens = answer(&Constraint::JsonObject, &draws, 256);
        prop_assert_eq!(tokens.last(), Some(&builtin_vocab::EOS), "{:?}", spell(&tokens));
        // JSON's grammar, not f64's range: a number may be past what a double holds.
        let text = spell(&tokens);
        serde_json::from_str::<serde::de::IgnoredAny>(&text)
            .map_err(|e| TestCaseError::fail(format!("{text:?}: {e}")))?;
        prop_assert!(text.starts_with('{') && text.ends_with('}'), "{text:?}");

        let choices = vec!["yes".to_owned(), "no".to_owned(), "say \"maybe\"\u{7f}".to_owned()];
        let tokens = answer(&Constraint::Choice(choices.clone()), &draws, 64);
        prop_assert!(choices.contains(&spell(&tokens)), "{:?}", spell(&tokens));

        let tokens = answer(&Constraint::Regex("(yes|no)-[0-9]{2,4}".into()), &draws, 64);
        let text = spell(&tokens);
        let (word, digits) = text.split_once('-').expect("a dash");
        prop_assert!(word == "yes" || word == "no", "{text:?}");
        prop_assert!((2..=4).contains(&digits.len()), "{text:?}");
        prop_assert!(digits.bytes().all(|b| b.is_ascii_digit()), "{text:?}");
    }

    /// A request resumed elsewhere takes the tokens already sent and draws on exactly as
    /// it would have.
    #[test]
    fn a_resumed_guide_draws_what_the_first_would_have(draws in draws(), cut in 0usize..40) {
        let constraint = Constraint::JsonSchema(PERSON.into());
        let whole = answer(&constraint, &draws, 256);
        let cut = cut.min(whole.len() - 1);
        let mut resumed = grammars().guide(&constraint).expect("compiles");
        resumed.take(&whole[..cut]).expect("its own tokens are allowed");
        for (generated, &expected) in whole.iter().enumerate().skip(cut) {
            let (plain, close, other) = draws[generated % draws.len()];
            let pick = Pick {
                // Some past the vocabulary: the mocker may draw from a larger one than the
            // constraint's.
            plain: plain % (2 * builtin_vocab::VOCAB_SIZE),
                close,
                other,
                pressure: pressure(generated as u32, 256),
            };
            prop_assert_eq!(resumed.pick(&pick).expect("draws"), expected);
        }
    }
}

#[test]
fn malformed_constraints_are_named_before_any_token() {
    let invalid = |constraint: Constraint| match check(&constraint) {
        Err(GrammarError::Invalid(message)) => message,
        other => panic!("{constraint:?} gave {other:?}"),
    };
    assert!(invalid(Constraint::Regex("a(b".into())).contains("unclosed group"));
    assert!(invalid(Constraint::JsonSchema(r#"{"type":"foo"}"#.into())).contains("foo"));
    assert!(invalid(Constraint::JsonSchema("{not json".into())).contains("not JSON"));
    assert!(invalid(Constraint::Choice(Vec::new())).contains("empty"));
    assert!(invalid(Constraint::Grammar("start: nowhere".into())).contains("nowhere"));
    let message = invalid(Constraint::JsonSchema(
        r#"{"type":"integer","minimum":5,"maximum":1}"#.into(),
    ));
    assert!(!message.contains('\n'), "one line: {message}");
    for fine in [
        Constraint::JsonObject,
        Constraint::JsonSchema(PERSON.into()),
        Constraint::Regex("[a-z]+".into()),
        Constraint::Choice(vec!["a".into()]),
        Constraint::Grammar("start: \"x\" | \"y\"".into()),
    ] {
        assert_eq!(check(&fine), Ok(()), "{fine:?}");
    }
}

#[test]
fn compiled_constraints_are_cached_and_bounded() {
    let grammars = Grammars::new(&Vocabulary::builtin()).expect("builds");
    let regex = |i: usize| Constraint::Regex(format!("x{i}[0-9]+"));
    grammars.guide(&regex(0)).expect("compiles");
    grammars.guide(&regex(0)).expect("cached");
    assert_eq!(grammars.cached(), 1);
    for i in 0..compile::CACHED + 10 {
        grammars.guide(&regex(i)).expect("compiles");
    }
    assert_eq!(grammars.cached(), compile::CACHED);
}

#[test]
fn tokens_the_constraint_refuses_are_rejected() {
    let mut guide = grammars()
        .guide(&Constraint::Choice(vec!["yes".into()]))
        .expect("compiles");
    assert!(matches!(
        guide.take(&[u32::from(b'n')]),
        Err(GrammarError::Rejected(_))
    ));
    let mut guide = grammars()
        .guide(&Constraint::Choice(vec!["yes".into()]))
        .expect("compiles");
    assert!(!guide.is_accepting());
    guide
        .take(&[u32::from(b'y'), u32::from(b'e'), u32::from(b's')])
        .expect("allowed");
    assert!(guide.is_accepting());
    assert_eq!(guide.allowed().expect("mask"), [builtin_vocab::EOS]);
    // Special tokens never spell text: the start of a sequence is allowed nowhere.
    let mut guide = grammars()
        .guide(&Constraint::Regex(".*".into()))
        .expect("compiles");
    let allowed = guide.allowed().expect("mask");
    assert!(!allowed.contains(&builtin_vocab::BOS));
    assert!(
        allowed.contains(&builtin_vocab::EOS),
        "an empty answer is complete"
    );
}

#[test]
fn pressure_rises_to_one_by_half_the_budget_or_the_soft_budget() {
    assert!(pressure(0, 256) < 0.01);
    assert_eq!(pressure(guide::SOFT_BUDGET - 1, 256), 1.0);
    assert_eq!(pressure(4, 10), 1.0);
    assert!(pressure(1, 10) < pressure(2, 10));
    assert_eq!(pressure(0, 0), 1.0);
}

#[test]
fn smollm2s_vocabulary_marks_its_special_tokens_and_answers_in_it_are_valid() {
    let vocabulary = Vocabulary::smollm2().expect("the built-in tokenizer reads");
    assert_eq!(vocabulary.tokens.len(), 49_152);
    assert_eq!(vocabulary.tokens[2], b"\xFF<|im_end|>");
    assert_eq!(vocabulary.tokens[0], b"\xFF<|endoftext|>");
    let grammars = Grammars::named(switchyard_core::builtin_vocab::smollm2::NAME)
        .expect("a built-in vocabulary")
        .expect("builds");
    for seed in 0..8u32 {
        let mut guide = grammars
            .guide(&Constraint::JsonSchema(PERSON.into()))
            .expect("compiles");
        let mut text = Vec::new();
        for generated in 0..256 {
            let unit =
                |salt: u32| f64::from((seed * 7919 + generated * 104_729 + salt) % 1000) / 1000.0;
            let pick = Pick {
                plain: (seed * 31 + generated * 977) % 32_000,
                close: unit(1),
                other: unit(2),
                pressure: pressure(generated, 256),
            };
            let token = guide.pick(&pick).expect("draws");
            if token == vocabulary.eos {
                break;
            }
            text.extend_from_slice(&vocabulary.tokens[token as usize]);
        }
        let text = String::from_utf8(text).expect("UTF-8");
        let value: serde_json::Value = serde_json::from_str(&text).expect("JSON");
        assert_eq!(value.as_object().map(|o| o.len()), Some(4), "{text}");
    }
    assert!(Grammars::named("another-model").is_none());
}

#[test]
fn a_tokenizer_json_is_named_by_what_its_tokens_spell() {
    let smollm2 = switchyard_core::builtin_vocab::smollm2::TOKENIZER;
    let read = Vocabulary::from_tokenizer_json(smollm2, 2).expect("reads");
    assert_eq!(
        Some(read.name.clone()),
        vocab::name_of_tokenizer_json(smollm2)
    );
    assert!(read.name.starts_with("xxh3:"), "{}", read.name);
    assert_eq!(read.tokens, Vocabulary::smollm2().expect("reads").tokens);
    // One token spelled differently is another vocabulary.
    let mut other = read.tokens.clone();
    other[100].push(b'x');
    assert_ne!(vocab::fingerprint(&other), read.name);
    assert!(Vocabulary::from_tokenizer_json(smollm2, 1 << 20).is_err());
    assert!(Vocabulary::from_tokenizer_json("{", 2).is_err());
}

#[test]
fn masked_logits_keep_only_what_the_constraint_allows() {
    let mut guide = grammars()
        .guide(&Constraint::Choice(vec!["ab".into(), "b".into()]))
        .expect("compiles");
    let mut logits = vec![1.0f32; builtin_vocab::VOCAB_SIZE as usize + 8];
    guide.mask_logits(&mut logits).expect("masks");
    let kept: Vec<usize> = (0..logits.len())
        .filter(|&t| logits[t].is_finite())
        .collect();
    assert_eq!(kept, [usize::from(b'a'), usize::from(b'b')]);
    guide.take(&[u32::from(b'b')]).expect("allowed");
    let mut logits = vec![1.0f32; 300];
    guide.mask_logits(&mut logits).expect("masks");
    let kept: Vec<usize> = (0..logits.len())
        .filter(|&t| logits[t].is_finite())
        .collect();
    assert_eq!(
        kept,
        [builtin_vocab::EOS as usize],
        "complete: only the end"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]

    /// At every step of an answer under a schema, the logits left finite are exactly the
    /// tokens the guide allows (those the buffer holds: longer buffers lose their tail,
    /// shorter ones keep their allowed tokens).
    #[test]
    fn masked_logits_are_the_allowed_tokens_at_every_step(draws in draws(), extra in -40i64..40) {
        let constraint = Constraint::JsonSchema(PERSON.into());
        let tokens = answer(&constraint, &draws, 64);
        let mut guide = grammars().guide(&constraint).expect("compiles");
        let size = (i64::from(builtin_vocab::VOCAB_SIZE) + extra) as usize;
        for &token in &tokens {
            let mut logits = vec![0.5f32; size];
            guide.mask_logits(&mut logits).expect("masks");
            let kept: Vec<u32> = (0..size as u32).filter(|&t| logits[t as usize].is_finite()).collect();
            let allowed: Vec<u32> = guide.allowed().expect("allowed").into_iter().filter(|&t| (t as usize) < size).collect();
            prop_assert_eq!(kept, allowed);
            if token == guide.eos() {
                break;
            }
            guide.take(&[token]).expect("taken");
        }
    }
}

#[test]
fn a_model_directory_gives_its_vocabulary_and_end_of_sequence_token() {
    let fixtures =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../frontend/tests/fixtures");
    // `eos_token` as a string (ChatML: `<|im_end|>`, an added token) and as an object
    // (Llama: `</s>`, a piece of the model's vocabulary).
    for (model, eos) in [("chatml-bpe", 323), ("llama-spm", 2)] {
        let dir = fixtures.join(model);
        let read = Vocabulary::from_model_dir(&dir).expect("reads");
        assert_eq!(read.eos, eos, "{model}");
        let tokenizer = std::fs::read_to_string(dir.join("tokenizer.json")).unwrap();
        assert_eq!(
            Some(read.name.clone()),
            vocab::name_of_tokenizer_json(&tokenizer)
        );
        let grammars = Grammars::new(&read).expect("compiles");
        let mut guide = grammars
            .guide(&Constraint::Choice(vec!["yes".into()]))
            .unwrap();
        assert!(!guide.allowed().unwrap().is_empty());
    }
    // Without `eos_token`: the first `eos_token_id` of generation_config.json, then
    // config.json's.
    let dir = tempfile::tempdir().unwrap();
    let copy = |name: &str| {
        std::fs::copy(
            fixtures.join("chatml-bpe").join(name),
            dir.path().join(name),
        )
        .unwrap();
    };
    copy("tokenizer.json");
    let write = |name: &str, text: &str| std::fs::write(dir.path().join(name), text).unwrap();
    write("config.json", r#"{"eos_token_id": 321}"#);
    assert_eq!(Vocabulary::from_model_dir(dir.path()).unwrap().eos, 321);
    write("generation_config.json", r#"{"eos_token_id": [322, 321]}"#);
    assert_eq!(Vocabulary::from_model_dir(dir.path()).unwrap().eos, 322);
    // An end token the tokenizer lacks, none at all, a broken file, no tokenizer: each
    // is an error naming the file.
    write("tokenizer_config.json", r#"{"eos_token": "<|nope|>"}"#);
    let error = Vocabulary::from_model_dir(dir.path()).unwrap_err();
    assert!(error.contains("`<|nope|>` is not a token"), "{error}");
    write("tokenizer_config.json", "{}");
    std::fs::remove_file(dir.path().join("config.json")).unwrap();
    std::fs::remove_file(dir.path().join("generation_config.json")).unwrap();
    let error = Vocabulary::from_model_dir(dir.path()).unwrap_err();
    assert!(error.contains("names no end-of-sequence token"), "{error}");
    write("config.json", "{");
    let error = Vocabulary::from_model_dir(dir.path()).unwrap_err();
    assert!(error.contains("config.json"), "{error}");
    let error = Vocabulary::from_model_dir(&dir.path().join("absent")).unwrap_err();
    assert!(error.contains("tokenizer.json"), "{error}");
}
