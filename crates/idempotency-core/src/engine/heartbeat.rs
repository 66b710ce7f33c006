//! The heartbeat: keeps a running request's lease from running out.
//!
//! Most requests finish long before their first heartbeat is due (a third of the lease), so a
//! request does not get a task of its own: it registers in a per-engine schedule (a slab: one
//! short lock to take a slot and one to give it back, no ordering work and no allocation once
//! the slab has grown to the requests running at once), and one driver task per engine wakes
//! when the earliest registration is due. Only a request still running then gets a heartbeat
//! task, which extends its lease every third of it until the request finishes. The driver
//! finds the due registrations by scanning the slab, once a period or less: the slab holds the
//! requests running now, not the requests served.
//!
//! Registering never wakes the driver: a wake-up from a worker thread queues the driver in that
//! thread's LIFO slot, where no other worker can run it, and a handler that then blocks the
//! thread would keep it from ever running. Instead the driver never sleeps longer than one
//! period: every lease has the engine's length, so a request registered while it sleeps is due
//! no earlier than the driver wakes, or, if its claim was sent before the driver went to sleep,
//! earlier by at most that claim's round trip: its first heartbeat starts that much late, a
//! small part of the two periods the lease still has.
//!
//! The driver and the heartbeats sleep on a timer thread of their own (`timer.rs`), not
//! on the runtime's timer: Tokio fires its timers only from a worker parked on its driver, and
//! a worker that wakes holding the driver and then runs a handler that blocks its thread
//! leaves every timer of the runtime unattended while the other workers sleep on their
//! condition variables (Tokio's eager hand-off of the driver is an unstable option). A wake-up
//! from another thread goes through the runtime's global queue and unparks an idle worker,
//! which runs the heartbeat and takes the driver when it next parks.

use super::heartbeat_schedule::{DriverAlive, Registration, Schedule, period};
use super::key_claim::KeyClaim;
use super::shared::Shared;
use super::timer::sleep_until;
use crate::error::ErrorChain;
use crate::store::FenceOutcome;
use crate::store::IdempotencyStore;
use crate::sync::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::time::Instant;

impl Schedule {
    /// Registers `claim` for its first heartbeat, a third of its length after its claim was
    /// sent. Returns the registration and whether a driver task was started (it starts on this
    /// worker thread; the caller yields once so that a handler blocking the thread cannot keep
    /// it from starting).
    pub(crate) fn register<S: IdempotencyStore + 'static>(
        self: &Arc<Self>,
        shared: &Arc<Shared<S>>,
        claim: &KeyClaim,
    ) -> (Registration, bool) {
        let registration = self.insert(claim);
        let started = self.claim_driver();
        if started {
            // The flag's guard goes into the task from the start: a runtime that shuts down
            // before the task's first poll drops it there, and the next registration (on
            // another runtime) starts a new driver.
            tokio::spawn(drive(DriverAlive(Arc::clone(self)), Arc::downgrade(shared)));
        }
        (registration, started)
    }
}

/// The driver: sleeps until the earliest registration is due (at most one period), then starts
/// a heartbeat task for each request still running at that point.
async fn drive<S: IdempotencyStore + 'static>(alive: DriverAlive, shared: Weak<Shared<S>>) {
    let schedule = &alive.0;
    loop {
        let closed = schedule.closed_signal.notified();
        tokio::pin!(closed);
        closed.as_mut().enable();
        if schedule.closed.load(Ordering::Acquire) {
            return;
        }
        let now = Instant::now();
        let (due, next) = schedule.due_heartbeats(now);
        if !due.is_empty() {
            let Some(shared) = shared.upgrade() else {
                return;
            };
            for claim in due {
                shared.tasks.spawn(run(Arc::clone(&shared), claim));
            }
        }
        let wake_at = next.map_or(now + schedule.period, |at| at.min(now + schedule.period));
        tokio::select! {
            () = sleep_until(wake_at) => {}
            () = closed => return,
        }
    }
}

/// Extends the lease now and then every third of its length until the request has stored or
/// released its outcome. A failed extension is retried sooner, and goes on being retried after
/// the lease ran out by this process's clock (the store's lease may still run: a store that
/// was slow for a moment must not make the key lapse for good); only the store saying that the
/// token no longer holds the claim marks the lease lost and ends the heartbeat.
async fn run<S: IdempotencyStore + 'static>(shared: Arc<Shared<S>>, claim: KeyClaim) {
    let beat = period(claim.length());
    let mut said_lapsed = false;
    loop {
        if !claim.heartbeat_wanted() {
            return;
        }
        let sent = Instant::now();
        let next = match shared.extend(&claim).await {
            Ok(FenceOutcome::Applied) => {
                claim.renewed(sent);
                said_lapsed = false;
                beat
            }
            Ok(FenceOutcome::Stale) => {
                // While the response is being stored, the completion itself ends the claim.
                if claim.heartbeat_wanted() && !claim.is_completing() {
                    claim.mark_lost();
                    tracing::warn!(
                        backend = shared.store.backend(),
                        "the lease ran out while the request was running; another request may run it too"
                    );
                }
                return;
            }
            Err(error) => {
                if !claim.heartbeat_wanted() {
                    return;
                }
                if Instant::now() >= claim.deadline() {
                    if !said_lapsed {
                        said_lapsed = true;
                        tracing::warn!(
                            backend = shared.store.backend(),
                            error = %ErrorChain(&error),
                            "could not extend the lease before it ran out by this process's \
                             clock: another request may take the key over; still trying until \
                             the store answers"
                        );
                    }
                    beat.min(Duration::from_millis(250))
                } else {
                    tracing::warn!(
                    backend = shared.store.backend(),
                    error = %ErrorChain(&error),
                    "could not extend the lease; trying again"
                    );
                    beat.min(Duration::from_millis(250))
                }
            }
        };
        if !claim.sleep_while_heartbeat_wanted(next).await {
            return;
        }
    }
}
