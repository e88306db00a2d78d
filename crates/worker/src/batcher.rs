//! Batching for real encoders: jobs from different requests are gathered on one thread
//! until the batch holds `max_batch` units (image squares, audio windows) or the first job
//! has waited `timeout`, then run in one forward pass (a job larger than `max_batch` runs
//! in passes of at most that many units). Forward passes are blocking CPU work: they run on
//! the batcher's own thread, never on the async threads.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

use thiserror::Error;
use tokio::sync::oneshot;

/// A model the batcher runs: a pass over units, answering one output per unit.
pub trait BatchModel: Send + 'static {
    type Unit: Send + 'static;
    type Output: Send + 'static;
    /// Why a pass failed.
    type Error: std::error::Error + Send + Sync + 'static;
    fn run(&mut self, units: Vec<Self::Unit>) -> Result<Vec<Self::Output>, Self::Error>;
}

/// Why a job got no outputs.
#[derive(Debug, Clone, Error)]
pub enum BatchError {
    #[error("the encoder has stopped")]
    Stopped,
    #[error("the encoder stopped before answering")]
    NoAnswer,
    #[error("the model answered {answered} outputs for {inputs} inputs")]
    OutputCount { answered: usize, inputs: usize },
    /// The model's pass failed. Shared: every job of the pass gets it.
    #[error(transparent)]
    Model(std::sync::Arc<dyn std::error::Error + Send + Sync>),
}

struct Job<M: BatchModel> {
    units: Vec<M::Unit>,
    reply: oneshot::Sender<Result<Vec<M::Output>, BatchError>>,
}

/// Counts of what the batcher has run.
#[derive(Debug, Default)]
pub struct BatchStats {
    pub passes: AtomicU64,
    pub units: AtomicU64,
    pub jobs: AtomicU64,
}

/// A handle on a batcher's thread; the thread ends when every handle is gone.
pub struct Batcher<M: BatchModel> {
    submit: mpsc::Sender<Job<M>>,
    stats: Arc<BatchStats>,
}

impl<M: BatchModel> Clone for Batcher<M> {
    fn clone(&self) -> Self {
        Batcher {
            submit: self.submit.clone(),
            stats: Arc::clone(&self.stats),
        }
    }
}

impl<M: BatchModel> std::fmt::Debug for Batcher<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batcher")
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl<M: BatchModel> Batcher<M> {
    /// Starts the batcher's thread, named `name`.
    pub fn start(
        name: &str,
        model: M,
        max_batch: usize,
        timeout: Duration,
    ) -> std::io::Result<Self> {
        let (submit, jobs) = mpsc::channel();
        let stats = Arc::new(BatchStats::default());
        let counts = Arc::clone(&stats);
        std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || run(model, &jobs, max_batch.max(1), timeout, &counts))?;
        Ok(Batcher { submit, stats })
    }

    /// Runs `units` in the next batch; their outputs in order. An error when the pass fails
    /// (every job of that pass gets it) or the batcher is gone.
    pub async fn run(&self, units: Vec<M::Unit>) -> Result<Vec<M::Output>, BatchError> {
        if units.is_empty() {
            return Ok(Vec::new());
        }
        let (reply, answer) = oneshot::channel();
        self.submit
            .send(Job { units, reply })
            .map_err(|_| BatchError::Stopped)?;
        answer.await.map_err(|_| BatchError::NoAnswer)?
    }

    pub fn stats(&self) -> &BatchStats {
        &self.stats
    }
}

