#![allow(clippy::unwrap_used)]
//! Hugging Face model directories: the fixtures under tests/fixtures (written by
//! tests/fixtures/generate.py) are a Qwen2-style byte-level BPE with a ChatML template and a
//! Llama-2-style SentencePiece BPE with byte fallback and the Llama-2 template.

use std::path::PathBuf;
use std::sync::LazyLock;

use proptest::prelude::*;
use switchyard_frontend::preprocess::{ChatMessage, PreprocessError, Preprocessor};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// Loaded once: the property tests would otherwise parse the fixture for every case.
fn chatml() -> &'static Preprocessor {
    static CHATML: LazyLock<Preprocessor> =
        LazyLock::new(|| Preprocessor::from_dir(&fixture("chatml-bpe"), None).unwrap());
    &CHATML
}

fn llama() -> &'static Preprocessor {
    static LLAMA: LazyLock<Preprocessor> =
        LazyLock::new(|| Preprocessor::from_dir(&fixture("llama-spm"), None).unwrap());
    &LLAMA
}

/// The fixture's own tokenizer, straight from the `tokenizers` crate, to look ids up.
fn id(model: &str, token: &str) -> u32 {
    let path = fixture(model).join("tokenizer.json");
    tokenizers::Tokenizer::from_file(path)
        .unwrap()
        .token_to_id(token)
        .unwrap()
}

/// Pushes every token and finishes; returns the pieces (the last one from `finish`).
fn stream(preprocessor: &Preprocessor, tokens: &[u32]) -> Vec<String> {
    stream_keeping(preprocessor, tokens, None)
}

/// [`stream`], with the special tokens `keep` says decoded as text.
fn stream_keeping(
    preprocessor: &Preprocessor,
    tokens: &[u32],
    keep: Option<Vec<u32>>,
) -> Vec<String> {
    let mut decoder = preprocessor.decoder_keeping_special(keep);
    let mut pieces: Vec<String> = tokens.iter().map(|&t| decoder.push(t).unwrap()).collect();
    pieces.push(decoder.finish());
    pieces
}

const REPLACEMENT: char = char::REPLACEMENT_CHARACTER;

#[test]
fn chatml_model_facts() {
    let preprocessor = chatml();
    let (endoftext, im_end) = (
        id("chatml-bpe", "<|endoftext|>"),
        id("chatml-bpe", "<|im_end|>"),
    );
    assert_eq!(preprocessor.vocab_size(), im_end + 1);
    // tokenizer_config's eos first, then generation_config's other one.
    assert_eq!(preprocessor.eos_token_ids(), &[im_end, endoftext]);
    assert_eq!(preprocessor.context_length(), 32_768);
    assert!(preprocessor.is_special_token(im_end) && !preprocessor.is_special_token(b'a'.into()));
}

#[test]
fn chatml_template_strips_content_and_adds_a_default_system_prompt() {
    let preprocessor = chatml();
    let with_system = [
        ChatMessage::new("system", "  Be brief. \n"),
        ChatMessage::new("user", "Hi "),
    ];
    assert_eq!(
        preprocessor.render_chat(&with_system).unwrap(),
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n\
         <|im_start|>assistant\n"
    );
    let conversation = [
        ChatMessage::new("user", "Hello"),
        ChatMessage::new("assistant", "Hi!"),
        ChatMessage::new("user", "Bye"),
    ];
    assert_eq!(
        preprocessor.render_chat(&conversation).unwrap(),
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n\
         <|im_start|>assistant\nHi!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n"
    );
}

#[test]
fn chatml_template_rejections_carry_the_templates_message() {
    let preprocessor = chatml();
    let tool = [ChatMessage::new("user", "x"), ChatMessage::new("tool", "y")];
    match preprocessor.render_chat(&tool) {
        Err(PreprocessError::TemplateRaised(message)) => {
            assert_eq!(message, "Unsupported role: tool")
        }
        other => panic!("expected TemplateRaised, got {other:?}"),
    }
    let assistant_first = [ChatMessage::new("assistant", "x")];
    let error = preprocessor.render_chat(&assistant_first).unwrap_err();
    assert_eq!(
        error.to_string(),
        "The first message after the system prompt must come from the user"
    );
}

#[test]
fn chatml_encode_keeps_template_special_tokens_and_adds_none() {
    let preprocessor = chatml();
    let prompt = preprocessor
        .render_chat(&[ChatMessage::new("user", "Hello world")])
        .unwrap();
    let tokens = preprocessor.encode(&prompt).unwrap();
    let im_start = id("chatml-bpe", "<|im_start|>");
    assert_eq!(tokens.first(), Some(&im_start));
    assert_eq!(tokens.iter().filter(|&&t| t == im_start).count(), 3);
    // Merged words are single tokens.
    let hello_world = preprocessor.encode("Hello world").unwrap();
    assert_eq!(
        hello_world,
        [id("chatml-bpe", "Hello"), id("chatml-bpe", "Ġworld")]
    );
    // Decoding skips the special tokens.
    assert_eq!(
        preprocessor.decode(&tokens).unwrap(),
        "system\nYou are a helpful assistant.\nuser\nHello world\nassistant\n"
    );
    // A byte-level post-processor adds nothing to plain prompts either.
    assert_eq!(
        preprocessor
            .encode_completion_prompt("Hello world")
            .unwrap(),
        hello_world
    );
}

