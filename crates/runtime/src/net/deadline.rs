//! A request body's deadline: it must arrive whole within a grace period plus its size at a
//! minimum rate. A body trickled slower than that rate fails when its deadline passes,
//! however steadily it trickles (a stall timer alone never fires on a steady trickle).

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::Request;
use http_body::Frame;
use tokio::time::{Instant, Sleep};

/// What a body that missed its deadline fails with (a 408 for the handler that reads it).
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive in time (at least {min_rate} bytes/s after {grace:?})")]
pub struct BodyTooSlow {
    pub grace: Duration,
    pub min_rate: u64,
}

/// The body's deadline: `grace`, plus a second per `min_rate` bytes received.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyDeadline {
    pub grace: Duration,
    /// Bytes per second; 0: no allowance for size (the whole body within `grace`).
    pub min_rate: u64,
}

impl BodyDeadline {
    /// The deadline of a body begun at `start` with `received` bytes so far.
    pub fn at(&self, start: Instant, received: u64) -> Instant {
        let allowance = match self.min_rate {
            0 => Duration::ZERO,
            rate => Duration::from_secs_f64(received as f64 / rate as f64),
        };
        start + self.grace + allowance
    }

    /// A layer putting every request's body under this deadline.
    pub fn layer(
        self,
    ) -> tower::util::MapRequestLayer<impl Fn(Request) -> Request + Clone + Send + Sync + 'static>
    {
        tower::util::MapRequestLayer::new(move |request| self.apply(request))
    }

    /// `request` with its body under this deadline, counted from now.
    pub fn apply(self, request: Request) -> Request {
        request.map(|body| {
            let start = Instant::now();
            Body::new(Timed {
                body,
                deadline: self,
                start,
                received: 0,
                sleep: Box::pin(tokio::time::sleep_until(self.at(start, 0))),
            })
        })
    }
}

struct Timed {
    body: Body,
    deadline: BodyDeadline,
    start: Instant,
    received: u64,
    sleep: Pin<Box<Sleep>>,
}

impl http_body::Body for Timed {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        if let Poll::Ready(frame) = Pin::new(&mut self.body).poll_frame(cx) {
            if let Some(Ok(frame)) = &frame
                && let Some(data) = frame.data_ref()
            {
                self.received += data.len() as u64;
                let next = self.deadline.at(self.start, self.received);
                self.sleep.as_mut().reset(next);
            }
            return Poll::Ready(frame);
        }
        match self.sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(axum::Error::new(BodyTooSlow {
                grace: self.deadline.grace,
                min_rate: self.deadline.min_rate,
            })))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// Whether an error (or one of its sources) is a body that missed its deadline.
pub fn is_too_slow(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut source = Some(error);
    while let Some(error) = source {
        if error.is::<BodyTooSlow>() {
            return true;
        }
        source = error.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;
    use http_body_util::BodyExt;

    use super::*;

    /// A body sent `chunk` bytes every `every`, `chunks` times.
    fn trickle(chunk: usize, every: Duration, chunks: usize) -> Request {
        let stream = futures::stream::iter(0..chunks).then(move |_| async move {
            tokio::time::sleep(every).await;
            Ok::<_, std::io::Error>(Bytes::from(vec![b'x'; chunk]))
        });
        Request::new(Body::from_stream(stream))
    }

    #[tokio::test(start_paused = true)]
    async fn a_steady_trickle_below_the_rate_fails_at_its_deadline() {
        let deadline = BodyDeadline {
            grace: Duration::from_secs(2),
            min_rate: 100,
        };
        // 10 bytes a second for a minute: never stalled, far below 100 bytes/s.
        let started = Instant::now();
        let request = deadline.apply(trickle(10, Duration::from_secs(1), 60));
        let error = request.into_body().collect().await.unwrap_err();
        assert!(is_too_slow(&error), "{error}");
        // Failed once its deadline passed: 2 s plus 0.1 s per 10 bytes received.
        let took = started.elapsed();
        assert!(
            took >= Duration::from_secs(2) && took < Duration::from_secs(4),
            "{took:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_at_the_rate_arrives_whole_however_large() {
        let deadline = BodyDeadline {
            grace: Duration::from_secs(1),
            min_rate: 1000,
        };
        // 2,000 bytes a second for 30 s: over the minimum rate, longer than the grace.
        let request = deadline.apply(trickle(200, Duration::from_millis(100), 300));
        let body = request.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body.len(), 60_000);
    }
}
