//! The local replay tier: completed records of a remote store, kept in this process so that a
//! replay costs no round trip.

use crate::completed::{Completed, CompletedRecords};
use crate::id::IdBuf;
use async_trait::async_trait;
use idempotency_core::store::{
    ClaimOutcome, FenceOutcome, Footprint, Record, RecordState, TransactionalStore,
};
use idempotency_core::{
    Fingerprint, IdempotencyKey, IdempotencyStore, LeaseToken, Scope, StoreError, StoredResponse,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How long the tier remembers the fingerprint of a claim it made, waiting for its completion.
/// A request that runs longer still completes; its record enters the tier on its first replay.
const CLAIM_MEMORY: Duration = Duration::from_secs(3600);

/// Builds a [`ReplayTier`].
#[derive(Debug, Clone)]
pub struct ReplayTierBuilder<S> {
    store: S,
    max_cached_bytes: u64,
    max_pending_claims: u64,
    check_state_every: Duration,
}

impl<S: IdempotencyStore> ReplayTierBuilder<S> {
    /// Bound on the memory the cached records take (default 16 MiB), weighed like
    /// [`MemoryStoreBuilder::max_stored_bytes`](crate::MemoryStoreBuilder::max_stored_bytes):
    /// key, scope and encoded response, plus a fixed overhead per entry measured for the
    /// tier's cache (`tests/tier_memory_bound.rs`).
    /// Past it the least recently used records leave the tier (their replays go back to the
    /// store; nothing else changes).
    pub fn max_cached_bytes(mut self, bytes: u64) -> Self {
        self.max_cached_bytes = bytes;
        self
    }

    /// Bound on the claims this process holds whose fingerprint the tier remembers, so that
    /// their completion can enter the tier at once (default 100 000; 16 bytes of token and 32
    /// of fingerprint each, plus the cache's own overhead). Past it a completion enters the
    /// tier on its first replay instead.
    pub fn max_pending_claims(mut self, claims: u64) -> Self {
        self.max_pending_claims = claims;
        self
    }

    /// How often, at most, a replay from the tier first asks the store whether it lost its
    /// records (default 1 s). A store that lost them (an UNLOGGED table emptied by a crash,
    /// Redis restarted without persistence, a `TRUNCATE`) may hold another request's record for
    /// a key by now, so copies made before the loss are dropped once the store notices it: the
    /// tier replays a lost record for at most about this long after the loss. One store round
    /// trip per interval, paid by the replay that finds the check due.
    pub fn check_state_every(mut self, interval: Duration) -> Self {
        self.check_state_every = interval;
        self
    }

    /// Builds the tier.
    pub fn build(self) -> ReplayTier<S> {
        ReplayTier {
            check_state_every: self.check_state_every,
            epoch: Instant::now(),
            next_check_ms: AtomicU64::new(0),
            store: self.store,
            ids: foldhash::fast::RandomState::default(),
            completed: CompletedRecords::new(
                self.max_cached_bytes,
                "idempotency_replay_tier_evictions_total",
            ),
            pending: moka::sync::Cache::builder()
                .max_capacity(self.max_pending_claims)
                .time_to_live(CLAIM_MEMORY)
                .build(),
            hits: AtomicU64::new(0),
        }
    }
}

/// A bounded in-process cache of completed records in front of a remote store (PostgreSQL,
/// Redis), so that a replay is answered with no round trip.
///
/// A completed record does not change until it expires, so a copy of it answers a replay
/// exactly as the store would: the engine compares the request's fingerprint with the record's
/// as usual, and the copy is kept no longer than the store keeps the record (its deadline is
/// taken before the store is asked, so it ends no later than the store's). Everything else goes
/// to the store: new keys, in-flight keys, every claim, completion, heartbeat and release. So
/// the tier never decides who runs a request; it only saves the round trip of a replay.
///
/// Records enter the tier when this process completes them, and when a claim or read through
/// the tier finds them completed in the store (a retry that landed on another instance first).
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use idempotency_memory::ReplayTier;
/// # let store = idempotency_memory::MemoryStore::default(); // e.g. a PostgresStore
/// let store = ReplayTier::builder(store).max_cached_bytes(32 * 1024 * 1024).build();
/// let engine = idempotency_core::Engine::new(store, Default::default())?;
/// # let _ = engine; Ok(()) }
/// ```
///
/// # What it changes
/// - Replays on this process cost no round trip, but for one state check of the store per
///   [`ReplayTierBuilder::check_state_every`] (1 s), paid by the call that finds it due.
/// - A record deleted from the store by hand (a support action) keeps replaying from the tier
///   of each process that holds it, until it expires there or the process restarts. Records a
///   store loses and notices (an UNLOGGED table emptied by a crash, Redis restarted without
///   persistence) are dropped from the tier at its next state check.
/// - While a state check fails (the store is down), nothing is answered from the tier: replays
///   fail with the store rather than contradict what it may hold after the outage.
/// - Memory: at most [`ReplayTierBuilder::max_cached_bytes`] for records, plus the pending
///   claims' fingerprints.
pub struct ReplayTier<S> {
    store: S,
    /// Seeds the hash every record id carries.
    ids: foldhash::fast::RandomState,
    completed: CompletedRecords,
    /// The fingerprints of claims made through the tier and not yet completed, by token: a
    /// completion names only its token, and its record needs the fingerprint.
    pending: moka::sync::Cache<LeaseToken, Fingerprint>,
    hits: AtomicU64,
    /// [`ReplayTierBuilder::check_state_every`].
    check_state_every: Duration,
    /// When the tier was built: the origin of `next_check_ms`.
    epoch: Instant,
    /// When the next replay asks the store whether it lost its records, in ms after `epoch`.
    next_check_ms: AtomicU64,
}

impl<S> std::fmt::Debug for ReplayTier<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplayTier")
            .field("cached", &self.completed.entries())
            .field("cached_bytes", &self.completed.bytes())
            .field("hits", &self.hits.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl<S: IdempotencyStore> ReplayTier<S> {
    /// A tier in front of `store`, with the default bounds.
    pub fn new(store: S) -> Self {
        ReplayTier::builder(store).build()
    }

    /// A builder for a tier in front of `store`.
    pub fn builder(store: S) -> ReplayTierBuilder<S> {
        ReplayTierBuilder {
            store,
            max_cached_bytes: 16 * 1024 * 1024,
            max_pending_claims: 100_000,
            check_state_every: Duration::from_secs(1),
        }
    }

    /// The store behind the tier.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// Replays answered by the tier without asking the store, since it was built (also counted
    /// in `idempotency_replay_tier_hits_total`).
    pub fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }

    /// Completed records the tier holds (after pending cache maintenance).
    pub fn cached_records(&self) -> u64 {
        self.completed.maintain();
        self.completed.entries()
    }

    /// Asks the store whether it lost its records, if the interval since the last check has
    /// passed (one caller at a time does it; the others go on). `false` when the check failed:
    /// the store's state is unknown, so nothing is answered from the tier until a check
    /// succeeds.
    async fn check_state_when_due(&self) -> bool {
        let now = Instant::now()
            .saturating_duration_since(self.epoch)
            .as_millis() as u64;
        let due = self.next_check_ms.load(Ordering::Relaxed);
        if now < due {
            return true;
        }
        let next = now.saturating_add(self.check_state_every.as_millis() as u64);
        if self
            .next_check_ms
            .compare_exchange(due, next, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
        {
            return true;
        }
        match self.store.check_state().await {
            Ok(_) => true,
            Err(error) => {
                // The next call asks again.
                self.next_check_ms.store(now, Ordering::Relaxed);
                tracing::debug!(error = %idempotency_core::ErrorChain(&error), "the replay tier could not check the store's state; asking the store");
                false
            }
        }
    }

    /// When the store is asked, and its state-loss count then.
    fn asked(&self) -> Asked {
        Asked {
            at: Instant::now(),
            losses: self.store.state_losses(),
        }
    }

    /// The completed record of `id` the tier holds, if it has not expired.
    fn cached(&self, id: &[u8]) -> Result<Option<Record>, StoreError> {
        let Some(completed) = self.completed.get(id) else {
            return Ok(None);
        };
        let now = Instant::now();
        if completed.expires_at <= now {
            return Ok(None);
        }
        if completed.losses != self.store.state_losses() {
            // Copied before the store lost its records (and noticed): the store may hold
            // another request's record for this key now, or none.
            self.completed.remove(id);
            return Ok(None);
        }
        // Encoded by this process: decoding fails only on a bug, reported as such.
        let response = completed
            .response()
            .map_err(|e| StoreError::corrupt(self.store.backend(), e))?;
        self.hits.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("idempotency_replay_tier_hits_total").increment(1);
        Ok(Some(Record {
            fingerprint: completed.fingerprint,
            state: RecordState::Completed {
                response,
                retention_remaining: completed.expires_at - now,
            },
        }))
    }

    /// Keeps a completed record the store returned; `asked` is when the store was asked, so
    /// the copy's deadline is no later than the store's.
    fn keep_if_completed(&self, id: &IdBuf, record: &Record, asked: Asked) {
        if let RecordState::Completed {
            response,
            retention_remaining,
        } = &record.state
        {
            // Less a millisecond: the store rounds the time left to one.
            let left = retention_remaining.saturating_sub(Duration::from_millis(1));
            let record =
                Completed::new(record.fingerprint, response, asked.at + left, asked.losses);
            self.completed.insert(id.to_owned_id(), record);
        }
    }
}

/// When the store was asked for a record, and its state-loss count then.
#[derive(Clone, Copy)]
struct Asked {
    at: Instant,
    losses: u64,
}

#[async_trait]
impl<S: IdempotencyStore> IdempotencyStore for ReplayTier<S> {
    fn backend(&self) -> &'static str {
        self.store.backend()
    }

    async fn claim(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        token: LeaseToken,
        lease: Duration,
    ) -> Result<ClaimOutcome, StoreError> {
        let id = IdBuf::new(&self.ids, scope, key);
        if self.check_state_when_due().await
            && let Some(record) = self.cached(id.as_bytes())?
        {
            return Ok(ClaimOutcome::Existing(record));
        }
        let asked = self.asked();
        let outcome = self
            .store
            .claim(scope, key, fingerprint, token, lease)
            .await?;
        match &outcome {
            ClaimOutcome::Claimed => self.pending.insert(token, *fingerprint),
            ClaimOutcome::Existing(record) => self.keep_if_completed(&id, record, asked),
        }
        Ok(outcome)
    }

    async fn complete(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        token: LeaseToken,
        response: &StoredResponse,
        retention: Duration,
    ) -> Result<FenceOutcome, StoreError> {
        let asked = self.asked();
        let outcome = self
            .store
            .complete(scope, key, token, response, retention)
            .await?;
        // After an error the claim may still be held and its completion retried: keep the
        // fingerprint until an answer.
        if let Some(fingerprint) = self.pending.remove(&token)
            && outcome == FenceOutcome::Applied
        {
            let id = IdBuf::new(&self.ids, scope, key);
            let record = Completed::new(fingerprint, response, asked.at + retention, asked.losses);
            self.completed.insert(id.to_owned_id(), record);
        }
        Ok(outcome)
    }

    async fn extend(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        token: LeaseToken,
        lease: Duration,
    ) -> Result<FenceOutcome, StoreError> {
        self.store.extend(scope, key, token, lease).await
    }

    async fn release(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        token: LeaseToken,
    ) -> Result<FenceOutcome, StoreError> {
        let outcome = self.store.release(scope, key, token).await?;
        self.pending.invalidate(&token);
        Ok(outcome)
    }

    async fn get(&self, scope: &Scope, key: &IdempotencyKey) -> Result<Option<Record>, StoreError> {
        let id = IdBuf::new(&self.ids, scope, key);
        if self.check_state_when_due().await
            && let Some(record) = self.cached(id.as_bytes())?
        {
            return Ok(Some(record));
        }
        let asked = self.asked();
        let record = self.store.get(scope, key).await?;
        if let Some(record) = &record {
            self.keep_if_completed(&id, record, asked);
        }
        Ok(record)
    }

    async fn purge_expired(&self, limit: usize) -> Result<u64, StoreError> {
        self.completed.maintain();
        self.store.purge_expired(limit).await
    }

    /// The store's own: a transactional completion commits in the store's database, and its
    /// record enters the tier on its first replay.
    fn transactional(&self) -> Option<&dyn TransactionalStore> {
        self.store.transactional()
    }

    fn state_losses(&self) -> u64 {
        self.store.state_losses()
    }

    async fn check_state(&self) -> Result<bool, StoreError> {
        self.store.check_state().await
    }

    /// The store's: the tier's copies are a cache of its records.
    async fn footprint(&self) -> Result<Option<Footprint>, StoreError> {
        self.store.footprint().await
    }

    /// The store's pool.
    fn pool_status(&self) -> Option<idempotency_core::store::PoolStatus> {
        self.store.pool_status()
    }

    fn settled_keys(&self) -> Option<&idempotency_core::store::SettledKeys> {
        self.store.settled_keys()
    }

    async fn watch_settle(&self, scope: &Scope, key: &IdempotencyKey) -> Result<(), StoreError> {
        self.store.watch_settle(scope, key).await
    }
}
