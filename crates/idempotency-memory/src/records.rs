//! The memory store's records: one sharded hash table holds the claims of running requests and
//! the completed records alike, so a claim is one lookup under one lock, and a completion turns
//! the claim's slot into the record in place.
//!
//! Completed records are bounded by the memory they take. Each shard keeps its completed records
//! in the order they were last used (a queue of [`Use`]s; using a record again pushes it anew
//! and leaves its old use behind, skipped when reached and compacted away), and publishes when
//! its least recently used record was last used in an atomic of its own. At the bound, eviction
//! takes the shard whose published time is the oldest, so the store evicts its least recently
//! used record, exact to the millisecond (records last used in the same millisecond in different
//! shards go in any order), without a lock over the whole store: a scan of 64 atomics.
//!
//! This replaced a moka cache for the completed records: at the bound, moka's per-entry
//! bookkeeping (its write log, access-order and timer-wheel nodes, the garbage collection of its
//! lock-free table) cost about 10 µs of CPU per fresh key, more than the layer and the engine
//! together; see `docs/benchmarks.md`.

mod claim;
mod evict;
mod shard;

use crate::BACKEND;
use crate::id::hash_of;
use crate::shares::Shares;
use crate::sync::{AtomicU64, AtomicUsize, Mutex, MutexGuard, Ordering};
use hashbrown::hash_table::Entry as Slot;
use idempotency_core::store::{ClaimOutcome, FenceOutcome, Record};
use idempotency_core::{LeaseToken, StoreError, StoredResponse};
use shard::{Completed, Entry, Shard, record_of, weight};
use std::time::{Duration, Instant};

const SHARDS: usize = 64;

/// The lowest of the hash bits that pick a record's shard.
///
/// Within a shard, hashbrown places a record by the hash's low bits (as many as the table has
/// buckets: 2^20 is ample for one shard) and filters a lookup's candidates by a tag made of its
/// top 7 bits. The shard must come from other bits: picked by the top bits, every record of a
/// shard shared its tag's top 6 bits, so a lookup compared the id of nearly every record in the
/// probed group (a cache miss each), which a profile of fresh keys showed at 8% of the
/// server's CPU in `claim` and 5% in `memcmp`.
const SHARD_SHIFT: u32 = 32;

/// The shard of a record whose id carries `hash`.
fn shard_index(hash: u64) -> usize {
    (hash >> SHARD_SHIFT) as usize % SHARDS
}

/// A shard's published time when it has no completed record to evict.
const EMPTY: u64 = u64::MAX;

/// What one completed record costs beyond its id and encoded response, in bytes: its slot in
/// the table (with the table's spare capacity), its places in the recency queue, and the
/// allocator's headers on the id and the response. Measured on x86-64 Linux with glibc by
/// `tests/memory_bound.rs` (resident memory of a full store over the bytes counted).
pub(crate) const COMPLETED_OVERHEAD: usize = 366;

/// What happens when the completed records reach the bound.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum WhenFull {
    /// Evict the least recently used completed records to make room (the default): a record
    /// read or replayed counts as used. The order is exact to the millisecond (records last
    /// used in the same millisecond go in any order), and a completion never evicts the record
    /// it stored. A retry of an evicted key runs its request again; evictions
    /// are counted ([`MemoryStore::evicted_records`](crate::MemoryStore::evicted_records) and
    /// `idempotency_memory_evictions_total`).
    #[default]
    EvictLeastRecentlyUsed,
    /// Keep every completed record until it expires, and refuse new claims while the bound is
    /// reached: they fail with a retryable `StoreError::Full` (503 with `Retry-After` at the
    /// HTTP layer). Nothing runs twice, at the price of refusing new requests at capacity.
    /// A refused claim first has the expired records removed (at most every 100 ms), so
    /// claims are taken again as records expire. Responses of requests already running are still stored, so
    /// the bound can be passed by at most the in-flight requests' responses.
    RefuseNewClaims,
}

