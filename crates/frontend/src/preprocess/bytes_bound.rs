//! How few tokens a text of some length can possibly take, known before tokenizing it: a
//! prompt that cannot fit the context at any tokenization is refused from its length
//! alone, and a 10 MB prompt costs nothing to refuse.
//!
//! A token stands for at most `longest` bytes of input ([`longest_token`]): the longest
//! entry of the model's vocabulary, in characters for a byte-level vocabulary (each stands
//! for one byte), else in bytes (SentencePiece's `▁` and `<0x..>` are longer than what they
//! stand for); an added token's text, in bytes. A
//! normalizer may first shrink the text: composition (NFC, NFKC) shrinks it by at most 3
//! (three Hangul jamo of 3 bytes each to one syllable of 3), so with a normalizer the bound
//! divides by [`SLACK`] times `longest`. Tokenizers that may drop input outright (a whitespace
//! pre-tokenizer, a `Strip` or BERT normalizer, a split that removes what it matches, a
//! replacement by nothing) get no bound.

use serde_json::Value;

/// The most input bytes one token stands for (see the module's documentation).
pub fn longest_token(tokenizer_json: &Value, tokenizer: &tokenizers::Tokenizer) -> usize {
    let byte_level = tokenizer_json
        .get("pre_tokenizer")
        .is_some_and(|p| p.to_string().contains("\"ByteLevel\""));
    let model = tokenizer.get_vocab(false).into_keys().map(|entry| {
        if byte_level {
            entry.chars().count()
        } else {
            entry.len()
        }
    });
    let added = tokenizer
        .get_added_tokens_decoder()
        .into_values()
        .map(|token| token.content.len());
    model.chain(added).max().unwrap_or(1)
}

/// What a normalizer may shrink a text by, with room.
pub const SLACK: u64 = 4;

/// The most bytes one token can stand for, as a divisor: the longest token (`SLACK`
/// times that with a normalizer), when `tokenizer_json`'s normalizer and pre-tokenizer
/// drop nothing.
pub fn bytes_per_token(tokenizer_json: &Value, longest: usize) -> Option<u64> {
    let keeps = |key: &str, allowed: &[&str]| match tokenizer_json.get(key) {
        None | Some(Value::Null) => true,
        Some(part) => keeps_all(part, allowed),
    };
    let normalizers = [
        "NFC", "NFD", "NFKC", "NFKD", "Prepend", "Replace", "Sequence",
    ];
    let pre_tokenizers = [
        "ByteLevel",
        "Metaspace",
        "Split",
        "Digits",
        "Punctuation",
        "UnicodeScripts",
        "Sequence",
    ];
    let normalized = tokenizer_json
        .get("normalizer")
        .is_some_and(|n| !n.is_null());
    let slack = if normalized { SLACK } else { 1 };
    (keeps("normalizer", &normalizers) && keeps("pre_tokenizer", &pre_tokenizers))
        .then(|| slack * longest.max(1) as u64)
}

/// Whether a normalizer or pre-tokenizer (and every part of a sequence of them) is of an
/// allowed type and removes no text.
fn keeps_all(part: &Value, allowed: &[&str]) -> bool {
    let kind = part.get("type").and_then(Value::as_str).unwrap_or_default();
    if !allowed.contains(&kind) {
        return false;
    }
    let removes = match kind {
        "Split" => part.get("behavior").and_then(Value::as_str) == Some("Removed"),
        // A replacement shorter than what it replaces shrinks the text by any factor.
        "Replace" => {
            let pattern = part.get("pattern").and_then(|p| p.get("String"));
            let content = part
                .get("content")
                .and_then(Value::as_str)
                .unwrap_or_default();
            pattern
                .and_then(Value::as_str)
                .is_none_or(|pattern| content.is_empty() || content.len() < pattern.len())
        }
        _ => false,
    };
    let inner = ["normalizers", "pretokenizers"]
        .iter()
        .filter_map(|key| part.get(*key).and_then(Value::as_array))
        .flatten()
        .all(|p| keeps_all(p, allowed));
    !removes && inner
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_tokenizers_that_drop_nothing_get_a_bound() {
        let byte_level = json!({"normalizer": null, "pre_tokenizer": {"type": "Sequence",
            "pretokenizers": [{"type": "Split", "behavior": "Isolated"}, {"type": "ByteLevel"}]}});
        assert_eq!(bytes_per_token(&byte_level, 16), Some(16));
        let spm = json!({"normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "▁"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]}});
        assert_eq!(bytes_per_token(&spm, 10), Some(40));
        for dropping in [
            json!({"pre_tokenizer": {"type": "Whitespace"}}),
            json!({"pre_tokenizer": {"type": "Split", "behavior": "Removed"}}),
            json!({"normalizer": {"type": "Strip"}}),
            json!({"normalizer": {"type": "BertNormalizer"}}),
            json!({"normalizer": {"type": "Sequence", "normalizers": [
                {"type": "NFC"}, {"type": "Replace", "pattern": {"String": " "}, "content": ""}]}}),
            json!({"normalizer": {"type": "Replace", "pattern": {"String": "    "}, "content": " "}}),
            json!({"normalizer": {"type": "Replace", "pattern": {"Regex": " +"}, "content": " "}}),
            json!({"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "ByteLevel"}, {"type": "WhitespaceSplit"}]}}),
        ] {
            assert_eq!(bytes_per_token(&dropping, 16), None, "{dropping}");
        }
    }
}
