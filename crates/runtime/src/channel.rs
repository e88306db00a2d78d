//! Bounded subscriptions: a subscriber that falls behind loses messages instead of growing
//! memory without bound, and is told that it did.
//!
//! The sender never waits (publishers must not stall behind a slow reader). When the queue
//! is full the message is dropped and the sender remembers it; before the next message that
//! fits, the receiver gets the subscription's *loss marker*, so it can repair what it
//! missed (for KV events: resynchronise every worker from its dump).

use tokio::sync::mpsc;
use tokio::sync::mpsc::error::TrySendError;

/// Messages a subscription holds before it starts losing them.
pub const SUBSCRIPTION_CAPACITY: usize = 8192;

/// The sending half of a bounded subscription.
#[derive(Debug)]
pub struct LossySender<T> {
    tx: mpsc::Sender<T>,
    /// Sent ahead of the first message after a loss; none: losses go unannounced.
    marker: Option<T>,
    lagged: bool,
    dropped: u64,
}

impl<T: Clone> LossySender<T> {
    pub fn channel(capacity: usize, marker: Option<T>) -> (Self, mpsc::Receiver<T>) {
        let (tx, rx) = mpsc::channel(capacity.max(2));
        let sender = LossySender {
            tx,
            marker,
            lagged: false,
            dropped: 0,
        };
        (sender, rx)
    }

    /// Queues `item` without waiting. Returns false once the receiver is gone.
    pub fn send(&mut self, item: T) -> bool {
        if self.lagged {
            match &self.marker {
                Some(marker) => match self.tx.try_send(marker.clone()) {
                    Ok(()) => self.lagged = false,
                    Err(TrySendError::Full(_)) => {
                        self.dropped += 1;
                        return true;
                    }
                    Err(TrySendError::Closed(_)) => return false,
                },
                None => self.lagged = false,
            }
        }
        match self.tx.try_send(item) {
            Ok(()) => true,
            Err(TrySendError::Full(_)) => {
                if !self.lagged {
                    tracing::warn!(
                        capacity = self.tx.max_capacity(),
                        "a subscriber fell behind; dropping its messages until it catches up"
                    );
                }
                self.lagged = true;
                self.dropped += 1;
                true
            }
            Err(TrySendError::Closed(_)) => false,
        }
    }

    /// Messages dropped so far.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_slow_receiver_loses_messages_and_gets_the_marker_first() {
        let (mut tx, mut rx) = LossySender::channel(2, Some(0u32));
        assert!(tx.send(1) && tx.send(2));
        assert!(tx.send(3), "full: dropped, not an error");
        assert_eq!(tx.dropped(), 1);
        assert_eq!(rx.recv().await, Some(1));
        // Room for one: the marker goes first, then the message waits its turn.
        assert!(tx.send(4));
        assert_eq!(tx.dropped(), 2);
        assert_eq!(rx.recv().await, Some(2));
        assert_eq!(rx.recv().await, Some(0), "the loss of 3 is announced");
        // 4 was lost after that announcement: it is announced too, before 5.
        assert!(tx.send(5));
        assert_eq!(rx.recv().await, Some(0));
        assert_eq!(rx.recv().await, Some(5));
        assert!(tx.send(6));
        assert_eq!(rx.recv().await, Some(6), "caught up: no more announcements");
        drop(rx);
        assert!(!tx.send(6), "a closed receiver ends the subscription");
    }

    #[tokio::test]
    async fn without_a_marker_losses_are_silent() {
        let (mut tx, mut rx) = LossySender::channel(2, None::<u32>);
        for i in 0..5 {
            tx.send(i);
        }
        assert_eq!(rx.recv().await, Some(0));
        assert_eq!(rx.recv().await, Some(1));
        tx.send(9);
        assert_eq!(rx.recv().await, Some(9));
    }
}
