//! The routing decisions: a worker for a request, a (prefill, decode) pair, and joint
//! routing of requests with media.

use std::time::Duration;

use rand::Rng;
use switchyard_core::{MediaSpan, RequestId, TokenBlocks, WorkerId, WorkerKey};

use super::RoutingCore;
use super::health::HealthState;
use super::registry::{CacheView, WorkerEntry};
use crate::indexer::OverlapScores;
use crate::policy::RoutingOverrides;
use crate::router::{RouteDecision, RouteError, RouteRequest};

/// When a request served by a decode worker has its prompt computed on a prefill worker
/// (conditional disaggregation, as Dynamo decides it): only when the part of the prompt the
/// decode worker lacks is long enough to be worth a transfer, and the prefill pool is not
/// saturated. Otherwise the decode worker prefills it itself.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DisaggConfig {
    /// Uncached prompt tokens (on the decode worker) up to which it prefills locally.
    pub local_prefill_tokens: u64,
    /// The prefill pool is saturated when the chosen prefill worker already has this many
    /// prompt tokens routed to it and not yet computed: then prefill locally.
    pub max_prefill_queue_tokens: u64,
}

impl Default for DisaggConfig {
    fn default() -> Self {
        DisaggConfig {
            local_prefill_tokens: 512,
            max_prefill_queue_tokens: 131_072,
        }
    }
}

impl DisaggConfig {
    /// Checks the ranges serde cannot.
    pub fn validate(&self) -> Result<(), crate::InvalidConfig> {
        if self.max_prefill_queue_tokens == 0 {
            return Err(crate::InvalidConfig::new(
                "disagg.max_prefill_queue_tokens",
                "must be at least 1",
            ));
        }
        Ok(())
    }
}

/// Where a request goes: its decode (or aggregated) worker, and the prefill worker that
/// computes its prompt first, when it is disaggregated.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PairDecision {
    /// The worker that generates the tokens (and prefills, when `prefill` is none), as
    /// recorded: with a remote prefill it computes none of the prompt.
    pub decode: RouteDecision,
    /// The remote prefill, tracked under [`RequestId::prefill_stage`] until
    /// [`RoutingCore::prefill_finished`].
    pub prefill: Option<RouteDecision>,
}

/// Why a request that could have been disaggregated was prefilled on its decode worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LocalReason {
    /// The uncached part of the prompt is short.
    Short,
    /// The chosen prefill worker is busy past the queue limit.
    Saturated,
    /// No prefill worker may take it (none is routable, or all failed it).
    Unavailable,
    /// Its media were not encoded: only its decode worker's cache holds them (see
    /// [`crate::RoutingOverrides::held_media`]).
    HeldMedia,
}

impl LocalReason {
    /// Its name in metrics and reports (`local_short`, ...).
    pub fn name(self) -> &'static str {
        match self {
            LocalReason::Short => "local_short",
            LocalReason::Saturated => "local_saturated",
            LocalReason::Unavailable => "local_unavailable",
            LocalReason::HeldMedia => "local_media",
        }
    }
}

/// A request to route.
#[derive(Debug, Clone, Copy)]
pub struct RouteQuery<'a> {
    pub id: RequestId,
    /// The prompt cut into the model's blocks ([`switchyard_core::blocks_for`] at
    /// [`RoutingCore::block_size`]).
    pub blocks: &'a TokenBlocks,
    pub overrides: RoutingOverrides,
    /// Workers that must not get it (they failed it already).
    pub exclude: &'a [WorkerId],
}

/// The router's view of a query.
pub(super) fn route_request<'q>(query: &RouteQuery<'q>) -> RouteRequest<'q> {
    RouteRequest {
        id: query.id,
        isl_tokens: query.blocks.total_tokens() as u64,
        seq_hashes: query.blocks.sequence_hashes(),
        overrides: query.overrides,
    }
}

impl RoutingCore {
    /// Picks a worker for a request and records it as active there. `events` are the
    /// caller's indexer's matches for the prompt's blocks (only workers seen through events
    /// are read from it).
    pub fn route(
        &mut self,
        query: &RouteQuery<'_>,
        events: &OverlapScores,
        now: Duration,
    ) -> Result<RouteDecision, RouteError> {
        self.tick(now);
        self.admission.settled(query.id);
        let overlaps = self.overlaps(query, events, now);
        let overlaps = overlaps.as_ref();
        let decision = self.choose(query, overlaps, now, |e| e.serving())?;
        let request = route_request(query);
        self.router.record(&request, &decision, now)?;
        self.record_approx(query, &decision, now);
        Ok(decision)
    }