/// The table and its accounting.
pub(crate) struct Records {
    shards: Box<[Mutex<Shard>]>,
    in_flight: AtomicUsize,
    max_in_flight: usize,
    /// Bytes the completed records take, by [`weight`].
    bytes: AtomicU64,
    max_bytes: u64,
    when_full: WhenFull,
    /// Each scope's share of `max_bytes`.
    shares: Shares,
    evicted: AtomicU64,
    /// Each shard's [`Shard::oldest_use`], written under the shard's lock (and only when it
    /// changes, so the cores do not pass these cache lines back and forth on every use), read
    /// without it to pick the shard to evict from.
    oldest: Box<[AtomicU64]>,
    /// When the table was built: the origin of `last_sweep` and of the uses' times.
    epoch: Instant,
    /// Milliseconds from `epoch` to the last sweep of expired records a refused claim ran.
    last_sweep: AtomicU64,
}

/// How often, at most, claims refused at the bound sweep the table of expired records.
const SWEEP_INTERVAL: Duration = Duration::from_millis(100);

/// A claim's attempt under its shard's lock.
enum Attempt {
    Done(Result<ClaimOutcome, StoreError>),
    /// The bound is reached and the claim would be refused: sweep, then try once more.
    Full,
}

impl Records {
    /// `scope_share`: the most one scope's completed records may weigh before its new claims
    /// are refused (`u64::MAX`: no share).
    pub(crate) fn new(
        max_bytes: u64,
        max_in_flight: usize,
        when_full: WhenFull,
        scope_share: u64,
    ) -> Self {
        Records {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            in_flight: AtomicUsize::new(0),
            max_in_flight,
            bytes: AtomicU64::new(0),
            max_bytes,
            when_full,
            shares: Shares::new(scope_share),
            evicted: AtomicU64::new(0),
            oldest: (0..SHARDS).map(|_| AtomicU64::new(EMPTY)).collect(),
            epoch: Instant::now(),
            last_sweep: AtomicU64::new(0),
        }
    }

