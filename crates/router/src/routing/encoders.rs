//! Encoder workers: what encoding a media item costs, and a pool that picks the encoder
//! for each item and tracks the work queued on each, as a pure state machine (times in,
//! choices out), shared by the simulator and the servers.
//!
//! An encoder runs one batch at a time: when it is idle and items wait, it takes the
//! longest run of waiting items of one modality from the head of its queue, up to
//! `max_batch`, and encodes them together. Images batch well (one ViT pass for many);
//! a video or an audio item is a batch of its own frames or windows.

use std::collections::VecDeque;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use switchyard_core::Modality;
use switchyard_core::perf::interpolate;

use crate::InvalidConfig;

/// Time to encode, per modality, in milliseconds. Defaults: a ViT-L/14 at 336 px for
/// images (576 tokens; one image 4.8 ms, 32 in one batch 29.7 ms), video at 1.6 ms per
/// frame (30 frames ≈ 48 ms), Whisper at 85 ms per 30 s window of 1,500 tokens.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EncoderCost {
    /// (images in the batch, milliseconds), increasing; linear between points and beyond
    /// the last.
    pub image_batch_ms: Vec<(f64, f64)>,
    /// Tokens per image (to count images in an item from its tokens).
    pub image_tokens: u32,
    pub video_frame_ms: f64,
    /// Tokens per video frame.
    pub video_frame_tokens: u32,
    pub audio_window_ms: f64,
    /// Tokens per 30 s audio window.
    pub audio_window_tokens: u32,
    /// Most images in one batch.
    pub max_batch: u32,
    /// Bytes of embeddings per media token sent from the encoder to the LLM worker (the
    /// LLM's hidden size × the dtype's bytes; default 4,096 × 2, fp16 of a 7B model).
    pub embedding_bytes_per_token: u64,
    /// The link those embeddings cross, in GB/s (0: free, the encoder is in the process).
    pub link_gbps: f64,
}

impl Default for EncoderCost {
    fn default() -> Self {
        EncoderCost {
            image_batch_ms: vec![
                (1.0, 4.8),
                (4.0, 7.2),
                (8.0, 10.1),
                (16.0, 16.3),
                (32.0, 29.7),
            ],
            image_tokens: 576,
            video_frame_ms: 1.6,
            video_frame_tokens: 144,
            audio_window_ms: 85.0,
            audio_window_tokens: 1_500,
            max_batch: 32,
            embedding_bytes_per_token: 8_192,
            link_gbps: 25.0,
        }
    }
}

impl EncoderCost {
    /// Time to encode a batch of `items` (all of one modality).
    pub fn batch_time(&self, items: &[MediaWork]) -> Duration {
        let Some(first) = items.first() else {
            return Duration::ZERO;
        };
        let ms = match first.modality {
            Modality::Image => {
                let images: u32 = items.iter().map(|i| self.units(i)).sum();
                interpolate(&self.image_batch_ms, f64::from(images))
            }
            Modality::Video => items
                .iter()
                .map(|i| f64::from(self.units(i)) * self.video_frame_ms)
                .sum(),
            Modality::Audio => items
                .iter()
                .map(|i| f64::from(self.units(i)) * self.audio_window_ms)
                .sum(),
        };
        Duration::from_secs_f64(ms.max(0.0) / 1e3)
    }

    /// Time to move the embeddings of `tokens` media tokens to the LLM worker.
    pub fn transfer_time(&self, tokens: u64) -> Duration {
        if self.link_gbps <= 0.0 {
            return Duration::ZERO;
        }
        let bytes = tokens.saturating_mul(self.embedding_bytes_per_token) as f64;
        Duration::try_from_secs_f64(bytes / (self.link_gbps * 1e9)).unwrap_or(Duration::MAX)
    }

    /// Images, frames or windows in an item, from its tokens (at least one).
    pub fn units(&self, item: &MediaWork) -> u32 {
        let per = match item.modality {
            Modality::Image => self.image_tokens,
            Modality::Video => self.video_frame_tokens,
            Modality::Audio => self.audio_window_tokens,
        };
        item.tokens.div_ceil(per.max(1)).max(1)
    }