#[test]
fn chatml_stream_holds_characters_split_across_tokens() {
    let preprocessor = chatml();
    let text = "Hello 日本 😀 café";
    let tokens = preprocessor.encode(text).unwrap();
    // 日 and 😀 each span more than one token in this vocabulary.
    assert!(tokens.len() < text.len() && tokens.len() > text.chars().count() / 2);
    let pieces = stream(preprocessor, &tokens);
    assert!(
        pieces.iter().all(|piece| !piece.contains(REPLACEMENT)),
        "{pieces:?}"
    );
    assert!(
        pieces.iter().any(String::is_empty),
        "some token must wait for its character"
    );
    assert_eq!(pieces.concat(), text);
    assert_eq!(pieces.last().map(String::as_str), Some(""));
}

#[test]
fn chatml_stream_skips_special_tokens() {
    let preprocessor = chatml();
    let (im_start, im_end) = (
        id("chatml-bpe", "<|im_start|>"),
        id("chatml-bpe", "<|im_end|>"),
    );
    let mut tokens = vec![im_start];
    tokens.extend(preprocessor.encode("Hello world").unwrap());
    tokens.push(im_end);
    assert_eq!(
        stream(preprocessor, &tokens),
        ["", "Hello", " world", "", ""]
    );
}

#[test]
fn unknown_ids_are_errors_in_decode_and_stream() {
    let preprocessor = chatml();
    let beyond = preprocessor.vocab_size();
    assert!(matches!(
        preprocessor.decode(&[b'a'.into(), beyond]),
        Err(PreprocessError::UnknownToken { id, .. }) if id == beyond
    ));
    let mut decoder = preprocessor.decoder();
    assert!(decoder.push(beyond).is_err());
    assert_eq!(decoder.push(b'a'.into()).unwrap(), "a");
}

#[test]
fn a_long_run_of_invalid_bytes_is_released_before_the_end() {
    // 0xFF never occurs in UTF-8: a model emitting it forever must not stall the stream.
    let preprocessor = chatml();
    let tokens = vec![0xFF_u32; 300];
    let pieces = stream(preprocessor, &tokens);
    let before_finish: usize = pieces[..300].iter().map(|p| p.chars().count()).sum();
    assert!(
        before_finish >= 300 - 64,
        "only {before_finish} released before finish"
    );
    assert_eq!(pieces.concat(), REPLACEMENT.to_string().repeat(300));
    assert_eq!(pieces.concat(), preprocessor.decode(&tokens).unwrap());
}

#[test]
fn llama_model_facts() {
    let preprocessor = llama();
    assert_eq!(preprocessor.eos_token_ids(), &[2]);
    // config.json's max_position_embeddings; tokenizer_config's 1e30 sentinel is no limit.
    assert_eq!(preprocessor.context_length(), 4096);
    assert_eq!(preprocessor.vocab_size(), 369);
}

#[test]
fn llama_template_renders_the_system_block_and_turn_tokens() {
    let messages = [
        ChatMessage::new("system", "Be nice."),
        ChatMessage::new("user", " Hi "),
        ChatMessage::new("assistant", "Hello"),
        ChatMessage::new("user", "Bye"),
    ];
    assert_eq!(
        llama().render_chat(&messages).unwrap(),
        // `.strip()` applies to the whole first turn, system block included.
        "<s>[INST] <<SYS>>\nBe nice.\n<</SYS>>\n\n Hi [/INST] Hello </s><s>[INST] Bye [/INST]"
    );
}

#[test]
fn llama_template_rejects_roles_that_do_not_alternate() {
    let messages = [ChatMessage::new("user", "a"), ChatMessage::new("user", "b")];
    match llama().render_chat(&messages) {
        Err(PreprocessError::TemplateRaised(message)) => {
            assert_eq!(
                message,
                "Conversation roles must alternate user/assistant/user/assistant/..."
            );
        }
        other => panic!("expected TemplateRaised, got {other:?}"),
    }
}

#[test]
fn llama_bos_comes_from_the_template_for_chats_and_from_the_config_for_plain_prompts() {
    let preprocessor = llama();
    let prompt = preprocessor
        .render_chat(&[ChatMessage::new("user", "Hello")])
        .unwrap();
    let chat = preprocessor.encode(&prompt).unwrap();
    assert_eq!(chat.first(), Some(&1));
    assert_eq!(
        chat.iter().filter(|&&t| t == 1).count(),
        1,
        "one BOS, from the template"
    );

    let plain = preprocessor.encode("Hello world").unwrap();
    assert_eq!(
        plain,
        [id("llama-spm", "▁Hello"), id("llama-spm", "▁world")]
    );
    let completion = preprocessor
        .encode_completion_prompt("Hello world")
        .unwrap();
    assert_eq!(completion, [&[1][..], &plain].concat());
    // A prompt that writes its own BOS does not get a second.
    let explicit = preprocessor.encode_completion_prompt("<s>Hello").unwrap();
    assert_eq!(explicit.iter().filter(|&&t| t == 1).count(), 1);
}