    fn lock(&self, index: usize) -> MutexGuard<'_, Shard> {
        // No code panics while holding a shard lock; recover the table if that ever changes.
        self.shards[index]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The shard of a record whose id carries `hash`: see [`shard_index`].
    fn shard_of(&self, hash: u64) -> MutexGuard<'_, Shard> {
        self.lock(shard_index(hash))
    }

    /// Milliseconds from the store's epoch to `now`.
    fn millis(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.epoch).as_millis() as u64
    }

    /// Takes `freed` bytes off the count for a record about to be evicted, if the count is still
    /// over the bound: the check and the subtraction are one atomic step, so two completions
    /// evicting at once never both evict for the same excess (the schedule checker found two
    /// racing completions evicting each other's records, leaving the store empty with room
    /// for one).
    fn reserve_eviction(&self, freed: u64) -> bool {
        self.bytes
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bytes| {
                (bytes > self.max_bytes).then(|| bytes.saturating_sub(freed))
            })
            .is_ok()
    }

    /// Publishes the oldest use of shard `index`, whose lock the caller holds as `shard`.
    fn publish(&self, index: usize, shard: &Shard) {
        let oldest = shard.oldest_use();
        let published = &self.oldest[index];
        if published.load(Ordering::Relaxed) != oldest {
            published.store(oldest, Ordering::Relaxed);
        }
    }

    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }

    pub(crate) fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    pub(crate) fn evicted(&self) -> u64 {
        self.evicted.load(Ordering::Relaxed)
    }

    pub(crate) fn completed(&self) -> usize {
        (0..SHARDS).map(|i| self.lock(i).completed).sum()
    }

    /// Takes one more in-flight claim, unless `max_in_flight` are held.
    fn take_in_flight(&self) -> Result<(), StoreError> {
        #[cfg(idempotency_loom)]
        if crate::sync::SEEDED_RACE.load(std::sync::atomic::Ordering::Relaxed) {
            // The seeded race: a check, then an act, on the shared count.
            let held = self.in_flight.load(Ordering::Relaxed);
            if held >= self.max_in_flight {
                return Err(StoreError::Full {
                    backend: BACKEND,
                    reason: format!("{} claims are in flight", self.max_in_flight),
                });
            }
            self.in_flight.store(held + 1, Ordering::Relaxed);
            return Ok(());
        }
        let held = self.in_flight.fetch_add(1, Ordering::Relaxed);
        if held >= self.max_in_flight {
            self.in_flight.fetch_sub(1, Ordering::Relaxed);
            return Err(StoreError::Full {
                backend: BACKEND,
                reason: format!("{} claims are in flight", self.max_in_flight),
            });
        }
        Ok(())
    }

    /// Whether a new claim must be refused because completed records fill the bound.
    fn refuses_claims(&self) -> bool {
        self.when_full == WhenFull::RefuseNewClaims && self.bytes() >= self.max_bytes
    }

    /// Removes the expired records of every shard, one shard locked at a time, unless a sweep
    /// ran less than [`SWEEP_INTERVAL`] ago (so a store refusing claims under load sweeps ten
    /// times a second at most, not once per refused claim).
    fn sweep_if_due(&self) {
        let now = self.millis(Instant::now());
        let last = self.last_sweep.load(Ordering::Relaxed);
        if now.saturating_sub(last) < SWEEP_INTERVAL.as_millis() as u64 && last != 0 {
            return;
        }
        // One sweeper at a time; the others are refused as before.
        if self
            .last_sweep
            .compare_exchange(last, now.max(1), Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            self.purge_expired(usize::MAX);
        }
    }

    /// Whether a new claim of `id` must be refused because its scope holds its share (only
    /// under [`WhenFull::RefuseNewClaims`]: an evicting store evicts the scope's own records).
    fn refuses_scope(&self, id: &[u8]) -> bool {
        self.when_full == WhenFull::RefuseNewClaims && self.shares.is_full(id)
    }

    fn scope_full(&self) -> StoreError {
        StoreError::ScopeFull {
            backend: BACKEND,
            reason: format!(
                "its completed records weigh its share of the bound, {} bytes; new keys wait \
                 for them to expire",
                self.shares.limit()
            ),
            retry_after: None,
        }
    }

    fn full() -> StoreError {
        StoreError::Full {
            backend: BACKEND,
            reason: "completed records fill the memory bound; new claims wait for them to expire"
                .into(),
        }
    }

    /// Stores `response` as the record of `id` if `token` holds its live claim.
    pub(crate) fn complete(
        &self,
        id: &[u8],
        token: LeaseToken,
        response: &StoredResponse,
        retention: Duration,
    ) -> FenceOutcome {
        // Encoded before the lock is taken, so the shard is held for no longer than a lookup.
        let encoded = response.encode();
        let hash = hash_of(id);
        let mut guard = self.shard_of(hash);
        let now = Instant::now();
        let shard = &mut *guard;
        let Some((_, entry)) = shard.table.find_mut(hash, |(k, _)| **k == *id) else {
            return FenceOutcome::Stale;
        };
        let fingerprint = match entry {
            Entry::InFlight(claim) if claim.token == token && claim.lease_until > now => {
                claim.fingerprint
            }
            _ => return FenceOutcome::Stale,
        };
        let added = weight(id.len(), &encoded);
        let at = self.millis(now);
        let stamp = Shard::used(&mut shard.recency, &mut shard.next_stamp, hash, at);
        *entry = Entry::Completed(Completed {
            fingerprint,
            encoded,
            expires_at: now + retention,
            stamp,
        });
        shard.completed += 1;
        shard.compact();
        self.publish(shard_index(hash), shard);
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.bytes.fetch_add(added, Ordering::Relaxed);
        let over_share = self.shares.charge(id, hash, added);
        drop(guard);
        if self.when_full == WhenFull::EvictLeastRecentlyUsed {
            if over_share {
                self.evict_own_records(id, (shard_index(hash), stamp));
            }
            self.evict_to_bound((shard_index(hash), stamp));
        }
        FenceOutcome::Applied
    }

    /// Moves the lease of `id`'s live claim held by `token` to `lease` from now.
    pub(crate) fn extend(&self, id: &[u8], token: LeaseToken, lease: Duration) -> FenceOutcome {
        let hash = hash_of(id);
        let mut shard = self.shard_of(hash);
        let now = Instant::now();
        match shard.table.find_mut(hash, |(k, _)| **k == *id) {
            Some((_, Entry::InFlight(claim)))
                if claim.token == token && claim.lease_until > now =>
            {
                claim.lease_until = now + lease;
                FenceOutcome::Applied
            }
            _ => FenceOutcome::Stale,
        }
    }

    /// Removes `id`'s live claim if `token` holds it.
    pub(crate) fn release(&self, id: &[u8], token: LeaseToken) -> FenceOutcome {
        let hash = hash_of(id);
        let mut shard = self.shard_of(hash);
        let now = Instant::now();
        let found = shard.table.find_entry(hash, |(k, _)| **k == *id);
        match found {
            Ok(slot) if matches!(&slot.get().1, Entry::InFlight(c) if c.token == token && c.lease_until > now) =>
            {
                slot.remove();
                self.in_flight.fetch_sub(1, Ordering::Relaxed);
                FenceOutcome::Applied
            }
            _ => FenceOutcome::Stale,
        }
    }

    /// The live record of `id`; a record that is no longer live is removed.
    pub(crate) fn get(&self, id: &[u8]) -> Result<Option<Record>, StoreError> {
        let hash = hash_of(id);
        let mut guard = self.shard_of(hash);
        let now = Instant::now();
        let shard = &mut *guard;
        let Slot::Occupied(mut slot) =
            shard
                .table
                .entry(hash, |(k, _)| **k == *id, |(k, _)| hash_of(k))
        else {
            return Ok(None);
        };
        let entry = &mut slot.get_mut().1;
        if entry.is_live(now) {
            if let Entry::Completed(record) = entry {
                let at = self.millis(now);
                record.stamp = Shard::used(&mut shard.recency, &mut shard.next_stamp, hash, at);
            }
            let record = record_of(entry, now)?;
            shard.compact();
            self.publish(shard_index(hash), shard);
            return Ok(Some(record));
        }
        let ((id, entry), _) = slot.remove();
        match entry {
            Entry::InFlight(_) => {
                self.in_flight.fetch_sub(1, Ordering::Relaxed);
            }
            Entry::Completed(record) => {
                shard.completed -= 1;
                let freed = weight(id.len(), &record.encoded);
                self.bytes.fetch_sub(freed, Ordering::Relaxed);
                self.shares.refund(&id, freed);
            }
        }
        Ok(None)
    }

    /// Removes up to `limit` records that are no longer live; how many it removed.
    pub(crate) fn purge_expired(&self, limit: usize) -> u64 {
        let now = Instant::now();
        let mut purged = 0;
        for index in 0..SHARDS {
            if purged >= limit {
                break;
            }
            let (claims, completed, bytes) =
                self.lock(index).sweep(now, limit - purged, &self.shares);
            self.in_flight.fetch_sub(claims, Ordering::Relaxed);
            self.bytes.fetch_sub(bytes, Ordering::Relaxed);
            purged += claims + completed;
        }
        purged as u64
    }
}

#[cfg(test)]
mod accounting_tests;
#[cfg(all(test, idempotency_loom))]
mod loom_tests;
#[cfg(test)]
mod test_support;
#[cfg(test)]
mod tests;