    /// Checks the settings, naming the first that cannot work (keys relative to the
    /// cost's own table).
    pub fn validate(&self) -> Result<(), InvalidConfig> {
        if self.image_batch_ms.is_empty()
            || self.image_batch_ms.windows(2).any(|w| w[1].0 <= w[0].0)
            || self
                .image_batch_ms
                .iter()
                .any(|&(n, ms)| !n.is_finite() || n < 1.0 || !ms.is_finite() || ms < 0.0)
        {
            return Err(InvalidConfig::new(
                "image_batch_ms",
                "must be (batch, ms) points with batches increasing from 1 and finite, non-negative times",
            ));
        }
        for (name, value) in [
            ("video_frame_ms", self.video_frame_ms),
            ("audio_window_ms", self.audio_window_ms),
            ("link_gbps", self.link_gbps),
        ] {
            if !value.is_finite() || value < 0.0 {
                return Err(InvalidConfig::new(
                    name,
                    "must be a finite, non-negative number",
                ));
            }
        }
        for (name, value) in [
            ("max_batch", u64::from(self.max_batch)),
            ("image_tokens", u64::from(self.image_tokens)),
            ("video_frame_tokens", u64::from(self.video_frame_tokens)),
            ("audio_window_tokens", u64::from(self.audio_window_tokens)),
        ] {
            if value == 0 {
                return Err(InvalidConfig::new(name, "must be at least 1"));
            }
        }
        Ok(())
    }
}

/// What a frontend knows of its encoder workers' work: the estimated milliseconds of the
/// jobs it sent each and has not heard back from, and whose turn it is. The frontend and
/// the simulator keep it alike, so a joint routing decision is made from what a frontend
/// can know (not from the simulator's view of the encoders' queues).
#[derive(Debug, Clone)]
pub struct EncoderLedger<K: Ord + Copy> {
    turn: usize,
    outstanding: std::collections::BTreeMap<K, f64>,
}

impl<K: Ord + Copy> Default for EncoderLedger<K> {
    fn default() -> Self {
        EncoderLedger {
            turn: 0,
            outstanding: std::collections::BTreeMap::new(),
        }
    }
}

impl<K: Ord + Copy> EncoderLedger<K> {
    /// Orders `encoders` by `policy`: in turn (a turn per call), or the least outstanding
    /// work first (ties by key).
    pub fn order(&mut self, policy: EncoderPolicy, encoders: &mut [K]) {
        encoders.sort_unstable();
        match policy {
            EncoderPolicy::RoundRobin => {
                let n = encoders.len().max(1);
                encoders.rotate_left(self.turn % n);
                self.turn = self.turn.wrapping_add(1);
            }
            EncoderPolicy::Soonest => {
                encoders.sort_by(|a, b| {
                    self.outstanding_ms(*a)
                        .total_cmp(&self.outstanding_ms(*b))
                        .then(a.cmp(b))
                });
            }
        }
    }

    /// The estimated work outstanding on `encoder`, in milliseconds.
    pub fn outstanding_ms(&self, encoder: K) -> f64 {
        self.outstanding.get(&encoder).copied().unwrap_or(0.0)
    }

    /// A job of an estimated `ms` went to `encoder`.
    pub fn charge(&mut self, encoder: K, ms: f64) {
        *self.outstanding.entry(encoder).or_insert(0.0) += ms;
    }

    /// The job of `ms` on `encoder` is answered.
    pub fn discharge(&mut self, encoder: K, ms: f64) {
        if let Some(v) = self.outstanding.get_mut(&encoder) {
            *v = (*v - ms).max(0.0);
        }
    }
}

/// The estimated time of a job of `items` on an idle encoder, in milliseconds: each item
/// on its own (how they batch with other requests' is not known when it is sent).
pub fn job_estimate_ms(cost: &EncoderCost, items: impl IntoIterator<Item = MediaWork>) -> f64 {
    items
        .into_iter()
        .map(|work| cost.batch_time(&[work]).as_secs_f64() * 1e3)
        .sum()
}

/// One media item to encode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MediaWork {
    /// Who asked (a request id, or any key the caller maps back).
    pub owner: u64,
    pub modality: Modality,
    pub tokens: u32,
}

/// How the pool picks an encoder for an item.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EncoderPolicy {
    /// In turn, whatever each has queued.
    RoundRobin,
    /// The encoder that would finish it soonest, counting what it runs and has queued.
    #[default]
    Soonest,
}

impl EncoderPolicy {
    pub fn name(self) -> &'static str {
        match self {
            EncoderPolicy::RoundRobin => "round-robin",
            EncoderPolicy::Soonest => "soonest",
        }
    }
}

