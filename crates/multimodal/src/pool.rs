//! A bounded pool for CPU-bound preprocessing, so decoding media never runs on the async
//! threads and a burst of large media cannot queue without end.

use std::sync::Arc;

use tokio::sync::Semaphore;

use crate::MediaError;

/// At most `threads` jobs run at once, on tokio's blocking threads; at most `queue` more
/// wait for one of them; a job beyond that is refused at once with [`MediaError::Busy`].
/// A job keeps its thread until it ends, even if its caller has gone, so the bound holds.
#[derive(Debug, Clone)]
pub struct PreprocessPool {
    admitted: Arc<Semaphore>,
    running: Arc<Semaphore>,
    threads: usize,
}

impl PreprocessPool {
    pub fn new(threads: usize, queue: usize) -> Self {
        let threads = threads.max(1);
        PreprocessPool {
            admitted: Arc::new(Semaphore::new(threads + queue)),
            running: Arc::new(Semaphore::new(threads)),
            threads,
        }
    }

    /// Jobs that may run at once.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Runs `job` on the pool and returns its result.
    pub async fn run<T, F>(&self, job: F) -> Result<T, MediaError>
    where
        T: Send + 'static,
        F: FnOnce() -> Result<T, MediaError> + Send + 'static,
    {
        let admitted = Arc::clone(&self.admitted)
            .try_acquire_owned()
            .map_err(|_| MediaError::Busy)?;
        let running = Arc::clone(&self.running)
            .acquire_owned()
            .await
            .map_err(|_| MediaError::Busy)?;
        let handle = tokio::task::spawn_blocking(move || {
            let out = job();
            drop(running);
            drop(admitted);
            out
        });
        match handle.await {
            Ok(out) => out,
            Err(e) => Err(MediaError::Internal(format!("preprocessing failed: {e}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn at_most_threads_run_and_the_queue_beyond_is_refused() {
        let pool = PreprocessPool::new(2, 3);
        let now = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let mut jobs = Vec::new();
        for i in 0..5 {
            let (pool, now, most) = (pool.clone(), Arc::clone(&now), Arc::clone(&most));
            jobs.push(tokio::spawn(async move {
                pool.run(move || {
                    let n = now.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(n, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(100));
                    now.fetch_sub(1, Ordering::SeqCst);
                    Ok(i)
                })
                .await
            }));
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
        // Two running, three waiting: a sixth is refused at once.
        let refused = pool.run(|| Ok(())).await;
        assert!(matches!(refused, Err(MediaError::Busy)), "{refused:?}");
        let mut results = Vec::new();
        for job in jobs {
            results.push(job.await.unwrap().unwrap());
        }
        results.sort_unstable();
        assert_eq!(results, [0, 1, 2, 3, 4]);
        assert_eq!(most.load(Ordering::SeqCst), 2);
        // Room again once they are done.
        assert_eq!(pool.run(|| Ok(7)).await.unwrap(), 7);
    }

    #[tokio::test]
    async fn a_failing_or_panicking_job_fails_alone() {
        let pool = PreprocessPool::new(1, 1);
        let failed = pool
            .run(|| Err::<(), _>(MediaError::Undecodable("bad".into())))
            .await;
        assert!(matches!(failed, Err(MediaError::Undecodable(_))));
        let panicked = pool
            .run(|| -> Result<(), MediaError> { panic!("boom") })
            .await;
        assert!(
            matches!(panicked, Err(MediaError::Internal(_))),
            "{panicked:?}"
        );
        assert_eq!(pool.run(|| Ok(1)).await.unwrap(), 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_caller_that_goes_away_still_holds_its_thread_until_the_job_ends() {
        let pool = PreprocessPool::new(1, 0);
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        let p = pool.clone();
        let caller = tokio::spawn(async move {
            p.run(move || {
                started_tx.send(()).unwrap();
                std::thread::sleep(Duration::from_millis(200));
                Ok(())
            })
            .await
        });
        tokio::task::spawn_blocking(move || started_rx.recv().unwrap())
            .await
            .unwrap();
        caller.abort();
        // The job still runs: no room for another.
        assert!(matches!(pool.run(|| Ok(())).await, Err(MediaError::Busy)));
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(pool.run(|| Ok(())).await.is_ok());
    }
}
