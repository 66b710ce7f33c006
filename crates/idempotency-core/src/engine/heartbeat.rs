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

use super::key_claim::KeyClaim;
use super::shared::Shared;
use super::timer::sleep_until;
use crate::store::FenceOutcome;
use crate::sync::{AtomicBool, AtomicU64, Mutex, MutexGuard, Ordering};
use crate::{ErrorChain, IdempotencyStore};
use std::sync::{Arc, PoisonError, Weak};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

#[cfg(all(test, idempotency_loom))]
mod loom_tests;

/// A request's place in the schedule, to unregister it when it finishes: its slot, and its
/// sequence number, so that a slot the driver emptied and another request took is left alone.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Registration {
    slot: usize,
    seq: u64,
}

/// A registered request: when its first heartbeat is due.
struct Waiting {
    due: Instant,
    seq: u64,
    claim: KeyClaim,
}

/// The slots of the requests waiting for their first heartbeat, and the free ones.
#[derive(Default)]
struct Slab {
    slots: Vec<Option<Waiting>>,
    free: Vec<usize>,
}

/// The requests waiting for their first heartbeat.
pub(crate) struct Schedule {
    due: Mutex<Slab>,
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
/// its runtime, polled or not), so the next registration starts a new one.
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

    fn entries(&self) -> MutexGuard<'_, Slab> {
        // The map stays consistent whatever panicked while it was locked (no user code runs
        // under the lock), so a poisoned lock is still usable.
        self.due.lock().unwrap_or_else(PoisonError::into_inner)
    }

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

    /// Puts `claim` in a free slot of the schedule (or a new one), due a period after its claim.
    fn insert(&self, claim: &KeyClaim) -> Registration {
        debug_assert_eq!(period(claim.length()), self.period);
        let seq = self.next_seq.fetch_add(1, Ordering::Relaxed);
        let waiting = Waiting {
            due: claim.claimed_at() + self.period,
            seq,
            claim: claim.clone(),
        };
        let mut slab = self.entries();
        let slot = match slab.free.pop() {
            Some(slot) => {
                slab.slots[slot] = Some(waiting);
                slot
            }
            None => {
                slab.slots.push(Some(waiting));
                slab.slots.len() - 1
            }
        };
        Registration { slot, seq }
    }

    /// Whether the caller is to start the driver: none is alive, and this caller is the one
    /// that marked it alive (one driver at a time, however many requests register at once).
    fn claim_driver(&self) -> bool {
        if self.driver_alive.load(Ordering::Acquire) {
            return false;
        }
        #[cfg(idempotency_loom)]
        if crate::sync::SEEDED_DRIVER_RACE.load(std::sync::atomic::Ordering::Relaxed) {
            self.driver_alive.store(true, Ordering::Release);
            return true;
        }
        self.driver_alive
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// A request finished (stored, released, or dropped): its heartbeat is no longer wanted,
    /// and it leaves the schedule (see [`Schedule::unregister`]). A heartbeat the driver
    /// started for it meanwhile ends at its next look at the claim.
    pub(crate) fn finished(&self, claim: &KeyClaim, registration: Registration) {
        claim.stop_heartbeat();
        self.unregister(registration);
    }

    /// Takes a finished request out of the schedule (a no-op when its heartbeat already
    /// started: that task ends when the lease says the heartbeat stopped). Its slot is emptied
    /// only while it still holds this registration (its sequence number): the driver may have
    /// emptied it and another request taken it.
    fn unregister(&self, registration: Registration) {
        #[cfg(idempotency_loom)]
        let by_seq = !crate::sync::SEEDED_SLOT_RACE.load(std::sync::atomic::Ordering::Relaxed);
        #[cfg(not(idempotency_loom))]
        let by_seq = true;
        let removed = {
            let mut slab = self.entries();
            let slab = &mut *slab;
            match slab.slots.get_mut(registration.slot) {
                Some(slot)
                    if slot
                        .as_ref()
                        .is_some_and(|w| w.seq == registration.seq || !by_seq) =>
                {
                    slab.free.push(registration.slot);
                    slot.take()
                }
                _ => None,
            }
        };
        // The lease is dropped outside the lock.
        drop(removed);
    }

    /// The engine is gone: the driver ends.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.closed_signal.notify_one();
    }

    /// One pass of the driver at `now`: the requests due that still want their lease extended
    /// (each gets a heartbeat task), and when the next registration is due. A request that
    /// finished after the pass took it is left to its heartbeat, which ends at its first look.
    fn due_heartbeats(&self, now: Instant) -> (Vec<KeyClaim>, Option<Instant>) {
        let (mut due, next) = self.take_due(now);
        due.retain(KeyClaim::heartbeat_wanted);
        (due, next)
    }

    /// Removes the registrations due at `now`; returns them and when the next one is due.
    fn take_due(&self, now: Instant) -> (Vec<KeyClaim>, Option<Instant>) {
        let mut slab = self.entries();
        let slab = &mut *slab;
        let (mut due, mut next) = (Vec::new(), None::<Instant>);
        for (index, slot) in slab.slots.iter_mut().enumerate() {
            match slot {
                Some(waiting) if waiting.due <= now => {
                    if let Some(waiting) = slot.take() {
                        due.push(waiting.claim);
                        slab.free.push(index);
                    }
                }
                Some(waiting) => next = Some(next.map_or(waiting.due, |n| n.min(waiting.due))),
                None => {}
            }
        }
        // Once every request has finished, give back a slab grown by a burst.
        if slab.free.len() == slab.slots.len() && slab.slots.capacity() > 1024 {
            *slab = Slab::default();
        }
        (due, next)
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