fn run<M: BatchModel>(
    mut model: M,
    jobs: &mpsc::Receiver<Job<M>>,
    max_batch: usize,
    timeout: Duration,
    stats: &BatchStats,
) {
    while let Ok(first) = jobs.recv() {
        let deadline = Instant::now() + timeout;
        let mut size = first.units.len();
        let mut batch = vec![first];
        while size < max_batch {
            let left = deadline.saturating_duration_since(Instant::now());
            match jobs.recv_timeout(left) {
                Ok(job) => {
                    size += job.units.len();
                    batch.push(job);
                }
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => break,
            }
        }
        // Every unit in order, then the passes, then each job's share of the outputs.
        let shares: Vec<usize> = batch.iter().map(|j| j.units.len()).collect();
        let mut replies = Vec::with_capacity(batch.len());
        let mut units = Vec::with_capacity(size);
        for job in batch {
            units.extend(job.units);
            replies.push(job.reply);
        }
        stats
            .jobs
            .fetch_add(replies.len() as u64, Ordering::Relaxed);
        stats.units.fetch_add(size as u64, Ordering::Relaxed);
        let mut outputs = Vec::with_capacity(size);
        let mut failed = None;
        let mut units = units.into_iter();
        loop {
            let pass: Vec<M::Unit> = units.by_ref().take(max_batch).collect();
            if pass.is_empty() {
                break;
            }
            stats.passes.fetch_add(1, Ordering::Relaxed);
            let n = pass.len();
            match model.run(pass) {
                Ok(out) if out.len() == n => outputs.extend(out),
                Ok(out) => {
                    failed = Some(BatchError::OutputCount {
                        answered: out.len(),
                        inputs: n,
                    });
                    break;
                }
                Err(e) => {
                    failed = Some(BatchError::Model(Arc::new(e)));
                    break;
                }
            }
        }
        let mut outputs = outputs.into_iter();
        for (reply, share) in replies.into_iter().zip(shares) {
            let answer = match &failed {
                Some(e) => Err(e.clone()),
                None => Ok(outputs.by_ref().take(share).collect()),
            };
            let _ = reply.send(answer);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// Doubles its inputs and records each pass's size; fails on a negative input.
    struct Doubler(Arc<Mutex<Vec<usize>>>);

    #[derive(Debug, Error)]
    #[error("negative")]
    struct Negative;

    impl BatchModel for Doubler {
        type Unit = i32;
        type Output = i32;
        type Error = Negative;
        fn run(&mut self, units: Vec<i32>) -> Result<Vec<i32>, Negative> {
            self.0.lock().unwrap().push(units.len());
            if units.iter().any(|&u| u < 0) {
                return Err(Negative);
            }
            Ok(units.into_iter().map(|u| u * 2).collect())
        }
    }

    fn batcher(max_batch: usize, timeout_ms: u64) -> (Batcher<Doubler>, Arc<Mutex<Vec<usize>>>) {
        let passes = Arc::new(Mutex::new(Vec::new()));
        let b = Batcher::start(
            "test-batcher",
            Doubler(Arc::clone(&passes)),
            max_batch,
            Duration::from_millis(timeout_ms),
        )
        .unwrap();
        (b, passes)
    }

    #[tokio::test]
    async fn jobs_arriving_within_the_timeout_share_a_pass_and_get_their_own_outputs_back() {
        let (b, passes) = batcher(8, 300);
        let (x, y, z) = tokio::join!(b.run(vec![1, 2]), b.run(vec![3]), b.run(vec![4, 5, 6]));
        assert_eq!(x.unwrap(), vec![2, 4]);
        assert_eq!(y.unwrap(), vec![6]);
        assert_eq!(z.unwrap(), vec![8, 10, 12]);
        assert_eq!(*passes.lock().unwrap(), vec![6]);
        assert_eq!(b.stats().jobs.load(Ordering::Relaxed), 3);
    }

    #[tokio::test]
    async fn a_full_batch_runs_at_once_and_a_large_job_runs_in_passes_of_max_batch() {
        // The timeout is far away: only a full batch can have started the pass.
        let (b, passes) = batcher(4, 60_000);
        let out = b.run(vec![1, 2, 3, 4, 5, 6, 7, 8, 9, 10]).await.unwrap();
        assert_eq!(out, (1..=10).map(|u| u * 2).collect::<Vec<_>>());
        assert_eq!(*passes.lock().unwrap(), vec![4, 4, 2]);
    }

    #[tokio::test]
    async fn a_failed_pass_fails_every_job_in_it_and_the_batcher_goes_on() {
        let (b, _) = batcher(8, 300);
        let (x, y) = tokio::join!(b.run(vec![1]), b.run(vec![-1]));
        let (x, y) = (x.map_err(|e| e.to_string()), y.map_err(|e| e.to_string()));
        assert_eq!(x, Err("negative".into()));
        assert_eq!(y, Err("negative".into()));
        assert_eq!(b.run(vec![7]).await.unwrap(), vec![14]);
        assert_eq!(b.run(Vec::new()).await.unwrap(), Vec::<i32>::new());
    }
}
