//! An in-process [`IdempotencyStore`] on [moka](https://docs.rs/moka): no setup, the embedded
//! default, and the ADR's rejected "application memory" option kept for comparison.
//!
//! **Per process only.** Two instances of a service each have their own store, so the same key
//! sent to both runs the handler twice: the reason ADR 009 rejected application memory for a
//! service that runs on several tasks. Use it for one-instance services, tests and demos.
//!
//! ```
//! use idempotency_memory::MemoryStore;
//!
//! let store = MemoryStore::builder()
//!     .max_stored_bytes(64 * 1024 * 1024)
//!     .max_in_flight(10_000)
//!     .build();
//! # let _ = store;
//! ```
//!
//! # Guarantees and limits
//! - Claims are atomic: the state of one `(scope, key)` changes only under that key's shard lock,
//!   so of N concurrent claims exactly one proceeds.
//! - Time is a monotonic clock ([`std::time::Instant`]); expired records read as absent.
//! - **In-flight claims are never evicted.** They live outside the cache in a map bounded by
//!   [`MemoryStoreBuilder::max_in_flight`]; when it is full a new claim fails with
//!   [`StoreError::Full`] (a retryable error, 503 at the HTTP layer), it never silently drops
//!   a running request's claim.
//! - **Completed responses are bounded by bytes** ([`MemoryStoreBuilder::max_stored_bytes`],
//!   weighted by their encoded size). When full, the least recently used completed records are
//!   evicted first; a newly completed response is always admitted. An evicted record behaves
//!   as an expired one: a later retry of that key runs the handler again. Evictions are counted
//!   by [`MemoryStore::evicted_records`] so they can be monitored.
//! - Nothing survives a restart of the process.

use async_trait::async_trait;
use idempotency_core::{
    ClaimOutcome, FenceOutcome, Fingerprint, IdempotencyKey, IdempotencyStore, LeaseToken, Record,
    RecordState, Scope, StoreError, StoredResponse,
};
use moka::notification::RemovalCause;
use moka::policy::EvictionPolicy;
use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

pub use moka;

const BACKEND: &str = "memory";
const SHARDS: usize = 64;

type RecordKey = (Scope, IdempotencyKey);

#[derive(Debug)]
struct InFlight {
    fingerprint: Fingerprint,
    token: LeaseToken,
    lease_until: Instant,
}

#[derive(Debug)]
struct Completed {
    fingerprint: Fingerprint,
    response: StoredResponse,
    expires_at: Instant,
}

struct CompletedExpiry;

impl moka::Expiry<RecordKey, Arc<Completed>> for CompletedExpiry {
    fn expire_after_create(
        &self,
        _key: &RecordKey,
        value: &Arc<Completed>,
        created_at: Instant,
    ) -> Option<Duration> {
        Some(value.expires_at.saturating_duration_since(created_at))
    }

    fn expire_after_update(
        &self,
        _key: &RecordKey,
        value: &Arc<Completed>,
        updated_at: Instant,
        _duration_until_expiry: Option<Duration>,
    ) -> Option<Duration> {
        Some(value.expires_at.saturating_duration_since(updated_at))
    }
}

/// Builds a [`MemoryStore`].
#[derive(Debug, Clone)]
pub struct MemoryStoreBuilder {
    max_stored_bytes: u64,
    max_in_flight: usize,
}

impl Default for MemoryStoreBuilder {
    fn default() -> Self {
        MemoryStoreBuilder {
            max_stored_bytes: 64 * 1024 * 1024,
            max_in_flight: 100_000,
        }
    }
}

impl MemoryStoreBuilder {
    /// Bound on the completed responses kept, in encoded bytes (default 64 MiB). Least
    /// recently used records are evicted past it.
    pub fn max_stored_bytes(mut self, bytes: u64) -> Self {
        self.max_stored_bytes = bytes;
        self
    }

    /// Bound on concurrently in-flight claims (default 100 000). Past it, claims fail with
    /// [`StoreError::Full`].
    pub fn max_in_flight(mut self, claims: usize) -> Self {
        self.max_in_flight = claims;
        self
    }

