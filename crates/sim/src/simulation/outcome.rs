//! What a run reports: latency distributions, fleet figures, and each request's fate.

use std::time::Duration;

use switchyard_core::protocol::FinishReason;

use super::{Fleet, Outcome, RequestState, Slot};
use crate::report::{LoadSpread, RequestRecord, SimReport, Throughput};
use crate::scaling::{SlaAttainment, SlaTargets};
use crate::sessions::{SessionReport, TurnOutcome};

impl Fleet<'_> {
    pub(super) fn finish(mut self) -> SimReport {
        debug_assert!(
            self.requests.iter().all(|r| r.outcome != Outcome::Pending)
                && self.core.active_requests() == 0
                && self.transfers.is_empty(),
            "the run ended with work in flight"
        );
        let end = self.last_event;
        let span = end.as_secs_f64().max(f64::MIN_POSITIVE);
        let r = &mut self.report;
        r.policy = self.core.config().router.policy.name().to_string();
        r.workers = self.config.workers;
        r.ttft_ms = self.ttft.distribution();
        if self.media.requests > 0 {
            let mut media = std::mem::take(&mut self.media);
            media.ttft_ms_by_class = self
                .ttft_by_class
                .iter()
                .map(|(class, rec)| (*class, rec.distribution()))
                .collect();
            if let Some(pool) = self.media_life.as_ref().map(|m| m.pool()) {
                let busy: Duration = pool.busy().iter().sum();
                media.encoders = pool.len() as u32;
                media.encoder_utilisation =
                    busy.as_secs_f64() / (span * pool.len() as f64).max(f64::MIN_POSITIVE);
                media.encode_wait_ms = self.encode_wait.distribution();
            }
            r.media = Some(media);
        }
        r.itl_ms = self.itl.distribution();
        r.tpot_ms = self.tpot.distribution();
        r.e2e_ms = self.e2e.distribution();
        r.throughput = Throughput {
            requests_per_sec: r.completed as f64 / span,
            output_tokens_per_sec: r.output_tokens as f64 / span,
        };
        r.cache_hit_rate = if r.prompt_tokens == 0 {
            0.0
        } else {
            r.cached_tokens as f64 / r.prompt_tokens as f64
        };
        r.preemptions = self.engines.iter().map(|e| e.stats().preemptions).sum();
        r.engine_steps = self.engines.iter().map(|e| e.stats().steps).sum();
        r.load_spread =
            LoadSpread::from_counts(&self.per_worker_requests, &self.per_worker_prefill);
        r.simulated_seconds = end.as_secs_f64();
        if let Some(targets) = self.config.sla_targets {
            r.sla = Some(attainment(targets, &self.requests));
        }
        if self.workload.requests.iter().any(|q| q.turn.is_some()) {
            let turns = self.workload.requests.iter().zip(&self.requests);
            r.sessions = Some(SessionReport::build(turns.filter_map(
                |(request, state)| {
                    let turn = request.turn.as_ref()?;
                    let after = turn.after.as_ref();
                    Some(TurnOutcome {
                        session: turn.session,
                        turn: turn.turn,
                        sent: state.arrived,
                        first_token: state.first_token,
                        ended: state.ended,
                        delay: after.map_or(Duration::ZERO, |a| a.delay),
                        tool_wait: after.map_or(Duration::ZERO, |a| a.tool_wait),
                    })
                },
            )));
        }
        if let Some(disagg) = &self.config.disagg {
            let mut report = std::mem::take(&mut self.disagg);
            report.prefill_workers = disagg.prefill;
            report.decode_workers = self.config.workers - disagg.prefill;
            report.transfer_ms = self.transfer_time.distribution();
            self.report.disagg = Some(report);
        }
        if self.scaling.is_some() {
            let report = self.planner_report(end);
            self.report.planner = Some(report);
        }
        let r = &mut self.report;
        if self.config.faults.any() {
            let mut failures = std::mem::take(&mut self.failures);
            for slot in &self.slots {
                if let Slot::Failed { since, .. } = *slot {
                    failures.worker_seconds_down += end.saturating_sub(since).as_secs_f64();
                }
            }
            failures.stall_ms = self.stall.distribution();
            failures.moved_e2e_ms = self.moved_e2e.distribution();
            // With no fault drawn every request went untouched.
            failures.untouched_e2e_ms = if self.plan.is_empty() {
                self.e2e.distribution()
            } else {
                self.untouched_e2e.distribution()
            };
            r.failures = Some(failures);
        }
        if self.config.record_requests {
            r.request_records = self
                .requests
                .iter()
                .enumerate()
                .map(|(i, s)| RequestRecord {
                    id: i as u64,
                    arrival: s.arrived,
                    worker: s.worker,
                    first_token: s.first_token,
                    finished: s.finished,
                    output_tokens: s.output_tokens,
                    cached_tokens: s.cached_tokens,
                    outcome: match s.outcome {
                        Outcome::Pending => "pending",
                        Outcome::Completed(FinishReason::Length) => "length",
                        Outcome::Completed(FinishReason::Stop) => "stop",
                        Outcome::Completed(FinishReason::Cancelled) => "cancelled",
                        Outcome::Rejected(r) => r.name(),
                        Outcome::Failed(_) => "failed",
                    },
                })
                .collect();
        }
        self.report
    }
}

/// Requests that met the latency targets (their TTFT, and their mean inter-token latency).
fn attainment(targets: SlaTargets, states: &[RequestState]) -> SlaAttainment {
    let mut a = SlaAttainment {
        requests: states.len() as u64,
        ..SlaAttainment::default()
    };
    for state in states {
        let (Outcome::Completed(_), Some(first), Some(end)) =
            (state.outcome, state.first_token, state.finished)
        else {
            continue;
        };
        let ttft_ok = first.saturating_sub(state.arrived) <= targets.ttft;
        let gaps = state.output_tokens.saturating_sub(1);
        let itl_ok = gaps == 0 || end.saturating_sub(first) / gaps <= targets.itl;
        a.ttft_met += u64::from(ttft_ok);
        a.itl_met += u64::from(itl_ok);
        a.within += u64::from(ttft_ok && itl_ok);
    }
    a.share = if a.requests == 0 {
        1.0
    } else {
        a.within as f64 / a.requests as f64
    };
    a
}
