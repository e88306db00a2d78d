//! What a request's prompt becomes when its media are encoded smaller or not at all, and
//! the warnings that say so.

use switchyard_core::protocol::Prompt;

use super::Resized;

/// The warning a request answered from its text alone carries (`why`: what failed).
pub fn text_only_warning(why: &str) -> String {
    format!("media not encoded, answered from the text alone: {why}")
}

/// Gives the prompt's media the sizes they were encoded at (see [`Resized`]): each span
/// of a resized item takes its new length (in the placeholder token it had) and hash, the
/// positions after it move. The warning to send with the response, when any was.
pub fn resize_media(prompt: &mut Prompt, resized: &[Resized]) -> Option<String> {
    if resized.is_empty() {
        return None;
    }
    let mut tokens = Vec::with_capacity(prompt.token_ids.len());
    let mut at = 0usize;
    let mut shift = 0i64;
    for span in &mut prompt.media {
        let start = (span.offset as usize).min(prompt.token_ids.len());
        let end = (span.end() as usize).min(prompt.token_ids.len());
        tokens.extend_from_slice(&prompt.token_ids[at.min(start)..start]);
        span.offset = (i64::from(span.offset) + shift) as u32;
        match resized.iter().find(|r| r.from == span.media_hash) {
            Some(r) => {
                let placeholder = prompt.token_ids.get(start).copied().unwrap_or_default();
                tokens.extend(std::iter::repeat_n(placeholder, r.tokens as usize));
                shift += i64::from(r.tokens) - i64::from(span.length);
                span.media_hash = r.to;
                span.length = r.tokens;
            }
            None => tokens.extend_from_slice(&prompt.token_ids[start..end]),
        }
        at = at.max(end);
    }
    tokens.extend_from_slice(&prompt.token_ids[at.min(prompt.token_ids.len())..]);
    prompt.token_ids = tokens;
    Some(resized_warning(resized.len()))
}

/// The warning a request whose media were encoded smaller carries (`n` items).
pub fn resized_warning(n: usize) -> String {
    format!(
        "{n} media item(s) did not fit the encoder's memory and were encoded at half size or less"
    )
}

/// Removes the media's placeholder positions from the prompt: the text alone is left.
pub(super) fn strip_media(prompt: &mut Prompt) {
    let spans = std::mem::take(&mut prompt.media);
    let mut kept = Vec::with_capacity(prompt.token_ids.len());
    let mut at = 0usize;
    for span in &spans {
        let start = (span.offset as usize).min(prompt.token_ids.len());
        let end = (span.end() as usize).min(prompt.token_ids.len());
        kept.extend_from_slice(&prompt.token_ids[at.min(start)..start]);
        at = at.max(end);
    }
    kept.extend_from_slice(&prompt.token_ids[at.min(prompt.token_ids.len())..]);
    prompt.token_ids = kept;
}

#[cfg(test)]
mod tests {
    use switchyard_core::{MediaSpan, Modality};

    use super::*;

    #[test]
    fn stripping_media_leaves_the_text_around_it_in_order() {
        let mut prompt = Prompt::tokens(vec![1, 2, 0, 0, 0, 3, 0, 0, 4]);
        prompt.media = [(2, 3), (6, 2)]
            .into_iter()
            .map(|(offset, length)| MediaSpan {
                modality: Modality::Image,
                media_hash: 9,
                offset,
                length,
            })
            .collect();
        strip_media(&mut prompt);
        assert_eq!(prompt.token_ids, vec![1, 2, 3, 4]);
        assert!(prompt.media.is_empty());
    }

    #[test]
    fn an_item_encoded_smaller_takes_fewer_positions_and_the_rest_moves_up() {
        // Text, a video of 4 positions (hash 7), text, an image of 2 (hash 8), text.
        let mut prompt = Prompt::tokens(vec![1, 2, 0, 0, 0, 0, 3, 5, 5, 4]);
        prompt.media = [(Modality::Video, 7, 2, 4), (Modality::Image, 8, 7, 2)]
            .into_iter()
            .map(|(modality, media_hash, offset, length)| MediaSpan {
                modality,
                media_hash,
                offset,
                length,
            })
            .collect();
        let original = prompt.clone();
        assert!(resize_media(&mut prompt, &[]).is_none());
        assert_eq!(prompt, original);
        let resized = [Resized {
            from: 7,
            to: 70,
            tokens: 2,
        }];
        let warning = resize_media(&mut prompt, &resized).unwrap();
        assert!(warning.contains("1 media item"), "{warning}");
        assert_eq!(prompt.token_ids, vec![1, 2, 0, 0, 3, 5, 5, 4]);
        let spans: Vec<_> = prompt
            .media
            .iter()
            .map(|s| (s.media_hash, s.offset, s.length))
            .collect();
        assert_eq!(spans, vec![(70, 2, 2), (8, 5, 2)]);
        // The image, now: its placeholder token is kept.
        let resized = [Resized {
            from: 8,
            to: 80,
            tokens: 1,
        }];
        resize_media(&mut prompt, &resized).unwrap();
        assert_eq!(prompt.token_ids, vec![1, 2, 0, 0, 3, 5, 4]);
        assert_eq!(prompt.media[1].length, 1);
    }
}
