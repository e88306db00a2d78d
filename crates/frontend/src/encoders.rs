//! Encoder workers in the frontend's process: the routing core's [`EncoderPool`] driven in
//! real time. Each media item is queued on an encoder and the request waits until the
//! batch that holds it has run for the time the cost model gives (a mock encoder: the
//! embeddings themselves are not computed; LLM engines here take placeholder tokens).

use std::time::Duration;

use switchyard_core::Modality;
use switchyard_router::routing::encoders::{EncoderCost, EncoderPolicy, EncoderPool, MediaWork};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

/// A handle on the encoders' task.
#[derive(Debug, Clone)]
pub struct Encoders {
    submit: mpsc::UnboundedSender<(MediaWork, oneshot::Sender<()>)>,
    count: usize,
}

impl Encoders {
    /// Starts `count` encoders on the current tokio runtime.
    pub fn start(count: usize, cost: EncoderCost, policy: EncoderPolicy) -> Self {
        let (submit, requests) = mpsc::unbounded_channel();
        tokio::spawn(drive(EncoderPool::new(count, cost, policy), requests));
        Encoders {
            submit,
            count: count.max(1),
        }
    }

    pub fn count(&self) -> usize {
        self.count
    }

    /// Encodes the items (all queued at once, so they may share batches) and returns when
    /// the last is done.
    pub async fn encode(&self, items: &[(Modality, u32)]) {
        let mut done = Vec::with_capacity(items.len());
        for &(modality, tokens) in items {
            let (tx, rx) = oneshot::channel();
            let work = MediaWork {
                owner: 0,
                modality,
                tokens,
            };
            if self.submit.send((work, tx)).is_err() {
                return;
            }
            done.push(rx);
        }
        for rx in done {
            let _ = rx.await;
        }
    }
}

/// The encoders' task: takes items, starts batches, and at each batch's end wakes the
/// requests whose items it held. Ends when every handle is gone and nothing is pending.
async fn drive(
    mut pool: EncoderPool,
    mut requests: mpsc::UnboundedReceiver<(MediaWork, oneshot::Sender<()>)>,
) {
    let origin = Instant::now();
    let mut waiting: Vec<Option<oneshot::Sender<()>>> = Vec::new();
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
                work.owner = waiting.len() as u64;
                waiting.push(Some(reply));
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
                    if let Some(reply) = waiting.get_mut(item.owner as usize).and_then(Option::take) {
                        let _ = reply.send(());
                    }
                }
                // Every item answered: start numbering afresh.
                if pool.pending() == 0 {
                    waiting.clear();
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
        let encoders = Encoders::start(1, slow_images(), EncoderPolicy::Soonest);
        let start = Instant::now();
        encoders.encode(&[(Modality::Image, 576)]).await;
        // Timers round up to the millisecond.
        let took = start.elapsed();
        assert!((200..=202).contains(&took.as_millis()), "{took:?}");
        // Four at once, the encoder idle: one batch of four, 260 ms for all.
        let start = Instant::now();
        let each = (0..4).map(|_| {
            let e = encoders.clone();
            tokio::spawn(async move { e.encode(&[(Modality::Image, 576)]).await })
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
        let encoders = Encoders::start(2, slow_images(), EncoderPolicy::Soonest);
        let start = Instant::now();
        let a = encoders.clone();
        let b = encoders.clone();
        let (x, y) = tokio::join!(
            a.encode(&[(Modality::Image, 576)]),
            b.encode(&[(Modality::Video, 30 * 144)])
        );
        let _ = (x, y);
        // The video (30 × 1.6 = 48 ms) and the image (200 ms) on separate encoders.
        let took = start.elapsed();
        assert!((200..=202).contains(&took.as_millis()), "{took:?}");
    }
}
