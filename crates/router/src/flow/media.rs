//! A request's media in its life: when a worker's cache can stand in for encoding them.
//!
//! Joint routing sends a request whose media a worker already holds (as KV) to that worker
//! without encoding them, when it is predicted to give the first token soonest
//! ([`crate::RoutingCore::joint_media_choice`]). That works only if the worker computes
//! none of the media's positions: every block up to the last of them must be one it
//! reuses from its cache. An engine reuses only full blocks, and never the one holding the
//! prompt's last token (it computes that token to sample the first output), so media that
//! reach into the last block need their embeddings wherever the request goes.

/// The blocks a worker must hold for media ending at `media_end` (a token position) in a
/// prompt of `prompt_tokens` to be served from its cache; none when no worker can.
pub fn held_blocks(media_end: u64, prompt_tokens: u64, block_size: u32) -> Option<u32> {
    let block_size = u64::from(block_size.max(1));
    let needed = media_end.div_ceil(block_size);
    let reusable = prompt_tokens.saturating_sub(1) / block_size;
    (needed > 0 && needed <= reusable).then(|| u32::try_from(needed).unwrap_or(u32::MAX))
}

/// Where a prompt sent to its worker ahead of its media (still being encoded) stops
/// computing until they are ready: its first media position.
pub fn gate(media: &[switchyard_core::MediaSpan]) -> Option<u32> {
    media.iter().map(|span| span.offset).min()
}

/// Whether a request sent ahead of its media (still being encoded) must wait for them
/// before going to the pair it was routed to: a remote prefill worker hands over a
/// finished prompt, so it needs the media first; a worker that prefills the request itself
/// computes the text before them meanwhile.
pub fn waits_for_media(remote_prefill: bool, media_pending: bool) -> bool {
    remote_prefill && media_pending
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn media_must_end_in_full_blocks_before_the_one_computed_last() {
        // 16-token blocks, a 100-token prompt: blocks 0..=5 full (96 tokens), the last
        // token (99) in the partial block 6.
        assert_eq!(held_blocks(96, 100, 16), Some(6));
        assert_eq!(held_blocks(80, 100, 16), Some(5));
        assert_eq!(held_blocks(97, 100, 16), None, "ends in the partial block");
        // A prompt of exactly 6 blocks: the sixth holds the last token, computed again.
        assert_eq!(held_blocks(96, 96, 16), None);
        assert_eq!(held_blocks(80, 96, 16), Some(5));
        assert_eq!(held_blocks(0, 96, 16), None, "no media");
    }

    #[test]
    fn only_a_remote_prefill_waits_for_pending_media() {
        assert!(waits_for_media(true, true));
        assert!(!waits_for_media(false, true));
        assert!(!waits_for_media(true, false));
    }
}
