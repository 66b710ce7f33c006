//! The locks and atomics of the engine's waiting duplicates: the standard library's, or
//! [loom](https://docs.rs/loom)'s when the schedule checker runs (`--cfg idempotency_loom`, see
//! `scripts/loom`), which then explores every interleaving of them (`engine/waiters.rs`).

#[cfg(idempotency_loom)]
pub(crate) use loom::sync::atomic::{AtomicUsize, Ordering};
#[cfg(idempotency_loom)]
pub(crate) use loom::sync::{Mutex, MutexGuard};
#[cfg(not(idempotency_loom))]
pub(crate) use std::sync::atomic::{AtomicUsize, Ordering};
#[cfg(not(idempotency_loom))]
pub(crate) use std::sync::{Mutex, MutexGuard};
