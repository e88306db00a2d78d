//! Media marks in the rendered chat text, and the prompt they become: each mark replaced
//! by its item's placeholder tokens, with a span carrying the item's hash.

use switchyard_core::MediaSpan;

use super::MediaItem;
use crate::openai::ApiError;

/// Marks where a media item goes in the rendered chat text; a private-use character, which
/// client text cannot smuggle in (it is replaced in client text before rendering).
pub const MEDIA_MARK: char = '\u{E000}';

/// Replaces the media mark in client text, so only the frontend's marks remain.
pub fn unmark(text: &str) -> std::borrow::Cow<'_, str> {
    if text.contains(MEDIA_MARK) {
        std::borrow::Cow::Owned(text.replace(MEDIA_MARK, "\u{FFFD}"))
    } else {
        std::borrow::Cow::Borrowed(text)
    }
}

/// The prompt's tokens and media spans: the text between marks tokenized by `encode`, each
/// mark replaced by its item's placeholder tokens.
pub fn splice(
    text: &str,
    items: &[MediaItem],
    placeholder: u32,
    mut encode: impl FnMut(&str) -> Result<Vec<u32>, ApiError>,
) -> Result<(Vec<u32>, Vec<MediaSpan>), ApiError> {
    let pieces: Vec<&str> = text.split(MEDIA_MARK).collect();
    if pieces.len() != items.len() + 1 {
        return Err(ApiError::invalid_param(
            "messages",
            format!(
                "the chat template kept {} of the request's {} media items",
                pieces.len() - 1,
                items.len()
            ),
        ));
    }
    let mut tokens = Vec::new();
    let mut spans = Vec::with_capacity(items.len());
    for (piece, item) in pieces.iter().zip(items.iter().map(Some).chain([None])) {
        tokens.extend(encode(piece)?);
        if let Some(item) = item {
            spans.push(MediaSpan {
                modality: item.modality,
                media_hash: item.hash,
                offset: tokens.len() as u32,
                length: item.tokens,
            });
            tokens.extend(std::iter::repeat_n(placeholder, item.tokens as usize));
        }
    }
    Ok((tokens, spans))
}

#[cfg(test)]
mod tests {
    use switchyard_core::Modality;

    use super::*;

    fn item(tokens: u32, hash: u64) -> MediaItem {
        MediaItem {
            modality: Modality::Image,
            tokens,
            hash,
            input: None,
        }
    }

    #[test]
    fn marks_become_placeholder_runs_with_spans() {
        let text = format!("ab{MEDIA_MARK}cde{MEDIA_MARK}f");
        let encode = |s: &str| Ok(s.bytes().map(u32::from).collect());
        let (tokens, spans) = splice(&text, &[item(3, 7), item(2, 9)], 0, encode).unwrap();
        assert_eq!(tokens, [97, 98, 0, 0, 0, 99, 100, 101, 0, 0, 102]);
        assert_eq!(
            spans
                .iter()
                .map(|s| (s.offset, s.length, s.media_hash))
                .collect::<Vec<_>>(),
            [(2, 3, 7), (8, 2, 9)]
        );
    }

    #[test]
    fn a_template_that_drops_or_repeats_media_is_refused() {
        let encode = |s: &str| Ok(s.bytes().map(u32::from).collect());
        let dropped = splice("no marks", &[item(3, 7)], 0, encode);
        assert!(dropped.is_err());
        let twice = format!("{MEDIA_MARK}{MEDIA_MARK}");
        assert!(splice(&twice, &[item(3, 7)], 0, encode).is_err());
        assert_eq!(unmark(&format!("x{MEDIA_MARK}y")), "x\u{FFFD}y");
    }
}