    /// Builds the store.
    pub fn build(self) -> MemoryStore {
        let evicted = Arc::new(AtomicU64::new(0));
        let counter = Arc::clone(&evicted);
        let completed = moka::sync::Cache::builder()
            .max_capacity(self.max_stored_bytes)
            .weigher(|(scope, key): &RecordKey, value: &Arc<Completed>| {
                let bytes =
                    scope.as_str().len() + key.as_str().len() + value.response.encoded_len() + 64;
                u32::try_from(bytes).unwrap_or(u32::MAX)
            })
            .eviction_policy(EvictionPolicy::lru())
            .expire_after(CompletedExpiry)
            .eviction_listener(move |_key, _value, cause| {
                if cause == RemovalCause::Size {
                    counter.fetch_add(1, Ordering::Relaxed);
                }
            })
            .build();
        MemoryStore {
            inner: Arc::new(Inner {
                shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
                hasher: RandomState::new(),
                in_flight: AtomicUsize::new(0),
                max_in_flight: self.max_in_flight,
                completed,
                evicted,
            }),
        }
    }
}

struct Inner {
    shards: Box<[Mutex<HashMap<RecordKey, InFlight>>]>,
    hasher: RandomState,
    in_flight: AtomicUsize,
    max_in_flight: usize,
    completed: moka::sync::Cache<RecordKey, Arc<Completed>>,
    evicted: Arc<AtomicU64>,
}

/// The in-process store. Cheap to clone; clones share the records.
#[derive(Clone)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("in_flight", &self.in_flight_claims())
            .field("completed", &self.inner.completed.entry_count())
            .field("stored_bytes", &self.inner.completed.weighted_size())
            .finish()
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore::builder().build()
    }
}

impl MemoryStore {
    /// A builder with the default bounds.
    pub fn builder() -> MemoryStoreBuilder {
        MemoryStoreBuilder::default()
    }

    /// Claims currently held (including ones whose lease ran out and are not yet reclaimed).
    pub fn in_flight_claims(&self) -> usize {
        self.inner.in_flight.load(Ordering::Relaxed)
    }

    /// Encoded bytes of the completed responses kept (after pending cache maintenance).
    pub fn stored_bytes(&self) -> u64 {
        self.inner.completed.run_pending_tasks();
        self.inner.completed.weighted_size()
    }

    /// Completed records evicted because the byte bound was reached, since the store was built.
    pub fn evicted_records(&self) -> u64 {
        self.inner.evicted.load(Ordering::Relaxed)
    }

    fn shard(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
    ) -> MutexGuard<'_, HashMap<RecordKey, InFlight>> {
        let index = self.inner.hasher.hash_one((scope, key)) as usize % SHARDS;
        // No code panics while holding a shard lock; recover the map if that ever changes.
        self.inner.shards[index]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The live record, read under the key's shard lock.
    fn live_record(
        &self,
        shard: &mut HashMap<RecordKey, InFlight>,
        id: &RecordKey,
        now: Instant,
    ) -> Option<Record> {
        if let Some(claim) = shard.get(id) {
            if claim.lease_until > now {
                return Some(Record {
                    fingerprint: claim.fingerprint,
                    state: RecordState::InFlight {
                        lease_remaining: claim.lease_until - now,
                    },
                });
            }
            // The lease ran out: the claim is dead and can be taken over.
            shard.remove(id);
            self.inner.in_flight.fetch_sub(1, Ordering::Relaxed);
        }
        let completed = self.inner.completed.get(id)?;
        (completed.expires_at > now).then(|| Record {
            fingerprint: completed.fingerprint,
            state: RecordState::Completed {
                response: completed.response.clone(),
            },
        })
    }

