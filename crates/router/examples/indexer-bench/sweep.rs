//! The indexer under concurrent load (`--sweep`): the mixed replay's operations, offered at
//! a fixed rate by event-publishing threads and lookup threads at once, the rate stepped up
//! until the index cannot keep up.
//!
//! Operation `i` of the stream is due `i / rate` seconds after a step starts. Events go to
//! the publisher that owns their worker (so each worker's events stay in order), which hands
//! every event that has come due to the index as one batch, as an event plane delivers what
//! arrived since its last read. Lookups go round-robin to the lookup threads, each timed
//! alone. A step is sustained when all its operations are done, events applied (drained),
//! within 5 % of the time the offered rate allows.
//!
//! Each candidate is a way to share one index between those threads; the production
//! [`SharedIndexer`] is one of them.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use serde::Serialize;
use switchyard_core::KvEvent;
use switchyard_router::indexer::shared::SharedIndexer;
use switchyard_router::{Indexer, IndexerConfig, OverlapScores};

use crate::latency::Samples;
use crate::mixed::{Op, OpStream};
use crate::query::{Lookup, Query};

/// The ways of sharing the index that the sweep compares.
pub const CANDIDATES: &[&str] = &[
    "shared",
    "shared-channel",
    "left-right",
    "mutex",
    "mutex-chunked",
    "rwlock",
    "sharded-mutex",
];

/// One way of sharing an index between publishers and lookups.
trait Candidate: Sync {
    /// Hands a batch of events, in order, to the index.
    fn publish(&self, events: Vec<KvEvent>);
    fn lookup(&self, how: Lookup, query: &Query, out: &mut OverlapScores);
    /// Events applied so far.
    fn applied(&self) -> u64;
    /// Blocks held, summed over workers.
    fn worker_blocks(&self) -> u64;
}

/// The production indexer, events applied by the publishing thread itself.
struct Shared {
    index: SharedIndexer,
    applied: AtomicU64,
}

impl Candidate for Shared {
    fn publish(&self, events: Vec<KvEvent>) {
        let n = events.len() as u64;
        self.index.apply_all(events);
        self.applied.fetch_add(n, Ordering::Release);
    }
    fn lookup(&self, how: Lookup, query: &Query, out: &mut OverlapScores) {
        how.find_shared(&self.index, query, out);
    }
    fn applied(&self) -> u64 {
        self.applied.load(Ordering::Acquire)
    }
    fn worker_blocks(&self) -> u64 {
        self.index.read(Indexer::worker_block_count)
    }
}

/// The production design before this sweep: left-right, two copies of the plain index,
/// every event applied to one copy, published by swapping, then applied to the other;
/// lookups read the published copy without waiting.
struct LeftRight {
    writer: Mutex<left_right::WriteHandle<Copy, KvEvent>>,
    readers: left_right::ReadHandleFactory<Copy>,
    applied: AtomicU64,
}

/// One of the two copies.
#[derive(Clone)]
struct Copy(Indexer);

impl left_right::Absorb<KvEvent> for Copy {
    fn absorb_first(&mut self, event: &mut KvEvent, _other: &Self) {
        self.0.apply(event);
    }
    fn absorb_second(&mut self, event: KvEvent, _other: &Self) {
        self.0.apply(&event);
    }
    fn sync_with(&mut self, first: &Self) {
        *self = first.clone();
    }
}

thread_local! {
    static LEFT_RIGHT_READER: std::cell::RefCell<Option<left_right::ReadHandle<Copy>>> =
        const { std::cell::RefCell::new(None) };
}

impl LeftRight {
    fn new(index: Indexer) -> Self {
        let (writer, reader) = left_right::new_from_empty::<Copy, KvEvent>(Copy(index));
        LeftRight {
            writer: Mutex::new(writer),
            readers: reader.factory(),
            applied: AtomicU64::new(0),
        }
    }

    fn read<R>(&self, f: impl FnOnce(&Indexer) -> R) -> R {
        LEFT_RIGHT_READER.with(|handle| {
            let mut handle = handle.borrow_mut();
            // A sweep builds one candidate at a time, so a thread's handle is for the
            // current one; threads are spawned per try.
            let handle = handle.get_or_insert_with(|| self.readers.handle());
            match handle.enter() {
                Some(copy) => f(&copy.0),
                None => f(&Indexer::default()),
            }
        })
    }
}

