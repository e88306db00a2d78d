//! Encoder workers in the frontend's process: the routing core's [`EncoderPool`] driven in
//! real time. Each media item is queued on an encoder and the request waits until the
//! batch that holds it has run for the time the cost model gives (a mock encoder: the
//! embeddings themselves are not computed; LLM engines here take placeholder tokens).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use switchyard_core::Modality;
use switchyard_router::routing::encoders::{EncoderCost, EncoderPolicy, EncoderPool, MediaWork};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

/// A handle on the encoders' task.
#[derive(Debug, Clone)]
pub struct Encoders {
    submit: mpsc::UnboundedSender<(MediaWork, oneshot::Sender<()>)>,
    /// Items queued or being encoded, and how many may be.
    pending: Arc<AtomicUsize>,
    limit: usize,
}

/// The encoders hold as many items as they may: the request is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Saturated;

impl Encoders {
    /// Starts `count` encoders on the current tokio runtime; at most `limit` items wait
    /// or run at once.
    pub fn start(count: usize, cost: EncoderCost, policy: EncoderPolicy, limit: usize) -> Self {
        let (submit, requests) = mpsc::unbounded_channel();
        tokio::spawn(drive(EncoderPool::new(count, cost, policy), requests));
        Encoders {
            submit,
            pending: Arc::new(AtomicUsize::new(0)),
            limit: limit.max(1),
        }
    }

    /// Encodes the items (all queued at once, so they may share batches) and returns when
    /// the last is done; refused at once if they would take the encoders past their limit.
    pub async fn encode(&self, items: &[(Modality, u32)]) -> Result<(), Saturated> {
        let n = items.len();
        let before = self.pending.fetch_add(n, Ordering::AcqRel);
        // Given back when this request is done or gone (its items finish regardless).
        let _release = Release(&self.pending, n);
        if before + n > self.limit {
            return Err(Saturated);
        }
        let mut done = Vec::with_capacity(items.len());
        for &(modality, tokens) in items {
            let (tx, rx) = oneshot::channel();
            let work = MediaWork {
                owner: 0,
                modality,
                tokens,
            };
            if self.submit.send((work, tx)).is_err() {
                return Ok(());
            }
            done.push(rx);
        }
        for rx in done {
            let _ = rx.await;
        }
        Ok(())
    }
}

struct Release<'a>(&'a AtomicUsize, usize);

impl Drop for Release<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(self.1, Ordering::AcqRel);
    }
}

/// The encoders' task: takes items, starts batches, and at each batch's end wakes the
/// requests whose items it held. Ends when every handle is gone and nothing is pending.
async fn drive(
    mut pool: EncoderPool,
    mut requests: mpsc::UnboundedReceiver<(MediaWork, oneshot::Sender<()>)>,
) {
    let origin = Instant::now();
    let mut waiting: HashMap<u64, oneshot::Sender<()>> = HashMap::new();
    let mut next_owner = 0u64;
    let mut ends: Vec<Option<Duration>> = vec![None; pool.len()];
    let mut open = true;
    loop {
        let next_end = ends
            .iter()
            .enumerate()
            .filter_map(|(e, t)| t.map(|t| (t, e)))
            .min();
        if !open && next_end.is_none() {
            return;
        }
        let sleep = async {
            match next_end {
                Some((at, _)) => tokio::time::sleep_until(origin + at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            received = requests.recv(), if open => {
                let Some((mut work, reply)) = received else {
                    open = false;
                    continue;
                };
                work.owner = next_owner;
                next_owner = next_owner.wrapping_add(1);
                waiting.insert(work.owner, reply);
                let now = origin.elapsed();
                if let (_, Some(started)) = pool.submit(work, now) {
                    ends[started.encoder] = Some(started.ends);
                }
            }
            () = sleep => {
                let Some((at, encoder)) = next_end else { continue };
                let (done, started) = pool.finish(encoder, at);
                ends[encoder] = started.map(|s| s.ends);
                for item in done {
                    if let Some(reply) = waiting.remove(&item.owner) {
                        let _ = reply.send(());
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slow_images() -> EncoderCost {
        EncoderCost {
            image_batch_ms: vec![(1.0, 200.0), (4.0, 260.0)],
            ..EncoderCost::default()
        }
    }

    #[tokio::test]
    async fn a_request_waits_for_its_batch_and_concurrent_images_share_one() {
        tokio::time::pause();
        let encoders = Encoders::start(1, slow_images(), EncoderPolicy::Soonest, 16);
        let start = Instant::now();
        encoders.encode(&[(Modality::Image, 576)]).await.unwrap();
        // Timers round up to the millisecond.
        let took = start.elapsed();
        assert!((200..=202).contains(&took.as_millis()), "{took:?}");
        // Four at once, the encoder idle: one batch of four, 260 ms for all.
        let start = Instant::now();
        let each = (0..4).map(|_| {
            let e = encoders.clone();
            tokio::spawn(async move { e.encode(&[(Modality::Image, 576)]).await.unwrap() })
        });
        let handles: Vec<_> = each.collect();
        for h in handles {
            h.await.unwrap();
        }
        // The first starts alone (200 ms), the other three batch after it (200 + 60 × 2/3
        // = 240 ms by the curve).
        let took = start.elapsed();
        assert!((439..=443).contains(&took.as_millis()), "{took:?}");
    }

    #[tokio::test]
    async fn two_encoders_run_side_by_side() {
        tokio::time::pause();
        let encoders = Encoders::start(2, slow_images(), EncoderPolicy::Soonest, 16);
        let start = Instant::now();
        let a = encoders.clone();
        let b = encoders.clone();
        let (x, y) = tokio::join!(
            a.encode(&[(Modality::Image, 576)]),
            b.encode(&[(Modality::Video, 30 * 144)])
        );
        assert_eq!((x, y), (Ok(()), Ok(())));
        // The video (30 × 1.6 = 48 ms) and the image (200 ms) on separate encoders.
        let took = start.elapsed();
        assert!((200..=202).contains(&took.as_millis()), "{took:?}");
    }

    #[tokio::test]
    async fn beyond_the_limit_a_request_is_refused_and_room_comes_back() {
        tokio::time::pause();
        let encoders = Encoders::start(1, slow_images(), EncoderPolicy::Soonest, 2);
        let e = encoders.clone();
        let first = tokio::spawn(async move { e.encode(&[(Modality::Image, 576); 2]).await });
        tokio::task::yield_now().await;
        assert_eq!(
            encoders.encode(&[(Modality::Image, 576)]).await,
            Err(Saturated)
        );
        assert_eq!(first.await.unwrap(), Ok(()));
        assert_eq!(encoders.encode(&[(Modality::Image, 576)]).await, Ok(()));
    }
}
