#![doc = include_str!("../README.md")]
//!
//! # Guarantees and limits
//! - Claims are atomic: the state of one `(scope, key)` changes only under that key's shard lock,
//!   so of N concurrent claims exactly one proceeds.
//! - Time is a monotonic clock ([`std::time::Instant`]); expired records read as absent.
//! - Records live in one sharded hash table: a claim is one lookup under one shard's lock, and
//!   a completion turns the claim into the record in place.
//! - **In-flight claims are never evicted.** They are bounded by a count,
//!   [`MemoryStoreBuilder::max_in_flight`]; when it is full a new claim fails with
//!   [`StoreError::Full`] (a retryable error, 503 at the HTTP layer), it never silently drops
//!   a running request's claim.
//! - **Completed records are bounded by the memory they take**
//!   ([`MemoryStoreBuilder::max_stored_bytes`]): each is weighed as its id, its encoded response
//!   and a fixed overhead for its slot and bookkeeping, so a full store's
//!   resident memory stays near the bound (`tests/memory_bound.rs` measures it). At the bound,
//!   [`WhenFull`] decides: evict the least recently used completed records (the default; a
//!   retry of an evicted key runs again, counted by [`MemoryStore::evicted_records`] and
//!   `idempotency_memory_evictions_total`), or refuse new claims until records expire.
//! - **Each scope has a share of the bound** (an eighth by default,
//!   [`MemoryStoreBuilder::max_bytes_per_scope`]): at the bound, a completion whose scope holds
//!   more than its share evicts that scope's own oldest records, not other users'; under
//!   [`WhenFull::RefuseNewClaims`] the scope at its share is refused (429), not everyone. One
//!   user flooding the store with new keys so pushes out only its own records; it takes eight
//!   users flooding together to reach the others'. The unscoped key space has no share. The
//!   responses of one scope's requests already in flight when it reaches its share are still
//!   stored, so a scope can pass its share by those.
//! - In-flight claims take memory besides the bound: about 100 bytes plus the key and scope
//!   each, at most [`MemoryStoreBuilder::max_in_flight`] of them.
//! - Nothing survives a restart of the process.

mod completed;
mod id;
mod records;
mod shares;
mod sync;
mod tier;

pub use records::WhenFull;
pub use tier::{ReplayTier, ReplayTierBuilder};

use async_trait::async_trait;
use id::IdBuf;
use idempotency_core::store::{ClaimOutcome, FenceOutcome, Footprint, Record};
use idempotency_core::{
    Fingerprint, IdempotencyKey, IdempotencyStore, LeaseToken, Scope, StoreError, StoredResponse,
};
use records::Records;
use std::sync::Arc;
use std::time::Duration;

const BACKEND: &str = "memory";

/// Builds a [`MemoryStore`].
#[derive(Debug, Clone)]
pub struct MemoryStoreBuilder {
    max_stored_bytes: u64,
    max_in_flight: usize,
    when_full: WhenFull,
    /// `None`: the default share, a [`DEFAULT_SCOPE_SHARES`]th of the bound.
    bytes_per_scope: Option<u64>,
}

/// By default one scope's records may take this fraction of the bound (one eighth): a single
/// user can then never fill the store and have every other user's records evicted; it takes
/// eight users flooding together.
pub const DEFAULT_SCOPE_SHARES: u64 = 8;

impl Default for MemoryStoreBuilder {
    fn default() -> Self {
        MemoryStoreBuilder {
            max_stored_bytes: 64 * 1024 * 1024,
            max_in_flight: 100_000,
            when_full: WhenFull::default(),
            bytes_per_scope: None,
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

    /// The most one scope's completed records may weigh (default: an eighth of
    /// [`max_stored_bytes`](Self::max_stored_bytes), [`DEFAULT_SCOPE_SHARES`]). A scope at its
    /// share has its new claims refused with [`StoreError::ScopeFull`] (429 at the HTTP layer)
    /// until some of its records expire, while its existing keys still replay: so one user
    /// flooding the store with new keys cannot evict every other user's records and make
    /// their retries run again. `u64::MAX` turns shares off (one global least-recently-used
    /// order for every scope). The unscoped key space
    /// ([`Scope::unscoped`](idempotency_core::Scope::unscoped)) has no share.
    pub fn max_bytes_per_scope(mut self, bytes: u64) -> Self {
        self.bytes_per_scope = Some(bytes);
        self
    }

    /// Builds the store.
    pub fn build(self) -> MemoryStore {
        let share = self
            .bytes_per_scope
            .unwrap_or(self.max_stored_bytes / DEFAULT_SCOPE_SHARES);
        MemoryStore {
            inner: Arc::new(Inner {
                ids: foldhash::fast::RandomState::default(),
                records: Records::new(
                    self.max_stored_bytes,
                    self.max_in_flight,
                    self.when_full,
                    share,
                ),
            }),
        }
    }
}

struct Inner {
    /// Seeds the hash every record id carries.
    ids: foldhash::fast::RandomState,
    records: Records,
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
            .field("completed", &self.inner.records.completed())
            .field("stored_bytes", &self.stored_bytes())
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
        self.inner.records.in_flight()
    }

    /// Memory the completed records take by the store's accounting: what
    /// [`MemoryStoreBuilder::max_stored_bytes`] bounds. A completion adds its record, then
    /// evicts down to the bound, so while completions run this can pass the bound by the
    /// records they are adding (one each).
    pub fn stored_bytes(&self) -> u64 {
        self.inner.records.bytes()
    }

    /// Completed records evicted because the bound was reached, since the store was built.
    pub fn evicted_records(&self) -> u64 {
        self.inner.records.evicted()
    }

    fn id(&self, scope: &Scope, key: &IdempotencyKey) -> IdBuf {
        IdBuf::new(&self.inner.ids, scope, key)
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
        let id = self.id(scope, key);
        self.inner
            .records
            .claim(id.as_bytes(), fingerprint, token, lease)
    }

    async fn complete(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        token: LeaseToken,
        response: &StoredResponse,
        retention: Duration,
    ) -> Result<FenceOutcome, StoreError> {
        let id = self.id(scope, key);
        Ok(self
            .inner
            .records
            .complete(id.as_bytes(), token, response, retention))
    }

    async fn extend(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        token: LeaseToken,
        lease: Duration,
    ) -> Result<FenceOutcome, StoreError> {
        let id = self.id(scope, key);
        Ok(self.inner.records.extend(id.as_bytes(), token, lease))
    }

    async fn release(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        token: LeaseToken,
    ) -> Result<FenceOutcome, StoreError> {
        let id = self.id(scope, key);
        Ok(self.inner.records.release(id.as_bytes(), token))
    }

    async fn get(&self, scope: &Scope, key: &IdempotencyKey) -> Result<Option<Record>, StoreError> {
        let id = self.id(scope, key);
        self.inner.records.get(id.as_bytes())
    }

    async fn purge_expired(&self, limit: usize) -> Result<u64, StoreError> {
        Ok(self.inner.records.purge_expired(limit))
    }

    /// The claims held and the completed records kept, and the bytes the latter take by the
    /// store's accounting ([`MemoryStore::stored_bytes`]).
    async fn footprint(&self) -> Result<Option<Footprint>, StoreError> {
        let records = self.inner.records.in_flight() + self.inner.records.completed();
        Ok(Some(Footprint::new(
            Some(records as u64),
            Some(self.stored_bytes()),
        )))
    }
}
