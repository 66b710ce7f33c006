//! The locks and atomics of the engine's waiting duplicates, of its registry of keys in flight
//! and of its heartbeat schedule: the standard library's, or [loom](https://docs.rs/loom)'s when
//! the schedule checker runs (`--cfg idempotency_loom`, see `scripts/loom`), which then explores
//! every interleaving of them (`engine/waiters.rs`, `engine/in_flight.rs`,
//! `engine/heartbeat_schedule.rs`).

#[cfg(idempotency_loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
#[cfg(idempotency_loom)]
pub(crate) use loom::sync::{Mutex, MutexGuard};
#[cfg(not(idempotency_loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
#[cfg(not(idempotency_loom))]
pub(crate) use std::sync::{Mutex, MutexGuard};

/// Under the schedule checker only: a race seeded into the registry of keys in flight on
/// purpose, to show that the checker finds it (`engine/in_flight/loom_tests.rs`). Never compiled
/// into the engine otherwise.
#[cfg(idempotency_loom)]
pub(crate) static SEEDED_RACE: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Under the schedule checker only: a race seeded into the heartbeat schedule on purpose (a
/// finished request's registration removed by its slot alone, not by its sequence number, so a
/// slot the driver emptied and another request took is emptied again), to show that the checker
/// finds it (`engine/heartbeat_schedule/loom_tests.rs`).
#[cfg(idempotency_loom)]
pub(crate) static SEEDED_SLOT_RACE: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Under the schedule checker only: a race seeded into the start of the heartbeat driver (the
/// flag read, then written, rather than swapped at once), so two drivers may start.
#[cfg(idempotency_loom)]
pub(crate) static SEEDED_DRIVER_RACE: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);
