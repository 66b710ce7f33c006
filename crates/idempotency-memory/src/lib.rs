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
//! - **Completed records are bounded by the memory they take**
//!   ([`MemoryStoreBuilder::max_stored_bytes`]): each is weighed as its id, its encoded response
//!   and a fixed overhead for the record and the cache's own bookkeeping, so a full store's
//!   resident memory stays near the bound (`tests/memory_bound.rs` measures it). At the bound,
//!   [`WhenFull`] decides: evict the least recently used completed records (the default; a
//!   retry of an evicted key runs again, counted by [`MemoryStore::evicted_records`] and
//!   `idempotency_memory_evictions_total`), or refuse new claims until records expire.
//! - In-flight claims take memory besides the bound: about 100 bytes plus the key and scope
//!   each, at most [`MemoryStoreBuilder::max_in_flight`] of them.
//! - Nothing survives a restart of the process.

mod completed;
mod id;
mod in_flight;
mod tier;

pub use completed::WhenFull;
pub use tier::{ReplayTier, ReplayTierBuilder};

use async_trait::async_trait;
use completed::{Completed, CompletedRecords};
use id::IdBuf;
use idempotency_core::{
    ClaimOutcome, FenceOutcome, Fingerprint, IdempotencyKey, IdempotencyStore, LeaseToken, Record,
    RecordState, Scope, StoreError, StoredResponse,
};
use in_flight::{Claim, Claims, Locked};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

pub use moka;

const BACKEND: &str = "memory";

/// Builds a [`MemoryStore`].
#[derive(Debug, Clone)]
pub struct MemoryStoreBuilder {
    max_stored_bytes: u64,
    max_in_flight: usize,
    when_full: WhenFull,
}

impl Default for MemoryStoreBuilder {
    fn default() -> Self {
        MemoryStoreBuilder {
            max_stored_bytes: 64 * 1024 * 1024,
            max_in_flight: 100_000,
            when_full: WhenFull::default(),
        }
    }
}

impl MemoryStoreBuilder {
    /// Bound on the memory completed records take (default 64 MiB): each counts its key and
    /// scope, its encoded response and a fixed overhead per record, so a full store stays near
    /// this figure in resident memory. What happens at the bound is [`WhenFull`].
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

    /// What happens when completed records reach [`max_stored_bytes`](Self::max_stored_bytes)
    /// (default [`WhenFull::EvictLeastRecentlyUsed`]).
    pub fn when_full(mut self, when_full: WhenFull) -> Self {
        self.when_full = when_full;
        self
    }

    /// Builds the store.
    pub fn build(self) -> MemoryStore {
        MemoryStore {
            inner: Arc::new(Inner {
                ids: foldhash::fast::RandomState::default(),
                claims: Claims::new(),
                in_flight: AtomicUsize::new(0),
                max_in_flight: self.max_in_flight,
                completed: CompletedRecords::new(
                    self.max_stored_bytes,
                    self.when_full,
                    "idempotency_memory_evictions_total",
                ),
            }),
        }
    }
}

struct Inner {
    /// Seeds the hash every record id carries.
    ids: foldhash::fast::RandomState,
    claims: Claims,
    in_flight: AtomicUsize,
    max_in_flight: usize,
    completed: CompletedRecords,
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
            .field("completed", &self.inner.completed.entries())
            .field("stored_bytes", &self.inner.completed.bytes())
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

    /// Memory the completed records take by the store's accounting (after pending cache
    /// maintenance): what [`MemoryStoreBuilder::max_stored_bytes`] bounds.
    pub fn stored_bytes(&self) -> u64 {
        self.inner.completed.maintain();
        self.inner.completed.bytes()
    }

    /// Completed records evicted because the bound was reached, since the store was built.
    pub fn evicted_records(&self) -> u64 {
        self.inner.completed.evicted()
    }

