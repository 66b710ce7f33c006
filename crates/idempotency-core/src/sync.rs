//! The locks and atomics of the engine's waiting duplicates and of its registry of keys in
//! flight: the standard library's, or [loom](https://docs.rs/loom)'s when the schedule checker
//! runs (`--cfg idempotency_loom`, see `scripts/loom`), which then explores every interleaving
//! of them (`engine/waiters.rs`, `engine/in_flight.rs`).

#[cfg(idempotency_loom)]
pub(crate) use loom::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
#[cfg(idempotency_loom)]
pub(crate) use loom::sync::{Mutex, MutexGuard};
#[cfg(not(idempotency_loom))]
pub(crate) use std::sync::atomic::{AtomicUsize, Ordering};
#[cfg(not(idempotency_loom))]
pub(crate) use std::sync::{Mutex, MutexGuard};

/// Under the schedule checker only: a race seeded into the registry of keys in flight on
/// purpose, to show that the checker finds it (`engine/in_flight/loom_tests.rs`). Never compiled
/// into the engine otherwise.
#[cfg(idempotency_loom)]
pub(crate) static SEEDED_RACE: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);