#[derive(Debug, Clone, Default)]
struct Encoder {
    queue: VecDeque<MediaWork>,
    /// The batch being encoded and when it ends.
    running: Option<(Vec<MediaWork>, Duration)>,
    /// Time spent encoding, for utilisation.
    busy: Duration,
}

/// A pool of identical encoders.
#[derive(Debug, Clone)]
pub struct EncoderPool {
    cost: EncoderCost,
    policy: EncoderPolicy,
    encoders: Vec<Encoder>,
    next: usize,
}

/// A batch an encoder started: it ends at `ends`, then its items are encoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Started {
    pub encoder: usize,
    pub ends: Duration,
}

impl EncoderPool {
    pub fn new(encoders: usize, cost: EncoderCost, policy: EncoderPolicy) -> Self {
        EncoderPool {
            cost,
            policy,
            encoders: vec![Encoder::default(); encoders.max(1)],
            next: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.encoders.len()
    }

    pub fn is_empty(&self) -> bool {
        self.encoders.is_empty()
    }

    pub fn cost(&self) -> &EncoderCost {
        &self.cost
    }

    /// When `encoder` would finish `item` if it were queued there now: what it runs, then
    /// its queue in batches, then the item (alone, or in the last batch if it fits).
    pub fn ready_at(&self, encoder: usize, item: &MediaWork, now: Duration) -> Duration {
        let e = &self.encoders[encoder];
        let mut at = e.running.as_ref().map_or(now, |(_, ends)| (*ends).max(now));
        let mut queue: Vec<MediaWork> = e.queue.iter().copied().collect();
        queue.push(*item);
        while !queue.is_empty() {
            let n = self.batch_len(&queue);
            at += self.cost.batch_time(&queue[..n]);
            queue.drain(..n);
        }
        at
    }

    /// Queues `item` on the encoder the policy picks; returns that encoder and, if it was
    /// idle, the batch it starts now.
    pub fn submit(&mut self, item: MediaWork, now: Duration) -> (usize, Option<Started>) {
        let encoder = match self.policy {
            EncoderPolicy::RoundRobin => {
                let e = self.next % self.encoders.len();
                self.next = self.next.wrapping_add(1);
                e
            }
            EncoderPolicy::Soonest => (0..self.encoders.len())
                .min_by_key(|&e| self.ready_at(e, &item, now))
                .unwrap_or(0),
        };
        self.encoders[encoder].queue.push_back(item);
        let started = self.start(encoder, now);
        (encoder, started)
    }

    /// Queues `item` on `encoder` (chosen by the caller); returns the batch it starts now,
    /// if it was idle.
    pub fn submit_to(&mut self, encoder: usize, item: MediaWork, now: Duration) -> Option<Started> {
        let encoder = encoder.min(self.encoders.len().saturating_sub(1));
        self.encoders[encoder].queue.push_back(item);
        self.start(encoder, now)
    }

    /// The batch `encoder` finished at `now`: its items, and the next batch it starts.
    pub fn finish(&mut self, encoder: usize, now: Duration) -> (Vec<MediaWork>, Option<Started>) {
        let done = match self.encoders[encoder].running.take() {
            Some((items, _)) => items,
            None => Vec::new(),
        };
        let started = self.start(encoder, now);
        (done, started)
    }

    /// Time each encoder has spent encoding (batches finished or started).
    pub fn busy(&self) -> Vec<Duration> {
        self.encoders.iter().map(|e| e.busy).collect()
    }

    /// Items waiting or being encoded, over the pool.
    pub fn pending(&self) -> usize {
        self.encoders
            .iter()
            .map(|e| e.queue.len() + e.running.as_ref().map_or(0, |(b, _)| b.len()))
            .sum()
    }

    fn start(&mut self, encoder: usize, now: Duration) -> Option<Started> {
        let n = {
            let e = &self.encoders[encoder];
            if e.running.is_some() || e.queue.is_empty() {
                return None;
            }
            let queue: Vec<MediaWork> = e.queue.iter().copied().collect();
            self.batch_len(&queue)
        };
        let e = &mut self.encoders[encoder];
        let batch: Vec<MediaWork> = e.queue.drain(..n).collect();
        let time = self.cost.batch_time(&batch);
        e.busy += time;
        let ends = now + time;
        e.running = Some((batch, ends));
        Some(Started { encoder, ends })
    }

    /// How many items from the head of `queue` go in one batch: images together up to
    /// `max_batch` images; anything else alone.
    fn batch_len(&self, queue: &[MediaWork]) -> usize {
        match queue.first() {
            Some(first) if first.modality == Modality::Image => {
                let mut images = 0;
                queue
                    .iter()
                    .take_while(|item| {
                        images += self.cost.units(item);
                        item.modality == Modality::Image
                            && (images <= self.cost.max_batch || images == self.cost.units(item))
                    })
                    .count()
                    .max(1)
            }
            Some(_) => 1,
            None => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(owner: u64) -> MediaWork {
        MediaWork {
            owner,
            modality: Modality::Image,
            tokens: 576,
        }
    }

    fn video(owner: u64, frames: u32) -> MediaWork {
        MediaWork {
            owner,
            modality: Modality::Video,
            tokens: frames * 144,
        }
    }

    fn ms(d: Duration) -> f64 {
        d.as_secs_f64() * 1e3
    }

    #[test]
    fn the_cost_follows_the_batching_curve() {
        let cost = EncoderCost::default();
        let images = |n: u64| (0..n).map(image).collect::<Vec<_>>();
        assert!((ms(cost.batch_time(&images(1))) - 4.8).abs() < 1e-9);
        assert!((ms(cost.batch_time(&images(32))) - 29.7).abs() < 1e-9);
        // Between points, linearly: 6 images between 4 (7.2) and 8 (10.1).
        assert!((ms(cost.batch_time(&images(6))) - 8.65).abs() < 1e-9);
        // Past the last point, the last slope goes on.
        let slope = (29.7 - 16.3) / 16.0;
        assert!((ms(cost.batch_time(&images(40))) - (29.7 + 8.0 * slope)).abs() < 1e-9);
        assert!((ms(cost.batch_time(&[video(1, 30)])) - 48.0).abs() < 1e-9);
        let audio = MediaWork {
            owner: 1,
            modality: Modality::Audio,
            tokens: 3_000,
        };
        assert!((ms(cost.batch_time(&[audio])) - 170.0).abs() < 1e-9);
        assert!(cost.validate().is_ok());
        let bad = EncoderCost {
            image_batch_ms: vec![(4.0, 1.0), (2.0, 3.0)],
            ..EncoderCost::default()
        };
        assert!(bad.validate().is_err());
    }

    #[test]
    fn an_idle_encoder_starts_at_once_and_later_items_batch_together() {
        let mut pool = EncoderPool::new(1, EncoderCost::default(), EncoderPolicy::Soonest);
        let t0 = Duration::ZERO;
        let (e, started) = pool.submit(image(1), t0);
        assert_eq!(e, 0);
        let first = started.unwrap();
        assert!((ms(first.ends) - 4.8).abs() < 1e-9);
        // Three more while it runs: queued, then one batch of three.
        for owner in 2..5 {
            assert_eq!(pool.submit(image(owner), Duration::from_millis(1)).1, None);
        }
        assert_eq!(pool.pending(), 4);
        let (done, next) = pool.finish(0, first.ends);
        assert_eq!(done.iter().map(|i| i.owner).collect::<Vec<_>>(), [1]);
        let next = next.unwrap();
        let three = interpolate(&EncoderCost::default().image_batch_ms, 3.0);
        assert!((ms(next.ends - first.ends) - three).abs() < 1e-9);
        let (done, idle) = pool.finish(0, next.ends);
        assert_eq!(done.len(), 3);
        assert_eq!(idle, None);
        assert_eq!(pool.pending(), 0);
        assert!((ms(pool.busy()[0]) - (4.8 + three)).abs() < 1e-9);
    }

    #[test]
    fn a_video_is_a_batch_of_its_own_and_images_stop_at_the_cap() {
        let cost = EncoderCost {
            max_batch: 4,
            ..EncoderCost::default()
        };
        let pool = EncoderPool::new(1, cost, EncoderPolicy::Soonest);
        let queue = [image(1), image(2), video(3, 30), image(4)];
        assert_eq!(pool.batch_len(&queue), 2);
        assert_eq!(pool.batch_len(&queue[2..]), 1);
        let many: Vec<MediaWork> = (0..10).map(image).collect();
        assert_eq!(pool.batch_len(&many), 4);
    }

    #[test]
    fn soonest_avoids_a_busy_encoder_and_round_robin_does_not() {
        let now = Duration::ZERO;
        for (policy, second) in [(EncoderPolicy::Soonest, 1), (EncoderPolicy::RoundRobin, 1)] {
            let mut pool = EncoderPool::new(2, EncoderCost::default(), policy);
            assert_eq!(pool.submit(video(1, 300), now).0, 0);
            assert_eq!(pool.submit(image(2), now).0, second);
        }
        // Encoder 0 runs a long video, encoder 1 a short image: the third item goes to 1
        // with `soonest`, to 0 in turn with round robin.
        let mut soonest = EncoderPool::new(2, EncoderCost::default(), EncoderPolicy::Soonest);
        let mut turn = EncoderPool::new(2, EncoderCost::default(), EncoderPolicy::RoundRobin);
        for pool in [&mut soonest, &mut turn] {
            pool.submit(video(1, 300), now);
            pool.submit(image(2), now);
        }
        assert_eq!(soonest.submit(image(3), now).0, 1);
        assert_eq!(turn.submit(image(3), now).0, 0);
        // Its prediction counts the running batch and the queue.
        let ready = soonest.ready_at(1, &image(4), now);
        assert!(ms(ready) > 4.8 * 2.0 - 1e-9, "{ready:?}");
    }

    use proptest::prelude::*;

    proptest! {
        /// Driven by arrivals and batch ends in time order, every item is encoded exactly
        /// once, each encoder keeps its queue order and runs one batch at a time, no item
        /// ends before it arrived plus its own cost, and the busy time is what the batches
        /// took.
        #[test]
        fn every_item_is_encoded_once_in_order(
            arrivals in proptest::collection::vec((0u64..50, 0u8..3, 1u32..40), 1..60),
            encoders in 1usize..4,
            round_robin in any::<bool>(),
        ) {
            let policy = if round_robin { EncoderPolicy::RoundRobin } else { EncoderPolicy::Soonest };
            let cost = EncoderCost { max_batch: 8, ..EncoderCost::default() };
            let mut pool = EncoderPool::new(encoders, cost.clone(), policy);
            let mut items: Vec<(Duration, MediaWork)> = Vec::new();
            let mut at = Duration::ZERO;
            for (i, &(gap, kind, units)) in arrivals.iter().enumerate() {
                at += Duration::from_millis(gap);
                let (modality, per) = match kind {
                    0 => (Modality::Image, 576),
                    1 => (Modality::Video, 144),
                    _ => (Modality::Audio, 1_500),
                };
                let units = if modality == Modality::Image { 1 } else { units };
                items.push((at, MediaWork { owner: i as u64, modality, tokens: units * per }));
            }
            let mut ends: Vec<Option<Duration>> = vec![None; encoders];
            let mut queued_on: Vec<Vec<u64>> = vec![Vec::new(); encoders];
            let mut done_on: Vec<Vec<u64>> = vec![Vec::new(); encoders];
            let mut finished_at = vec![None; items.len()];
            let mut batch_total = Duration::ZERO;
            let mut next = 0;
            loop {
                let arrival = items.get(next).map(|(t, _)| *t);
                let end = ends.iter().enumerate().filter_map(|(e, t)| t.map(|t| (t, e))).min();
                match (arrival, end) {
                    (Some(a), end) if end.is_none_or(|(t, _)| a < t) => {
                        let (e, started) = pool.submit(items[next].1, a);
                        queued_on[e].push(items[next].1.owner);
                        if let Some(s) = started {
                            prop_assert!(ends[e].is_none(), "a second batch on a busy encoder");
                            batch_total += s.ends - a;
                            ends[e] = Some(s.ends);
                        }
                        next += 1;
                    }
                    (_, Some((t, e))) => {
                        let (done, started) = pool.finish(e, t);
                        ends[e] = None;
                        for item in done {
                            prop_assert!(finished_at[item.owner as usize].is_none());
                            finished_at[item.owner as usize] = Some(t);
                            done_on[e].push(item.owner);
                        }
                        if let Some(s) = started {
                            batch_total += s.ends - t;
                            ends[e] = Some(s.ends);
                        }
                    }
                    _ => break,
                }
            }
            prop_assert_eq!(pool.pending(), 0);
            prop_assert_eq!(&done_on, &queued_on);
            for (i, (arrived, item)) in items.iter().enumerate() {
                let end = finished_at[i].unwrap();
                // A batch holding the item lasts at least as long as the item alone.
                prop_assert!(end >= *arrived + cost.batch_time(&[*item]));
            }
            let busy: Duration = pool.busy().iter().sum();
            prop_assert_eq!(busy, batch_total);
        }
    }
}