    /// The live record of `id`, read under its shard lock.
    fn live_record(
        &self,
        claims: &mut Locked<'_>,
        id: &[u8],
        now: Instant,
    ) -> Result<Option<Record>, StoreError> {
        if let Some(claim) = claims.get(id) {
            if claim.lease_until > now {
                return Ok(Some(Record {
                    fingerprint: claim.fingerprint,
                    state: RecordState::InFlight {
                        lease_remaining: claim.lease_until - now,
                    },
                }));
            }
            // The lease ran out: the claim is dead and can be taken over.
            claims.remove(id);
            self.inner.in_flight.fetch_sub(1, Ordering::Relaxed);
        }
        let Some(completed) = self.inner.completed.get(id) else {
            return Ok(None);
        };
        if completed.expires_at <= now {
            return Ok(None);
        }
        // Encoded by this process a moment ago: decoding fails only on a bug, reported as such.
        let response = completed.response().map_err(|e| StoreError::Corrupt {
            backend: BACKEND,
            source: e.into(),
        })?;
        Ok(Some(Record {
            fingerprint: completed.fingerprint,
            state: RecordState::Completed {
                response,
                retention_remaining: completed.expires_at - now,
            },
        }))
    }

    /// Takes the in-flight claim of `(scope, key)` out if `token` holds it, and runs `f` with
    /// its kept id under the shard lock.
    fn fenced(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        token: LeaseToken,
        f: impl FnOnce(Box<[u8]>, Claim),
    ) -> FenceOutcome {
        let id = IdBuf::new(&self.inner.ids, scope, key);
        let id = id.as_bytes();
        let mut claims = self.inner.claims.lock(id);
        let now = Instant::now();
        match claims.get(id) {
            Some(claim) if claim.token == token && claim.lease_until > now => {
                if let Some((kept, claim)) = claims.remove(id) {
                    self.inner.in_flight.fetch_sub(1, Ordering::Relaxed);
                    f(kept, claim);
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
        let id = IdBuf::new(&self.inner.ids, scope, key);
        let mut claims = self.inner.claims.lock(id.as_bytes());
        let now = Instant::now();
        if let Some(record) = self.live_record(&mut claims, id.as_bytes(), now)? {
            return Ok(ClaimOutcome::Existing(record));
        }
        if self.inner.completed.refuses_claims() {
            return Err(StoreError::Full {
                backend: BACKEND,
                reason:
                    "completed records fill the memory bound; new claims wait for them to expire"
                        .into(),
            });
        }
        let held = self.inner.in_flight.fetch_add(1, Ordering::Relaxed);
        if held >= self.inner.max_in_flight {
            self.inner.in_flight.fetch_sub(1, Ordering::Relaxed);
            return Err(StoreError::Full {
                backend: BACKEND,
                reason: format!("{} claims are in flight", self.inner.max_in_flight),
            });
        }
        // An expired completed record may still sit in the cache: it reads as absent, and the
        // completion of this claim replaces it.
        claims.insert(
            id.to_owned_id(),
            Claim {
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
        Ok(self.fenced(scope, key, token, |id, claim| {
            let record = Completed::new(claim.fingerprint, response, Instant::now() + retention);
            completed.insert(id, record);
        }))
    }

    async fn extend(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        token: LeaseToken,
        lease: Duration,
    ) -> Result<FenceOutcome, StoreError> {
        let id = IdBuf::new(&self.inner.ids, scope, key);
        let mut claims = self.inner.claims.lock(id.as_bytes());
        let now = Instant::now();
        match claims.get_mut(id.as_bytes()) {
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
        Ok(self.fenced(scope, key, token, |_, _| {}))
    }

    async fn get(&self, scope: &Scope, key: &IdempotencyKey) -> Result<Option<Record>, StoreError> {
        let id = IdBuf::new(&self.inner.ids, scope, key);
        let mut claims = self.inner.claims.lock(id.as_bytes());
        self.live_record(&mut claims, id.as_bytes(), Instant::now())
    }

    async fn purge_expired(&self, limit: usize) -> Result<u64, StoreError> {
        let now = Instant::now();
        let mut purged = 0usize;
        self.inner.claims.each_shard(|shard| {
            if purged >= limit {
                return;
            }
            let before = shard.len();
            let mut budget = limit - purged;
            shard.retain(|(_, claim)| {
                let keep = claim.lease_until > now || budget == 0;
                if !keep {
                    budget -= 1;
                }
                keep
            });
            let removed = before - shard.len();
            self.inner.in_flight.fetch_sub(removed, Ordering::Relaxed);
            purged += removed;
        });
        let before = self.inner.completed.entries();
        self.inner.completed.maintain();
        let expired = before.saturating_sub(self.inner.completed.entries());
        Ok(purged as u64 + expired)
    }
}
