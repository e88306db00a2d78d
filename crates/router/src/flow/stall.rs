//! When a stream that gets no token counts as failed, and whose failure it is.
//!
//! - The first token is due within `first_token_timeout`, extended by the time the
//!   worker's timing model says the prefill already queued there takes (at most the
//!   timeout again): a slow engine with prompts queued is not a hung one, and a wrong
//!   model cannot hide a hang for long.
//! - Later tokens are due within the worker's stall timeout. When it passes while the
//!   worker still has prefill queued (a burst of prompts, such as requests moved to it from
//!   a failed worker, holds its decodes back), the stream waits as long as that is
//!   predicted to take, up to the first-token timeout since its last token.
//! - A stream that waited in vain fails. The worker **hangs** when it produced no token on
//!   any stream for at least half that wait; else only this stream is **stalled**. Half,
//!   not all of it: when a worker freezes, its streams' last tokens arrive a few
//!   milliseconds apart, so every stream but the last would find another stream's token
//!   inside its own wait and count a stall, and enough stalls would take the worker out
//!   before the last stream reports the hang. A live worker's other streams get tokens
//!   every decode step, far inside half a stall timeout (a second at least).

use std::time::Duration;

use crate::routing::health::Failure;

/// How long a request may wait for its first token on a worker with `queued_prefill`
/// predicted ahead of it there.
pub fn first_token_wait(first_token_timeout: Duration, queued_prefill: Duration) -> Duration {
    first_token_timeout + queued_prefill.min(first_token_timeout)
}

/// The stall timeout passed `since_last_token` after the stream's last token: how much
/// longer it waits for the prefill queued on its worker (`queued_prefill`), if at all.
pub fn extra_wait(
    since_last_token: Duration,
    queued_prefill: Duration,
    first_token_timeout: Duration,
) -> Option<Duration> {
    if queued_prefill.is_zero() || since_last_token >= first_token_timeout {
        return None;
    }
    Some(queued_prefill.min(first_token_timeout - since_last_token))
}

/// Whose failure a stream that `waited` in vain is: the worker's (it hangs) when it
/// produced nothing on any stream for `worker_idle`, at least half the wait; else this
/// stream's.
pub fn stall_failure(waited: Duration, worker_idle: Duration) -> Failure {
    if worker_idle >= waited / 2 {
        Failure::Hung
    } else {
        Failure::Stalled
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn the_first_token_waits_for_the_queue_at_most_the_timeout_again() {
        assert_eq!(first_token_wait(S(30), S(0)), S(30));
        assert_eq!(first_token_wait(S(30), S(12)), S(42));
        assert_eq!(first_token_wait(S(30), S(100)), S(60));
    }

    #[test]
    fn a_stalled_stream_waits_for_queued_prefill_within_the_first_token_timeout() {
        assert_eq!(extra_wait(S(1), S(0), S(30)), None);
        assert_eq!(extra_wait(S(1), S(5), S(30)), Some(S(5)));
        assert_eq!(extra_wait(S(28), S(5), S(30)), Some(S(2)));
        assert_eq!(extra_wait(S(30), S(5), S(30)), None);
    }

    #[test]
    fn a_worker_idle_for_half_the_wait_hangs() {
        assert_eq!(stall_failure(S(2), S(1)), Failure::Hung);
        assert_eq!(
            stall_failure(S(2), Duration::from_millis(999)),
            Failure::Stalled
        );
    }
}
