//! The heartbeat schedule: the requests of one engine waiting for their first heartbeat, in a
//! slab (one short lock to take a slot and one to give it back), and whether the engine's
//! driver runs. What it decides is checked under loom (`heartbeat_schedule/loom_tests.rs`);
//! the driver and the heartbeats that act on it are `heartbeat.rs`.

use super::key_claim::KeyClaim;
use crate::sync::{AtomicBool, AtomicU64, Mutex, MutexGuard, Ordering};
use std::sync::{Arc, PoisonError};
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
    pub(super) period: Duration,
    next_seq: AtomicU64,
    /// Wakes the driver when the engine is gone.
    pub(super) closed_signal: Notify,
    /// A driver task is alive (it clears this when it ends, runtime shutdown included).
    driver_alive: AtomicBool,
    /// The engine is gone: the driver ends.
    pub(super) closed: AtomicBool,
}

/// Clears [`Schedule::driver_alive`] however the driver task ends (returned, or dropped with
/// its runtime, polled or not), so the next registration starts a new one.
pub(super) struct DriverAlive(pub(super) Arc<Schedule>);

impl Drop for DriverAlive {
    fn drop(&mut self) {
        self.0.driver_alive.store(false, Ordering::Release);
    }
}

/// The period of the heartbeat for a lease of `length`.
pub(super) fn period(length: Duration) -> Duration {
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

    /// Puts `claim` in a free slot of the schedule (or a new one), due a period after its claim.
    pub(super) fn insert(&self, claim: &KeyClaim) -> Registration {
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
    pub(super) fn claim_driver(&self) -> bool {
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
    pub(super) fn due_heartbeats(&self, now: Instant) -> (Vec<KeyClaim>, Option<Instant>) {
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
