//! Admission in the routing service: the core admits, queues or refuses a request; a
//! queued one waits here on a oneshot until the core releases it. Whenever capacity may
//! have freed, [`RoutingService::pump`] asks the core whom to release next.

use std::sync::Arc;
use std::time::Duration;

use switchyard_core::{Priority, RequestId};
use switchyard_router::{Admission, Rejection};
use tokio::sync::oneshot;

use super::RoutingService;
use super::health::log_degradation;

impl RoutingService {
    /// Offers a request for admission; a queued one waits here until released, or for at
    /// most the queue timeout. Returns a ticket to hold until the request is routed.
    pub async fn admit(
        self: &Arc<Self>,
        id: RequestId,
        priority: Priority,
    ) -> Result<AdmissionTicket, (Rejection, Option<Duration>)> {
        let now = self.now();
        let (admission, timeout, hint) = {
            let mut core = self.core.lock();
            let admission = core.admit(id, priority, now);
            // A request refused for its predicted wait retries once that wait has passed.
            let hint = match admission {
                Admission::Rejected(Rejection::WaitTooLong) => core.predicted_wait(priority, now),
                _ => None,
            };
            if let Some(state) = core.take_degradation_change() {
                log_degradation(&state);
            }
            let timeout = core.queue_timeout(priority);
            if admission == Admission::Queued {
                let (tx, rx) = oneshot::channel();
                self.waiters.lock().insert(id, tx);
                (Err(rx), timeout, hint)
            } else {
                (Ok(admission), timeout, hint)
            }
        };
        let ticket = AdmissionTicket {
            routing: Arc::clone(self),
            id,
        };
        match admission {
            Ok(Admission::Admitted) => Ok(ticket),
            Ok(Admission::Rejected(rejection)) => Err((rejection, hint)),
            Ok(Admission::Queued) => unreachable!("handled above"),
            // Dropping the ticket withdraws the request, whichever way this ends (timed
            // out, or the client left and this future was dropped).
            Err(released) => match tokio::time::timeout(timeout, released).await {
                Ok(Ok(Ok(()))) => Ok(ticket),
                Ok(Ok(Err(retry))) => Err((Rejection::WaitTooLong, Some(retry))),
                _ => Err((Rejection::TimedOut, None)),
            },
        }
    }

    /// A future that completes at the fleet's next change (see [`Self::pump`]); create it
    /// before looking, so a change in between is not missed.
    pub fn fleet_changed(&self) -> tokio::sync::futures::Notified<'_> {
        self.fleet_changed.notified()
    }

    /// Releases queued requests while the core allows.
    pub(super) fn pump(&self) {
        let now = self.now();
        let mut core = self.core.lock();
        // Those that can no longer start in time are told so now, not at their timeout.
        for (id, retry) in core.overdue(now) {
            if let Some(waiter) = self.waiters.lock().remove(&id) {
                let _ = waiter.send(Err(retry));
            }
        }
        while let Some(id) = core.next_admitted(now) {
            let woken = self
                .waiters
                .lock()
                .remove(&id)
                .is_some_and(|waiter| waiter.send(Ok(())).is_ok());
            if woken {
                return;
            }
            // Its waiter is gone: it gave up between being released and now.
            core.withdraw(id, now);
        }
    }

    /// Requests waiting for admission, per tier (lowest first).
    pub fn queued(&self) -> [usize; 3] {
        self.core.lock().admission().by_tier()
    }
}

/// Held by an admitted request until it has been routed; dropping it lets the next queued
/// request go (and withdraws this one if it was still queued).
#[derive(Debug)]
pub struct AdmissionTicket {
    routing: Arc<RoutingService>,
    id: RequestId,
}

impl Drop for AdmissionTicket {
    fn drop(&mut self) {
        let now = self.routing.now();
        let withdrawn = {
            let mut core = self.routing.core.lock();
            self.routing.waiters.lock().remove(&self.id);
            core.withdraw(self.id, now)
        };
        if withdrawn {
            self.routing.pump();
        }
    }
}