#[test]
fn llama_stream_keeps_word_boundary_spaces() {
    let preprocessor = llama();
    let tokens = preprocessor.encode("Hello world, the test").unwrap();
    let pieces = stream(preprocessor, &tokens);
    assert_eq!(pieces.first().map(String::as_str), Some("Hello"));
    assert!(pieces.contains(&" world".to_owned()), "{pieces:?}");
    assert_eq!(pieces.concat(), "Hello world, the test");
}

#[test]
fn llama_stream_assembles_byte_fallback_characters() {
    let preprocessor = llama();
    // None of these characters is in the vocabulary: each is 2 to 4 byte tokens.
    let text = "Hello é 日本 😀";
    let tokens = preprocessor.encode(text).unwrap();
    assert!(tokens.contains(&id("llama-spm", "<0xF0>")));
    let pieces = stream(preprocessor, &tokens);
    assert!(
        pieces.iter().all(|piece| !piece.contains(REPLACEMENT)),
        "{pieces:?}"
    );
    assert_eq!(pieces.concat(), text);
    assert_eq!(preprocessor.decode(&tokens).unwrap(), text);
}

/// Ids of the byte-level fixture: bytes (all of 0..256 are byte tokens there), merged tokens
/// and the three special tokens.
fn chatml_token() -> impl Strategy<Value = u32> {
    prop_oneof![
        4 => 0u32..256,
        2 => 0x80u32..0x100,
        2 => 256u32..321,
        1 => 321u32..324,
    ]
}

/// Text mixing ASCII words, spaces and characters of 2 to 4 bytes (some in the vocabulary).
fn mixed_text() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        Just("Hello".to_owned()),
        Just(" world".to_owned()),
        Just(" ".to_owned()),
        Just("  ".to_owned()),
        Just("\n".to_owned()),
        Just("é".to_owned()),
        Just("日本".to_owned()),
        Just("😀".to_owned()),
        "[a-z]{1,6}",
        any::<char>().prop_map(String::from),
    ];
    prop::collection::vec(piece, 0..16).prop_map(|pieces| pieces.concat())
}

fn check_stream(preprocessor: &Preprocessor, tokens: &[u32]) -> Result<String, TestCaseError> {
    let full = preprocessor.decode(tokens).unwrap();
    let mut decoder = preprocessor.decoder();
    let mut emitted = String::new();
    for &token in tokens {
        emitted.push_str(&decoder.push(token).unwrap());
        prop_assert!(
            full.starts_with(&emitted),
            "{:?} is not a prefix of {:?}",
            emitted,
            full
        );
    }
    emitted.push_str(&decoder.finish());
    prop_assert_eq!(&emitted, &full);
    Ok(emitted)
}

proptest! {
    #[test]
    fn chatml_streamed_pieces_add_up_to_the_full_decode(
        tokens in prop::collection::vec(chatml_token(), 0..48),
    ) {
        check_stream(chatml(), &tokens)?;
    }

    #[test]
    fn chatml_valid_text_streams_without_replacement_characters(text in mixed_text()) {
        let preprocessor = chatml();
        let tokens = preprocessor.encode(&text).unwrap();
        let mut decoder = preprocessor.decoder();
        for &token in &tokens {
            let piece = decoder.push(token).unwrap();
            prop_assert!(!piece.contains(REPLACEMENT) || text.contains(REPLACEMENT), "{:?}", piece);
        }
        prop_assert!(!decoder.finish().contains(REPLACEMENT) || text.contains(REPLACEMENT));
        check_stream(preprocessor, &tokens)?;
    }

    #[test]
    fn llama_streamed_pieces_of_encoded_text_add_up_to_the_full_decode(text in mixed_text()) {
        let preprocessor = llama();
        let tokens = preprocessor.encode(&text).unwrap();
        let mut decoder = preprocessor.decoder();
        for &token in &tokens {
            let piece = decoder.push(token).unwrap();
            prop_assert!(!piece.contains(REPLACEMENT) || text.contains(REPLACEMENT), "{:?}", piece);
        }
        check_stream(preprocessor, &tokens)?;
    }
}

#[test]
fn special_tokens_are_text_when_kept_except_the_ones_that_end_the_answer() {
    let preprocessor = chatml();
    let (im_start, im_end) = (
        id("chatml-bpe", "<|im_start|>"),
        id("chatml-bpe", "<|im_end|>"),
    );
    let hello = preprocessor.encode("hello é").unwrap();
    let mut tokens = vec![im_start];
    tokens.extend(&hello);
    tokens.push(im_start);
    tokens.push(im_end);
    let decode = |keep| stream_keeping(preprocessor, &tokens, keep).concat();
    assert_eq!(decode(None), "hello é");
    assert_eq!(
        decode(Some(vec![im_end])),
        "<|im_start|>hello é<|im_start|>"
    );
    assert_eq!(
        decode(Some(Vec::new())),
        "<|im_start|>hello é<|im_start|><|im_end|>"
    );
}