impl Candidate for LeftRight {
    fn publish(&self, events: Vec<KvEvent>) {
        let n = events.len() as u64;
        let mut writer = self.writer.lock();
        let mut pending = 0;
        for event in events {
            pending += event.block_count().max(1);
            writer.append(event);
            // Published every 4,096 blocks, as the production indexer did.
            if pending >= 4096 {
                writer.publish();
                pending = 0;
            }
        }
        writer.publish();
        self.applied.fetch_add(n, Ordering::Release);
    }
    fn lookup(&self, how: Lookup, query: &Query, out: &mut OverlapScores) {
        self.read(|ix| how.find(ix, query, out));
    }
    fn applied(&self) -> u64 {
        self.applied.load(Ordering::Acquire)
    }
    fn worker_blocks(&self) -> u64 {
        self.read(Indexer::worker_block_count)
    }
}

/// The production indexer behind a channel to one ingestion thread (the shape of Dynamo's
/// indexer and of Switchyard's before this sweep).
struct SharedChannel {
    shared: std::sync::Arc<Shared>,
    sender: Mutex<Option<mpsc::Sender<Vec<KvEvent>>>>,
    ingestion: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl SharedChannel {
    fn new(index: Indexer) -> Self {
        let shared = std::sync::Arc::new(Shared {
            index: SharedIndexer::new(index),
            applied: AtomicU64::new(0),
        });
        let (sender, receiver) = mpsc::channel::<Vec<KvEvent>>();
        let ingest = std::sync::Arc::clone(&shared);
        let ingestion = std::thread::spawn(move || {
            while let Ok(mut batch) = receiver.recv() {
                // Everything queued meanwhile goes in the same application.
                while let Ok(more) = receiver.try_recv() {
                    batch.extend(more);
                }
                ingest.publish(batch);
            }
        });
        SharedChannel {
            shared,
            sender: Mutex::new(Some(sender)),
            ingestion: Mutex::new(Some(ingestion)),
        }
    }
}

impl Drop for SharedChannel {
    fn drop(&mut self) {
        self.sender.lock().take();
        if let Some(thread) = self.ingestion.lock().take() {
            let _ = thread.join();
        }
    }
}

impl Candidate for SharedChannel {
    fn publish(&self, events: Vec<KvEvent>) {
        let sender = self.sender.lock().clone();
        if let Some(sender) = sender {
            let _ = sender.send(events);
        }
    }
    fn lookup(&self, how: Lookup, query: &Query, out: &mut OverlapScores) {
        self.shared.lookup(how, query, out);
    }
    fn applied(&self) -> u64 {
        self.shared.applied()
    }
    fn worker_blocks(&self) -> u64 {
        self.shared.worker_blocks()
    }
}

/// A lock around one plain index: a mutex, or a read-write lock whose lookups share it.
trait IndexLock: Sync {
    fn write<R>(&self, f: impl FnOnce(&mut Indexer) -> R) -> R;
    fn read<R>(&self, f: impl FnOnce(&Indexer) -> R) -> R;
}

impl IndexLock for Mutex<Indexer> {
    fn write<R>(&self, f: impl FnOnce(&mut Indexer) -> R) -> R {
        f(&mut self.lock())
    }
    fn read<R>(&self, f: impl FnOnce(&Indexer) -> R) -> R {
        f(&self.lock())
    }
}

impl IndexLock for RwLock<Indexer> {
    fn write<R>(&self, f: impl FnOnce(&mut Indexer) -> R) -> R {
        f(&mut RwLock::write(self))
    }
    fn read<R>(&self, f: impl FnOnce(&Indexer) -> R) -> R {
        f(&RwLock::read(self))
    }
}

/// One plain index behind a lock; a publisher applies its whole batch under one hold.
struct Locked<L> {
    index: L,
    applied: AtomicU64,
}

impl<L: IndexLock> Candidate for Locked<L> {
    fn publish(&self, events: Vec<KvEvent>) {
        let n = events.len() as u64;
        self.index.write(|index| {
            for event in &events {
                index.apply(event);
            }
        });
        self.applied.fetch_add(n, Ordering::Release);
    }
    fn lookup(&self, how: Lookup, query: &Query, out: &mut OverlapScores) {
        self.index.read(|index| how.find(index, query, out));
    }
    fn applied(&self) -> u64 {
        self.applied.load(Ordering::Acquire)
    }
    fn worker_blocks(&self) -> u64 {
        self.index.read(Indexer::worker_block_count)
    }
}

/// One plain index behind a mutex, events applied in chunks of at most `chunk_blocks`
/// blocks per hold and the lock handed fairly to the next waiter (a lookup) between chunks:
/// a lookup waits for one chunk at most, not a whole batch.
struct LockedChunked {
    index: Mutex<Indexer>,
    applied: AtomicU64,
    chunk_blocks: usize,
}

impl Candidate for LockedChunked {
    fn publish(&self, events: Vec<KvEvent>) {
        let mut rest = events.as_slice();
        while !rest.is_empty() {
            let mut index = self.index.lock();
            let mut blocks = 0;
            let mut n = 0;
            for event in rest {
                index.apply(event);
                n += 1;
                blocks += event.block_count().max(1);
                if blocks >= self.chunk_blocks {
                    break;
                }
            }
            parking_lot::MutexGuard::unlock_fair(index);
            self.applied.fetch_add(n as u64, Ordering::Release);
            rest = &rest[n..];
        }
    }
    fn lookup(&self, how: Lookup, query: &Query, out: &mut OverlapScores) {
        how.find(&self.index.lock(), query, out);
    }
    fn applied(&self) -> u64 {
        self.applied.load(Ordering::Acquire)
    }
    fn worker_blocks(&self) -> u64 {
        self.index.lock().worker_block_count()
    }
}

/// Workers split over independent indexes by worker id, each behind its own mutex: events
/// for different shards never contend; a lookup walks every shard and merges.
struct Sharded {
    shards: Vec<Mutex<Indexer>>,
    applied: AtomicU64,
}

impl Candidate for Sharded {
    fn publish(&self, events: Vec<KvEvent>) {
        let n = events.len() as u64;
        // A publisher's batch may span shards: take each shard's lock once.
        let mut by_shard: Vec<Vec<&KvEvent>> = vec![Vec::new(); self.shards.len()];
        for event in &events {
            by_shard[event.worker_id.0 as usize % self.shards.len()].push(event);
        }
        for (shard, events) in self.shards.iter().zip(by_shard) {
            if events.is_empty() {
                continue;
            }
            let mut index = shard.lock();
            for event in events {
                index.apply(event);
            }
        }
        self.applied.fetch_add(n, Ordering::Release);
    }
    fn lookup(&self, how: Lookup, query: &Query, out: &mut OverlapScores) {
        let mut part = OverlapScores::default();
        out.scores.clear();
        out.cached_blocks.clear();
        for shard in &self.shards {
            how.find(&shard.lock(), query, &mut part);
            out.scores.extend_from_slice(&part.scores);
            out.cached_blocks.extend_from_slice(&part.cached_blocks);
        }
        out.scores.sort_unstable_by_key(|e| e.0);
        out.cached_blocks.sort_unstable_by_key(|e| e.0);
    }
    fn applied(&self) -> u64 {
        self.applied.load(Ordering::Acquire)
    }
    fn worker_blocks(&self) -> u64 {
        self.shards
            .iter()
            .map(|s| s.lock().worker_block_count())
            .sum()
    }
}

fn make(name: &str, shards: usize, stream: &OpStream) -> Option<Box<dyn Candidate>> {
    let fresh = || warm(stream, |_| true);
    Some(match name {
        "shared" => Box::new(Shared {
            index: SharedIndexer::new(fresh()),
            applied: AtomicU64::new(0),
        }),
        "shared-channel" => Box::new(SharedChannel::new(fresh())),
        "left-right" => Box::new(LeftRight::new(fresh())),
        "mutex" => Box::new(Locked {
            index: Mutex::new(fresh()),
            applied: AtomicU64::new(0),
        }),
        "mutex-chunked" => Box::new(LockedChunked {
            index: Mutex::new(fresh()),
            applied: AtomicU64::new(0),
            chunk_blocks: 64,
        }),
        "rwlock" => Box::new(Locked {
            index: RwLock::new(fresh()),
            applied: AtomicU64::new(0),
        }),
        "sharded-mutex" => Box::new(Sharded {
            shards: (0..shards.max(1))
                .map(|i| Mutex::new(warm(stream, |w| w % shards.max(1) == i)))
                .collect(),
            applied: AtomicU64::new(0),
        }),
        _ => return None,
    })
}

/// How the sweep runs.
#[derive(Debug, Clone)]
pub struct SweepConfig {
    pub candidates: Vec<String>,
    pub publishers: usize,
    pub lookup_threads: usize,
    /// Offered rate of the first step, in operations per second.
    pub start_rate: f64,
    /// Each step offers this much more than the last.
    pub step_factor: f64,
    pub max_steps: usize,
    /// Steps after the first that is not sustained (to show the knee).
    pub steps_past_saturation: usize,
    /// Shards for `sharded-mutex`.
    pub shards: usize,
    /// Tries per step.
    pub tries: usize,
    /// How lookups are made.
    pub lookup: Lookup,
}

/// One offered rate, for one candidate.
#[derive(Debug, Clone, Serialize)]
pub struct Step {
    pub offered_ops_per_sec: f64,
    /// Operations over the time until the last lookup returned and every event was applied.
    pub achieved_ops_per_sec: f64,
    pub sustained: bool,
    pub lookup_p50_us: f64,
    pub lookup_p99_us: f64,
    pub lookup_p999_us: f64,
    /// How long after its due time a lookup returned, p99 (queueing included).
    pub lookup_late_p99_us: f64,
    /// Time from the last publish to the last event applied.
    pub drain_ms: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct CandidateReport {
    pub candidate: String,
    /// The highest offered rate sustained.
    pub sustained_ops_per_sec: f64,
    /// Lookup p99 at the highest sustained step.
    pub lookup_p99_us_at_sustained: f64,
    pub blocks_per_sec_at_sustained: f64,
    /// Bytes allocated by the index after the trace, and per block held by a worker.
    pub memory_bytes: u64,
    pub bytes_per_worker_block: f64,
    pub steps: Vec<Step>,
}

#[derive(Debug, Clone, Serialize)]
pub struct SweepReport {
    pub workers: u32,
    pub block_size: u32,
    pub cache_blocks: usize,
    pub publishers: usize,
    pub lookup_threads: usize,
    pub lookups: usize,
    pub events: usize,
    pub blocks: usize,
    pub candidates: Vec<CandidateReport>,
}

/// The stream split by thread: (operation index, what to do).
struct Plan<'a> {
    publishers: Vec<Vec<(usize, &'a KvEvent)>>,
    lookups: Vec<Vec<(usize, &'a Query)>>,
    how: Lookup,
    events: usize,
    blocks: usize,
    total: usize,
}

fn plan(stream: &OpStream, publishers: usize, lookup_threads: usize, how: Lookup) -> Plan<'_> {
    let mut plan = Plan {
        how,
        publishers: vec![Vec::new(); publishers.max(1)],
        lookups: vec![Vec::new(); lookup_threads.max(1)],
        events: 0,
        blocks: 0,
        total: stream.ops.len(),
    };
    let mut next_lookup = 0;
    for (i, op) in stream.ops.iter().enumerate() {
        match op {
            Op::Event(e) => {
                let p = e.worker_id.0 as usize % plan.publishers.len();
                plan.publishers[p].push((i, e));
                plan.events += 1;
                plan.blocks += e.block_count();
            }
            Op::Lookup(q) => {
                plan.lookups[next_lookup].push((i, q));
                next_lookup = (next_lookup + 1) % plan.lookups.len();
                plan.blocks += q.len();
            }
        }
    }
    plan
}

/// Waits until operation `index` is due; returns the operations due by now.
fn wait_until_due(start: Instant, index: usize, rate: f64) -> usize {
    loop {
        let elapsed = start.elapsed().as_secs_f64();
        let due = (elapsed * rate) as usize;
        if due >= index {
            return due;
        }
        // Sleeping, never spinning: on two cores a spinning thread takes the time of the
        // threads under test. The sleep overshoots by tens of microseconds; operations due
        // meanwhile go in the next batch, as they would queue in an event plane.
        let ahead = (index - due) as f64 / rate;
        std::thread::sleep(Duration::from_secs_f64(ahead));
    }
}

/// One try of one step.
struct Try {
    achieved: f64,
    drained: bool,
    service: Samples,
    late: Samples,
    drain: Duration,
}

fn run_try(candidate: &dyn Candidate, plan: &Plan<'_>, rate: f64) -> Try {
    let start_barrier = std::sync::Barrier::new(plan.publishers.len() + plan.lookups.len() + 1);
    let mut start_at = Instant::now();
    let (lookup_samples, late_samples, last_publish) = std::thread::scope(|scope| {
        let barrier = &start_barrier;
        let publishers: Vec<_> = plan
            .publishers
            .iter()
            .map(|mine| {
                scope.spawn(move || {
                    barrier.wait();
                    let start = Instant::now();
                    let mut i = 0;
                    while i < mine.len() {
                        let due = wait_until_due(start, mine[i].0, rate);
                        let mut batch = Vec::new();
                        while i < mine.len() && mine[i].0 <= due {
                            batch.push(mine[i].1.clone());
                            i += 1;
                        }
                        candidate.publish(batch);
                    }
                    start.elapsed()
                })
            })
            .collect();
        let lookups: Vec<_> = plan
            .lookups
            .iter()
            .map(|mine| {
                scope.spawn(move || {
                    barrier.wait();
                    let start = Instant::now();
                    let mut out = OverlapScores::default();
                    let mut service = Samples::with_capacity(mine.len());
                    let mut late = Samples::with_capacity(mine.len());
                    for &(index, query) in mine {
                        wait_until_due(start, index, rate);
                        let t = Instant::now();
                        candidate.lookup(plan.how, query, &mut out);
                        black_box(&out);
                        let done = Instant::now();
                        service.push((done - t).as_nanos() as u64);
                        let due = start + Duration::from_secs_f64(index as f64 / rate);
                        late.push(done.saturating_duration_since(due).as_nanos() as u64);
                    }
                    (service, late, start.elapsed())
                })
            })
            .collect();
        barrier.wait();
        start_at = Instant::now();
        let last_publish = publishers
            .into_iter()
            .map(|h| h.join().unwrap_or_default())
            .max()
            .unwrap_or_default();
        let mut service = Samples::default();
        let mut late = Samples::default();
        let mut lookups_done = Duration::ZERO;
        for h in lookups {
            if let Ok((s, l, done)) = h.join() {
                service.extend(s);
                late.extend(l);
                lookups_done = lookups_done.max(done);
            }
        }
        (service, late, (last_publish, lookups_done))
    });
    // Drained: every event applied.
    let deadline = Instant::now() + Duration::from_secs(60);
    while candidate.applied() < plan.events as u64 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_micros(50));
    }
    let drained = start_at.elapsed();
    let (last_publish, lookups_done) = last_publish;
    let elapsed = drained.max(lookups_done);
    Try {
        achieved: plan.total as f64 / elapsed.as_secs_f64(),
        drained: candidate.applied() == plan.events as u64,
        service: lookup_samples,
        late: late_samples,
        drain: drained.saturating_sub(last_publish),
    }
}

