//! The replay tier's completed records: a moka cache of encoded responses, weighed by what they
//! cost in memory.

use crate::id::{CarriedHash, RecordId};
use bytes::Bytes;
use idempotency_core::{DecodeError, Fingerprint, StoredResponse};
use moka::notification::RemovalCause;
use moka::policy::EvictionPolicy;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What one cache entry costs beyond its id and encoded response, in bytes: the record itself,
/// moka's entry (key `Arc`, value entry, access-order and timer-wheel nodes, hash-table bucket,
/// pending write operation) and the allocator's headers on each. Measured on
/// x86-64 Linux with glibc by `tests/tier_memory_bound.rs` (resident memory of a full tier over
/// its bound).
pub(crate) const ENTRY_OVERHEAD: usize = 600;

/// A completed record. Cloned out of the cache on a read: a reference count and a few words
/// (moka keeps each value behind its own reference-counted pointer already).
#[derive(Clone, Debug)]
pub(crate) struct Completed {
    pub(crate) fingerprint: Fingerprint,
    /// The response in the stores' one encoding: compact, and its size is what it costs.
    encoded: Bytes,
    pub(crate) expires_at: Instant,
    /// The store's [state-loss count](idempotency_core::IdempotencyStore::state_losses) before
    /// the store was asked for the record: a copy made before a loss the store has since
    /// noticed is never replayed.
    pub(crate) losses: u64,
}

impl Completed {
    pub(crate) fn new(
        fingerprint: Fingerprint,
        response: &StoredResponse,
        expires_at: Instant,
        losses: u64,
    ) -> Self {
        Completed {
            fingerprint,
            encoded: response.encode(),
            expires_at,
            losses,
        }
    }

    pub(crate) fn response(&self) -> Result<StoredResponse, DecodeError> {
        StoredResponse::decode(self.encoded.clone())
    }

    /// Bytes an entry for this record under `id` takes.
    fn weight(id: &[u8], record: &Completed) -> u64 {
        (id.len() + record.encoded.len() + ENTRY_OVERHEAD) as u64
    }
}

struct CompletedExpiry;

impl moka::Expiry<RecordId, Completed> for CompletedExpiry {
    fn expire_after_create(
        &self,
        _key: &RecordId,
        value: &Completed,
        created_at: Instant,
    ) -> Option<Duration> {
        Some(value.expires_at.saturating_duration_since(created_at))
    }

    fn expire_after_update(
        &self,
        _key: &RecordId,
        value: &Completed,
        updated_at: Instant,
        _duration_until_expiry: Option<Duration>,
    ) -> Option<Duration> {
        Some(value.expires_at.saturating_duration_since(updated_at))
    }
}

/// The cache and its accounting.
pub(crate) struct CompletedRecords {
    cache: moka::sync::Cache<RecordId, Completed, CarriedHash>,
}

impl CompletedRecords {
    /// Records up to `max_bytes`, the least recently used evicted past it; evictions are
    /// counted in the counter `evictions_metric`.
    pub(crate) fn new(max_bytes: u64, evictions_metric: &'static str) -> Self {
        // Sized up front for the records a full cache holds (small responses), so the table
        // does not rehash its way up while it fills; a bucket is one pointer.
        let expected = (max_bytes / (ENTRY_OVERHEAD as u64 + 128)).min(1 << 20);
        let cache = moka::sync::Cache::builder()
            .initial_capacity(usize::try_from(expected).unwrap_or(1 << 20))
            .weigher(|id: &RecordId, record: &Completed| {
                u32::try_from(Completed::weight(id, record)).unwrap_or(u32::MAX)
            })
            .expire_after(CompletedExpiry)
            .eviction_listener(move |_id: Arc<RecordId>, _record: Completed, cause| {
                if cause == RemovalCause::Size {
                    metrics::counter!(evictions_metric).increment(1);
                }
            })
            .max_capacity(max_bytes)
            .eviction_policy(EvictionPolicy::lru())
            .build_with_hasher(CarriedHash);
        CompletedRecords { cache }
    }

    pub(crate) fn get(&self, id: &[u8]) -> Option<Completed> {
        self.cache.get(id)
    }

    /// Drops the record of `id`.
    pub(crate) fn remove(&self, id: &[u8]) {
        self.cache.invalidate(id);
    }

    /// Keeps `record` under `id`, replacing an expired record there.
    pub(crate) fn insert(&self, id: RecordId, record: Completed) {
        self.cache.insert(id, record);
    }

    /// Runs moka's pending maintenance (evictions, expirations) now.
    pub(crate) fn maintain(&self) {
        self.cache.run_pending_tasks();
    }

    /// Bytes of the entries moka has taken in (exact after [`CompletedRecords::maintain`]).
    pub(crate) fn bytes(&self) -> u64 {
        self.cache.weighted_size()
    }

    pub(crate) fn entries(&self) -> u64 {
        self.cache.entry_count()
    }
}