    /// Runs `f` on the in-flight claim of `id` if `token` holds it, under the shard lock.
    fn fenced(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        token: LeaseToken,
        f: impl FnOnce(InFlight),
    ) -> FenceOutcome {
        let mut shard = self.shard(scope, key);
        let id = (scope.clone(), key.clone());
        let now = Instant::now();
        match shard.get(&id) {
            Some(claim) if claim.token == token && claim.lease_until > now => {
                if let Some(claim) = shard.remove(&id) {
                    self.inner.in_flight.fetch_sub(1, Ordering::Relaxed);
                    f(claim);
                }
                FenceOutcome::Applied
            }
            _ => FenceOutcome::Stale,
        }
    }
}

#[async_trait]
impl IdempotencyStore for MemoryStore {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    async fn claim(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        token: LeaseToken,
        lease: Duration,
    ) -> Result<ClaimOutcome, StoreError> {
        let mut shard = self.shard(scope, key);
        let id = (scope.clone(), key.clone());
        let now = Instant::now();
        if let Some(record) = self.live_record(&mut shard, &id, now) {
            return Ok(ClaimOutcome::Existing(record));
        }
        let held = self.inner.in_flight.fetch_add(1, Ordering::Relaxed);
        if held >= self.inner.max_in_flight {
            self.inner.in_flight.fetch_sub(1, Ordering::Relaxed);
            return Err(StoreError::Full {
                backend: BACKEND,
                reason: format!("{} claims are in flight", self.inner.max_in_flight),
            });
        }
        // A completed record that expired may still sit in the cache; drop it now.
        self.inner.completed.invalidate(&id);
        shard.insert(
            id,
            InFlight {
                fingerprint: *fingerprint,
                token,
                lease_until: now + lease,
            },
        );
        Ok(ClaimOutcome::Claimed)
    }

    async fn complete(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        token: LeaseToken,
        response: &StoredResponse,
        retention: Duration,
    ) -> Result<FenceOutcome, StoreError> {
        let completed = &self.inner.completed;
        Ok(self.fenced(scope, key, token, |claim| {
            let record = Completed {
                fingerprint: claim.fingerprint,
                response: response.clone(),
                expires_at: Instant::now() + retention,
            };
            completed.insert((scope.clone(), key.clone()), Arc::new(record));
        }))
    }

    async fn extend(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        token: LeaseToken,
        lease: Duration,
    ) -> Result<FenceOutcome, StoreError> {
        let mut shard = self.shard(scope, key);
        let now = Instant::now();
        match shard.get_mut(&(scope.clone(), key.clone())) {
            Some(claim) if claim.token == token && claim.lease_until > now => {
                claim.lease_until = now + lease;
                Ok(FenceOutcome::Applied)
            }
            _ => Ok(FenceOutcome::Stale),
        }
    }

    async fn release(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        token: LeaseToken,
    ) -> Result<FenceOutcome, StoreError> {
        Ok(self.fenced(scope, key, token, |_| {}))
    }

    async fn get(&self, scope: &Scope, key: &IdempotencyKey) -> Result<Option<Record>, StoreError> {
        let mut shard = self.shard(scope, key);
        Ok(self.live_record(&mut shard, &(scope.clone(), key.clone()), Instant::now()))
    }

    async fn purge_expired(&self, limit: usize) -> Result<u64, StoreError> {
        let now = Instant::now();
        let mut purged = 0usize;
        for shard in self.inner.shards.iter() {
            if purged >= limit {
                break;
            }
            let mut shard = shard.lock().unwrap_or_else(|p| p.into_inner());
            let before = shard.len();
            let mut budget = limit - purged;
            shard.retain(|_, claim| {
                let keep = claim.lease_until > now || budget == 0;
                if !keep {
                    budget -= 1;
                }
                keep
            });
            let removed = before - shard.len();
            self.inner.in_flight.fetch_sub(removed, Ordering::Relaxed);
            purged += removed;
        }
        let before = self.inner.completed.entry_count();
        self.inner.completed.run_pending_tasks();
        let expired = before.saturating_sub(self.inner.completed.entry_count());
        Ok(purged as u64 + expired)
    }
}
