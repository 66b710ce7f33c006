//! The heartbeat: keeps a running request's lease from running out.
//!
//! Most requests finish long before their first heartbeat is due (a third of the lease), so a
//! request does not get a task of its own: it registers in a per-engine schedule (an ordered
//! map, one short lock to register and one to unregister), and one driver task per engine
//! wakes when the earliest registration is due. Only a request still running then gets a
//! heartbeat task, which extends its lease every third of it until the request finishes.
//!
//! Registering never wakes the driver: a wake-up from a worker thread queues the driver in that
//! thread's LIFO slot, where no other worker can run it, and a handler that then blocks the
//! thread would keep it from ever running. Instead the driver never sleeps longer than one
//! period: every lease has the engine's length, so a request registered while it sleeps is due
//! no earlier than the driver wakes.

use super::Shared;
use super::lease::Lease;
use crate::{ErrorChain, FenceOutcome, IdempotencyStore};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

/// A request's place in the schedule, to unregister it when it finishes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Registration {
    due: Instant,
    seq: u64,
}

/// The requests waiting for their first heartbeat, earliest first.
pub(crate) struct Schedule {
    due: Mutex<BTreeMap<(Instant, u64), Lease>>,
    /// Time to the first heartbeat: a third of the engine's lease.
    period: Duration,
    next_seq: AtomicU64,
    /// Wakes the driver when the engine is gone.
    closed_signal: Notify,
    /// A driver task is alive (it clears this when it ends, runtime shutdown included).
    driver_alive: AtomicBool,
    /// The engine is gone: the driver ends.
    closed: AtomicBool,
}

/// Clears [`Schedule::driver_alive`] however the driver task ends (returned, or dropped with
/// its runtime), so the next registration starts a new one.
struct DriverAlive(Arc<Schedule>);

impl Drop for DriverAlive {
    fn drop(&mut self) {
        self.0.driver_alive.store(false, Ordering::Release);
    }
}

/// The period of the heartbeat for a lease of `length`.
fn period(length: Duration) -> Duration {
    (length / 3).max(Duration::from_millis(10))
}

impl Schedule {
    /// An empty schedule for an engine whose leases last `lease`.
    pub(crate) fn new(lease: Duration) -> Self {
        Schedule {
            due: Mutex::default(),
            period: period(lease),
            next_seq: AtomicU64::new(0),
            closed_signal: Notify::new(),
            driver_alive: AtomicBool::new(false),
            closed: AtomicBool::new(false),
        }
    }

    fn entries(&self) -> MutexGuard<'_, BTreeMap<(Instant, u64), Lease>> {
        // The map stays consistent whatever panicked while it was locked (no user code runs
        // under the lock), so a poisoned lock is still usable.
        self.due.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers `lease` for its first heartbeat, a third of its length from now. Returns the
    /// registration and whether a driver task was started (it starts on this worker thread;
    /// the caller yields once so that a handler blocking the thread cannot keep it from
    /// starting).
    pub(crate) fn register<S: IdempotencyStore + 'static>(
        self: &Arc<Self>,
        shared: &Arc<Shared<S>>,
        lease: &Lease,
    ) -> (Registration, bool) {
        debug_assert_eq!(period(lease.length()), self.period);
        let registration = Registration {
            due: Instant::now() + self.period,
            seq: self.next_seq.fetch_add(1, Ordering::Relaxed),
        };
        self.entries()
            .insert((registration.due, registration.seq), lease.clone());
        let started = !self.driver_alive.load(Ordering::Acquire)
            && self
                .driver_alive
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
                .is_ok();
        if started {
            tokio::spawn(drive(Arc::clone(self), Arc::downgrade(shared)));
        }
        (registration, started)
    }

    /// Takes a finished request out of the schedule (a no-op when its heartbeat already
    /// started: that task ends when the lease says the heartbeat stopped).
    pub(crate) fn unregister(&self, registration: Registration) {
        self.entries().remove(&(registration.due, registration.seq));
    }

    /// The engine is gone: the driver ends.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.closed_signal.notify_one();
    }

    /// Removes the registrations due at `now`; returns them and when the next one is due.
    fn take_due(&self, now: Instant) -> (Vec<Lease>, Option<Instant>) {
        let mut entries = self.entries();
        let mut due = Vec::new();
        while let Some(entry) = entries.first_entry() {
            if entry.key().0 > now {
                return (due, Some(entry.key().0));
            }
            due.push(entry.remove());
        }
        (due, None)
    }
}

/// The driver: sleeps until the earliest registration is due (at most one period), then starts
/// a heartbeat task for each request still running at that point.
async fn drive<S: IdempotencyStore + 'static>(schedule: Arc<Schedule>, shared: Weak<Shared<S>>) {
    let _alive = DriverAlive(Arc::clone(&schedule));
    loop {
        let closed = schedule.closed_signal.notified();
        tokio::pin!(closed);
        closed.as_mut().enable();
        if schedule.closed.load(Ordering::Acquire) {
            return;
        }
        let now = Instant::now();
        let (due, next) = schedule.take_due(now);
        if !due.is_empty() {
            let Some(shared) = shared.upgrade() else {
                return;
            };
            for lease in due {
                if lease.heartbeat_wanted() {
                    shared.tasks.spawn(run(Arc::clone(&shared), lease));
                }
            }
        }
        let wake_at = next.map_or(now + schedule.period, |at| at.min(now + schedule.period));
        tokio::select! {
            () = tokio::time::sleep_until(wake_at) => {}
            () = closed => return,
        }
    }
}

/// Extends the lease now and then every third of its length until the request stops its
/// heartbeat. A failed extension is retried sooner; once the lease has run out by this
/// process's clock, or the store says the token no longer holds the claim, the lease is marked
/// lost and the heartbeat stops.
async fn run<S: IdempotencyStore + 'static>(shared: Arc<Shared<S>>, lease: Lease) {
    let beat = period(lease.length());
    loop {
        if !lease.heartbeat_wanted() {
            return;
        }
        let sent = Instant::now();
        let next = match shared.extend(&lease).await {
            Ok(FenceOutcome::Applied) => {
                lease.renewed(sent);
                beat
            }
            Ok(FenceOutcome::Stale) => {
                if lease.heartbeat_wanted() {
                    lease.mark_lost();
                    tracing::warn!(
                        backend = shared.store.backend(),
                        "the lease ran out while the request was running; another request may run it too"
                    );
                }
                return;
            }
            Err(error) => {
                if !lease.heartbeat_wanted() {
                    return;
                }
                if Instant::now() >= lease.deadline() {
                    lease.mark_lost();
                    tracing::warn!(
                        backend = shared.store.backend(),
                        error = %ErrorChain(&error),
                        "could not extend the lease before it ran out; another request may run it too"
                    );
                    return;
                }
                tracing::warn!(
                    backend = shared.store.backend(),
                    error = %ErrorChain(&error),
                    "could not extend the lease; trying again"
                );
                beat.min(Duration::from_millis(250))
            }
        };
        if !lease.sleep_while_heartbeat_wanted(next).await {
            return;
        }
    }
}