/// A step is run `tries` times on a fresh index each: one stream lasts a fraction of a
/// second, and on a shared VM a single preemption can sink one try. The step is sustained
/// when most tries are; the achieved rate is the median; latencies pool every try.
fn run_step(
    make: impl Fn() -> Box<dyn Candidate>,
    plan: &Plan<'_>,
    rate: f64,
    tries: usize,
) -> Step {
    let mut achieved = Vec::new();
    let mut sustained = 0;
    let (mut service, mut late) = (Samples::default(), Samples::default());
    let mut drain = Duration::ZERO;
    for _ in 0..tries.max(1) {
        let candidate = make();
        let t = run_try(candidate.as_ref(), plan, rate);
        if t.drained && t.achieved >= 0.95 * rate {
            sustained += 1;
        }
        achieved.push(t.achieved);
        service.extend(t.service);
        late.extend(t.late);
        drain = drain.max(t.drain);
    }
    achieved.sort_by(f64::total_cmp);
    let service = service.summarize();
    let late = late.summarize();
    Step {
        offered_ops_per_sec: rate,
        achieved_ops_per_sec: achieved[achieved.len() / 2],
        sustained: 2 * sustained > tries.max(1),
        lookup_p50_us: service.p50_us,
        lookup_p99_us: service.p99_us,
        lookup_p999_us: service.p999_us,
        lookup_late_p99_us: late.p99_us,
        drain_ms: drain.as_secs_f64() * 1e3,
    }
}

