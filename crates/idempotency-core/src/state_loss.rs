//! Noticing that a store lost its records.

use std::sync::atomic::{AtomicU64, Ordering};

/// Counts and reports that a store lost its records: crash recovery of an UNLOGGED table, a
/// Redis restart without persistence, a failover to a replica that had not received them, a
/// `TRUNCATE` or `FLUSHALL`, eviction. Stores keep a sentinel record that never expires and call
/// [`StateLoss::found`] when it is gone: one log line (an error, since retries of every request
/// completed before the loss will run again) and one increment of
/// `idempotency_store_state_lost_total{backend}` per loss, written once for every store.
#[derive(Debug, Default)]
pub struct StateLoss {
    losses: AtomicU64,
}

impl StateLoss {
    /// The counter's name.
    pub const METRIC: &'static str = "idempotency_store_state_lost_total";

    /// A count of `backend`'s losses, starting at zero, with its series exported at zero from
    /// now on (so a dashboard and `increase()` see it before the first loss, and a renamed
    /// metric is noticed by the check of the shipped rules against the real endpoint).
    pub fn watching(backend: &'static str) -> Self {
        metrics::counter!(Self::METRIC, "backend" => backend).increment(0);
        StateLoss::default()
    }

    /// The sentinel of `backend` at `place` (a table, a key prefix) was gone; `how` says what can
    /// empty this store.
    pub fn found(&self, backend: &'static str, place: &str, how: &'static str) {
        self.losses.fetch_add(1, Ordering::Relaxed);
        metrics::counter!(Self::METRIC, "backend" => backend).increment(1);
        tracing::error!(
            backend,
            place,
            "idempotency records were lost: the store's sentinel record is gone ({how}). Every \
             stored response and in-flight claim made before it is gone, so retries of those \
             requests will run again"
        );
    }

    /// How many losses were found.
    pub fn count(&self) -> u64 {
        self.losses.load(Ordering::Relaxed)
    }
}
