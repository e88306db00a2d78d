#![allow(clippy::unwrap_used)]
//! The built-in preprocessor: byte-level tokenizer, word ids, simple template, and incremental
//! decoding checked against the whole-sequence decode.

use proptest::prelude::*;
use switchyard_frontend::preprocess::{
    BUILTIN_BOS, BUILTIN_EOS, BUILTIN_VOCAB_SIZE, ChatMessage, PreprocessError, Preprocessor,
};

fn builtin() -> Preprocessor {
    Preprocessor::builtin(4096)
}

/// Pushes every token, then finishes; returns the pieces (the last one from `finish`).
fn stream(preprocessor: &Preprocessor, tokens: &[u32]) -> Vec<String> {
    let mut decoder = preprocessor.decoder();
    let mut pieces: Vec<String> = tokens.iter().map(|&t| decoder.push(t).unwrap()).collect();
    pieces.push(decoder.finish());
    pieces
}

#[test]
fn simple_template_renders_each_message_then_the_assistant_prompt() {
    let messages = [
        ChatMessage::new("system", "You are terse."),
        ChatMessage::new("user", "Hi\nthere"),
        ChatMessage::new("assistant", "Hello."),
        ChatMessage::new("user", "Bye"),
    ];
    assert_eq!(
        builtin().render_chat(&messages).unwrap(),
        "<|system|>\nYou are terse.\n<|user|>\nHi\nthere\n<|assistant|>\nHello.\n<|user|>\nBye\n\
         <|assistant|>\n"
    );
    assert_eq!(builtin().render_chat(&[]).unwrap(), "<|assistant|>\n");
}

#[test]
fn the_template_markers_are_plain_bytes() {
    let preprocessor = builtin();
    let prompt = preprocessor
        .render_chat(&[ChatMessage::new("user", "é")])
        .unwrap();
    let tokens = preprocessor.encode(&prompt).unwrap();
    assert_eq!(tokens, prompt.bytes().map(u32::from).collect::<Vec<_>>());
    assert!(tokens.iter().all(|&t| t < 256));
    assert_eq!(preprocessor.decode(&tokens).unwrap(), prompt);
    assert_eq!(
        preprocessor.encode_completion_prompt(&prompt).unwrap(),
        tokens
    );
}

#[test]
fn word_ids_decode_to_words_with_a_leading_space() {
    let preprocessor = builtin();
    assert_eq!(
        preprocessor.decode(&[258, 259, 260]).unwrap(),
        " the of and"
    );
    assert_eq!(preprocessor.decode(&[72, 105, 258]).unwrap(), "Hi the");
    let last = preprocessor.decode(&[BUILTIN_VOCAB_SIZE - 1]).unwrap();
    assert!(
        last.starts_with(' ') && last[1..].bytes().all(|b| b.is_ascii_lowercase()),
        "{last:?}"
    );
}

#[test]
fn special_tokens_decode_to_nothing_and_eos_stops() {
    let preprocessor = builtin();
    assert_eq!(
        preprocessor
            .decode(&[BUILTIN_BOS, 104, 105, BUILTIN_EOS])
            .unwrap(),
        "hi"
    );
    assert_eq!(preprocessor.eos_token_ids(), &[BUILTIN_EOS]);
    assert_eq!((BUILTIN_BOS, BUILTIN_EOS), (256, 257));
    assert_eq!(preprocessor.vocab_size(), 32_000);
    assert_eq!(preprocessor.context_length(), 4096);
}

#[test]
fn ids_outside_the_vocabulary_are_errors_that_leave_the_decoder_intact() {
    let preprocessor = builtin();
    let error = preprocessor.decode(&[104, 32_000]).unwrap_err();
    assert!(matches!(
        error,
        PreprocessError::UnknownToken {
            id: 32_000,
            vocab_size: 32_000
        }
    ));
    assert_eq!(
        error.to_string(),
        "token id 32000 is not in the vocabulary (size 32000)"
    );

    let mut decoder = preprocessor.decoder();
    assert_eq!(decoder.push(0xC3).unwrap(), "");
    assert!(decoder.push(u32::MAX).is_err());
    assert_eq!(decoder.push(0xA9).unwrap(), "é");
}

#[test]
fn a_multi_byte_character_comes_out_with_its_last_byte() {
    let pieces = stream(&builtin(), &[0xF0, 0x9F, 0x98, 0x80, b'!'.into()]);
    assert_eq!(pieces, ["", "", "", "😀", "!", ""]);
}

#[test]
fn an_unfinished_character_becomes_a_replacement_at_the_end() {
    let pieces = stream(&builtin(), &[b'a'.into(), 0xE2, 0x82]);
    assert_eq!(pieces, ["a", "", "", "\u{FFFD}"]);
}

#[test]
fn mocker_style_output_reads_as_words() {
    // The mocker draws ids uniformly; nearly all are word ids.
    let preprocessor = builtin();
    let tokens: Vec<u32> = (0..200u32)
        .map(|i| (i * 7919 + 13) % BUILTIN_VOCAB_SIZE)
        .collect();
    let text = stream(&preprocessor, &tokens).concat();
    let words = text
        .split(' ')
        .filter(|w| w.bytes().all(|b| b.is_ascii_lowercase()))
        .count();
    assert!(words > 190, "{text}");
}

/// Token ids weighted like the interesting cases: bytes (ASCII, lead, continuation and
/// never-valid), the two specials and words.
fn any_token() -> impl Strategy<Value = u32> {
    prop_oneof![
        4 => 0u32..256,
        2 => 0x80u32..0x100,
        1 => Just(BUILTIN_BOS),
        1 => Just(BUILTIN_EOS),
        2 => 258u32..BUILTIN_VOCAB_SIZE,
    ]
}

proptest! {
    #[test]
    fn encode_then_decode_is_the_identity(text in any::<String>()) {
        let preprocessor = builtin();
        let tokens = preprocessor.encode(&text).unwrap();
        prop_assert_eq!(tokens.len(), text.len());
        prop_assert_eq!(preprocessor.decode(&tokens).unwrap(), text);
    }

    #[test]
    fn streamed_pieces_add_up_to_the_full_decode(tokens in prop::collection::vec(any_token(), 0..64)) {
        let preprocessor = builtin();
        let full = preprocessor.decode(&tokens).unwrap();
        let mut decoder = preprocessor.decoder();
        let mut emitted = String::new();
        for &token in &tokens {
            emitted.push_str(&decoder.push(token).unwrap());
            // Nothing emitted is ever taken back or changed.
            prop_assert!(full.starts_with(&emitted), "{:?} is not a prefix of {:?}", emitted, full);
        }
        emitted.push_str(&decoder.finish());
        prop_assert_eq!(emitted, full);
    }

    #[test]
    fn valid_text_streams_without_replacements_and_without_delay(text in any::<String>()) {
        let preprocessor = builtin();
        let mut decoder = preprocessor.decoder();
        let mut emitted = String::new();
        for (i, byte) in text.bytes().enumerate() {
            let piece = decoder.push(byte.into()).unwrap();
            let replacement = char::REPLACEMENT_CHARACTER;
            prop_assert!(!piece.contains(replacement) || text.contains(replacement));
            emitted.push_str(&piece);
            // Each character comes out with its last byte, not later.
            let pushed = i + 1;
            let complete = (0..=pushed).rev().find(|&end| text.is_char_boundary(end)).unwrap();
            prop_assert_eq!(emitted.len(), complete);
        }
        prop_assert_eq!(decoder.finish(), "");
        prop_assert_eq!(emitted, text);
    }
}