/// Bytes allocated now (the bench's global allocator counts them).
fn allocated() -> u64 {
    crate::ALLOCATOR.allocated() as u64
}

pub fn run(
    stream: &OpStream,
    config: &SweepConfig,
    block_size: u32,
    cache_blocks: usize,
) -> Result<SweepReport, String> {
    let plan = plan(
        stream,
        config.publishers,
        config.lookup_threads,
        config.lookup,
    );
    let mut reports = Vec::new();
    for name in &config.candidates {
        if !CANDIDATES.contains(&name.as_str()) {
            return Err(format!(
                "unknown candidate {name:?}; known: {}",
                CANDIDATES.join(", ")
            ));
        }
        let mut steps = Vec::new();
        let mut rate = config.start_rate;
        let mut failed = 0;
        // The index's memory after the whole trace, from a run at the first rate.
        let memory = {
            let before = allocated();
            let candidate = make(name, config.shards, stream).ok_or("unknown candidate")?;
            run_try(candidate.as_ref(), &plan, config.start_rate);
            (
                allocated().saturating_sub(before),
                candidate.worker_blocks(),
            )
        };
        for _ in 0..config.max_steps {
            let step = run_step(
                || make(name, config.shards, stream).expect("a known candidate"),
                &plan,
                rate,
                config.tries,
            );
            eprintln!(
                "  {name}: offered {:.0}k ops/s → {:.0}k{} lookup p50 {:.2} µs p99 {:.2} µs p99.9 {:.1} µs",
                rate / 1e3,
                step.achieved_ops_per_sec / 1e3,
                if step.sustained {
                    ""
                } else {
                    " (not sustained)"
                },
                step.lookup_p50_us,
                step.lookup_p99_us,
                step.lookup_p999_us,
            );
            let sustained = step.sustained;
            steps.push(step);
            if !sustained {
                failed += 1;
                if failed > config.steps_past_saturation {
                    break;
                }
            }
            rate *= config.step_factor;
        }
        let best = steps
            .iter()
            .filter(|s| s.sustained)
            .max_by(|a, b| a.offered_ops_per_sec.total_cmp(&b.offered_ops_per_sec));
        reports.push(CandidateReport {
            candidate: name.clone(),
            sustained_ops_per_sec: best.map_or(0.0, |s| s.offered_ops_per_sec),
            lookup_p99_us_at_sustained: best.map_or(0.0, |s| s.lookup_p99_us),
            blocks_per_sec_at_sustained: best.map_or(0.0, |s| {
                s.offered_ops_per_sec * plan.blocks as f64 / plan.total as f64
            }),
            memory_bytes: memory.0,
            bytes_per_worker_block: memory.0 as f64 / memory.1.max(1) as f64,
            steps,
        });
    }
    Ok(SweepReport {
        workers: stream.workers.len() as u32,
        block_size,
        cache_blocks,
        publishers: plan.publishers.len(),
        lookup_threads: plan.lookups.len(),
        lookups: plan.total - plan.events,
        events: plan.events,
        blocks: plan.blocks,
        candidates: reports,
    })
}

/// An index that has seen the whole stream's events (for the workers `keep` selects) and
/// lost those workers again: empty, but with its tables at their working size and its
/// memory mapped, as in a long-running indexer (the mixed replay's convention).
fn warm(stream: &OpStream, keep: impl Fn(usize) -> bool) -> Indexer {
    let mut index = Indexer::new(IndexerConfig::default());
    for op in &stream.ops {
        if let Op::Event(e) = op
            && keep(e.worker_id.0 as usize)
        {
            index.apply(e);
        }
    }
    for &worker in &stream.workers {
        index.remove_worker(worker);
    }
    index
}