    /// Joint routing of a prompt with `media`: the worker
    /// predicted to give the first token soonest when it holds the media's KV already (so
    /// encoding them would be wasted: the request is to go there), given `encode` until the
    /// media could reach any other worker. None when that worker needs the media encoded,
    /// when no worker could serve them from its cache (see
    /// [`crate::flow::media::held_blocks`]), or when none serves.
    pub fn sooner_holder(
        &mut self,
        id: RequestId,
        blocks: &TokenBlocks,
        media: &[MediaSpan],
        events: &OverlapScores,
        encode: Duration,
        now: Duration,
    ) -> Option<WorkerId> {
        let end = media.iter().map(MediaSpan::end).max()?;
        let needed =
            crate::flow::media::held_blocks(end, blocks.total_tokens() as u64, self.block_size())?;
        let query = RouteQuery {
            id,
            blocks,
            overrides: RoutingOverrides::default(),
            exclude: &[],
        };
        match self.joint_media_choice(&query, events, needed, encode, now)? {
            (holder, false) => Some(holder),
            (_, true) => None,
        }
    }

    /// Joint routing of a request with media (without recording it): the `latency`
    /// policy's cost on every serving worker (its predicted time to first token, plus the
    /// weighted delay to its running decodes and its memory penalty), where a worker
    /// holding the request's blocks up to `needed_blocks` (its media's KV) starts at once,
    /// and any other only once the media is encoded and moved to it (`encode`: the
    /// encoders' predicted finish plus the transfer), its queue draining meanwhile:
    /// max(encode, its queued prefill) + the request's own prefill. Returns the cheapest
    /// worker and whether it needs the media encoded; none when no worker serves.
    pub fn joint_media_choice(
        &mut self,
        query: &RouteQuery<'_>,
        events: &OverlapScores,
        needed_blocks: u32,
        encode: Duration,
        now: Duration,
    ) -> Option<(WorkerId, bool)> {
        self.tick(now);
        let overlaps = self.overlaps(query, events, now).into_owned();
        let keys: Vec<WorkerKey> = self
            .registry
            .iter()
            .filter(|e| e.serving() && !query.exclude.contains(&e.spec.id))
            .flat_map(|e| e.spec.keys())
            .collect();
        let request = route_request(query);
        let candidates = self
            .router
            .candidates_among(&keys, &request, &overlaps, now);
        let encode_ms = encode.as_secs_f64() * 1e3;
        candidates
            .iter()
            .map(|c| {
                let (_, cost) = self.router.latency_prediction(&request, c);
                let holds = c.overlap_blocks >= needed_blocks;
                if holds {
                    (cost, c.worker.worker_id, false)
                } else {
                    let queue_ms =
                        self.router.queued_prefill_time(c.worker, now).as_secs_f64() * 1e3;
                    (
                        cost - queue_ms.min(encode_ms) + encode_ms,
                        c.worker.worker_id,
                        true,
                    )
                }
            })
            .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)))
            .map(|(_, worker, encode)| (worker, encode))
    }

    /// Routes a request in a fleet that may have prefill and decode workers: picks the
    /// worker that generates its tokens as [`RoutingCore::route`] does (among aggregated
    /// and decode workers), then, when that is a decode worker, decides whether its prompt
    /// is computed on a prefill worker (see [`DisaggConfig`]) and picks that worker by the
    /// same policy (KV overlap and prefill queue) among the prefill workers. Both are
    /// recorded: the decode worker with nothing to prefill when the prefill is remote, the
    /// prefill worker under [`RequestId::prefill_stage`]. Returns why a request that could
    /// have gone remote stayed local, if it did.
    pub fn route_pair(
        &mut self,
        query: &RouteQuery<'_>,
        events: &OverlapScores,
        now: Duration,
    ) -> Result<(PairDecision, Option<LocalReason>), RouteError> {
        self.tick(now);
        self.admission.settled(query.id);
        let overlaps = self.overlaps(query, events, now);
        let overlaps = overlaps.as_ref();
        let decode = self.choose(query, overlaps, now, |e| e.serving())?;
        let request = route_request(query);
        let disaggregated = self
            .registry
            .get(decode.worker.worker_id)
            .is_some_and(|e| e.spec.role == switchyard_core::WorkerRole::Decode);
        let mut local = None;
        let mut prefill = None;
        let mut decode = decode;
        if disaggregated {
            if decode.prefill_tokens <= self.config.disagg.local_prefill_tokens {
                local = Some(LocalReason::Short);
            } else if query.overrides.held_media {
                local = Some(LocalReason::HeldMedia);
            } else {
                let prefill_worker = |e: &WorkerEntry| {
                    e.routable() && e.spec.role == switchyard_core::WorkerRole::Prefill
                };
                match self.choose(query, overlaps, now, prefill_worker).ok() {
                    Some(p)
                        if self.router.load(p.worker).prefill_tokens
                            < self.config.disagg.max_prefill_queue_tokens =>
                    {
                        prefill = Some(p);
                    }
                    Some(_) => local = Some(LocalReason::Saturated),
                    None => local = Some(LocalReason::Unavailable),
                }
            }
        }
        match prefill {
            Some(p) => {
                let stage = RouteRequest {
                    id: query.id.prefill_stage(),
                    ..request
                };
                self.router.record(&stage, &p, now)?;
                // The decode worker computes none of the prompt.
                decode.prefill_tokens = 0;
                if let Err(e) = self.router.record(&request, &decode, now) {
                    self.router.free(stage.id);
                    return Err(e);
                }
                self.record_approx(query, &p, now);
                self.record_approx(query, &decode, now);
            }
            None => {
                self.router.record(&request, &decode, now)?;
                self.record_approx(query, &decode, now);
            }
        }
        Ok((PairDecision { decode, prefill }, local))
    }

    /// Picks (without recording) among the workers `eligible` accepts and `query` does not
    /// exclude, suspicious ones for their weighted share. `overlaps`: the cache views
    /// already merged (see [`RoutingCore::merged_overlaps`]).
    pub(super) fn choose(
        &mut self,
        query: &RouteQuery<'_>,
        overlaps: &OverlapScores,
        now: Duration,
        eligible: impl Fn(&WorkerEntry) -> bool,
    ) -> Result<RouteDecision, RouteError> {
        let weight = self.config.health.suspicious_weight;
        let all: Vec<&WorkerEntry> = self
            .registry
            .iter()
            .filter(|e| eligible(e) && !query.exclude.contains(&e.spec.id))
            .collect();
        // A pinned request goes to its worker when that may take it, even a suspicious one.
        let pinned: Vec<&WorkerEntry> = all
            .iter()
            .copied()
            .filter(|e| query.overrides.worker == Some(e.spec.id))
            .collect();
        let mut chosen: Vec<&WorkerEntry> = Vec::with_capacity(all.len());
        if pinned.is_empty() {
            for &e in &all {
                if e.health.state == HealthState::Healthy || self.rng.random::<f64>() < weight {
                    chosen.push(e);
                }
            }
        } else {
            chosen = pinned;
        }
        if chosen.is_empty() {
            chosen = all;
        }
        let keys: Vec<WorkerKey> = chosen.iter().flat_map(|e| e.spec.keys()).collect();
        let request = route_request(query);
        let candidates = self.router.candidates_among(&keys, &request, overlaps, now);
        self.router.select(&request, &candidates)
    }

    /// Records a routed request in the approximate view of a worker seen through it.
    pub(super) fn record_approx(
        &mut self,
        query: &RouteQuery<'_>,
        decision: &RouteDecision,
        now: Duration,
    ) {
        if self
            .registry
            .get(decision.worker.worker_id)
            .is_some_and(|e| e.view == CacheView::Approximate)
        {
            self.approx.record_routed(
                decision.worker,
                query.blocks.local_hashes(),
                query.blocks.sequence_hashes(),
                now,
            );
        }
    }

    /// The cache views to route by: the caller's events, merged with the approximate view
    /// when some workers are seen through it.
    pub(super) fn overlaps<'e>(
        &mut self,
        query: &RouteQuery<'_>,
        events: &'e OverlapScores,
        now: Duration,
    ) -> std::borrow::Cow<'e, OverlapScores> {
        if self.approx_workers > 0 {
            std::borrow::Cow::Owned(self.merged_overlaps(query.blocks, events, now))
        } else {
            std::borrow::Cow::Borrowed(events)
        }
    }

    /// Events for event-view workers, the approximate view for the others.
    pub(super) fn merged_overlaps(
        &mut self,
        query: &TokenBlocks,
        events: &OverlapScores,
        now: Duration,
    ) -> OverlapScores {
        let approx = self.approx.find_matches_blocks(query, now);
        let registry = &self.registry;
        let by_events = |key: &WorkerKey| {
            registry
                .get(key.worker_id)
                .is_some_and(|e| e.view == CacheView::Events)
        };
        let mut scores: Vec<(WorkerKey, u32)> = events
            .scores
            .iter()
            .filter(|(k, _)| by_events(k))
            .chain(approx.scores.iter().filter(|(k, _)| !by_events(k)))
            .copied()
            .collect();
        let mut cached: Vec<(WorkerKey, u64)> = events
            .cached_blocks
            .iter()
            .filter(|(k, _)| by_events(k))
            .chain(approx.cached_blocks.iter().filter(|(k, _)| !by_events(k)))
            .copied()
            .collect();
        scores.sort_unstable_by_key(|e| e.0);
        cached.sort_unstable_by_key(|e| e.0);
        OverlapScores {
            scores,
            cached_blocks: cached,
        }
    }
}
