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

use crate::BACKEND;
use crate::id::{RecordId, hash_of};
use crate::shares::Shares;
use bytes::Bytes;
use hashbrown::HashTable;
use hashbrown::hash_table::Entry as Slot;
use idempotency_core::{
    ClaimOutcome, FenceOutcome, Fingerprint, LeaseToken, Record, RecordState, StoreError,
    StoredResponse,
};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
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

/// A running request's claim.
#[derive(Debug)]
struct Claim {
    fingerprint: Fingerprint,
    token: LeaseToken,
    lease_until: Instant,
}

/// A completed record.
#[derive(Debug)]
struct Completed {
    fingerprint: Fingerprint,
    /// The response in the stores' one encoding: compact, and its size is what it costs.
    encoded: Bytes,
    expires_at: Instant,
    /// Its latest place in the shard's recency queue.
    stamp: u64,
}

/// A use of a completed record, in its shard's recency queue: the record's hash, the stamp it
/// was given (a use whose record is gone or was used again since, so carries another stamp, is
/// stale), and when it happened (milliseconds after the store's epoch).
#[derive(Clone, Copy, Debug)]
struct Use {
    hash: u64,
    stamp: u64,
    at: u64,
}

/// What [`Shard::evict_least_recently_used`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Eviction {
    /// Evicted a record of this weight.
    Freed(u64),
    /// Nothing to evict: no completed record, or only the one the caller keeps.
    Nothing,
    /// The shard's least recently used record was used after the given time: another shard
    /// holds an older one.
    Newer,
}

#[derive(Debug)]
enum Entry {
    InFlight(Claim),
    Completed(Completed),
}

/// Bytes a completed record under an id of `id_len` bytes takes.
fn weight(id_len: usize, encoded: &Bytes) -> u64 {
    (id_len + encoded.len() + COMPLETED_OVERHEAD) as u64
}

/// The record a live entry answers with.
fn record_of(entry: &Entry, now: Instant) -> Result<Record, StoreError> {
    Ok(match entry {
        Entry::InFlight(claim) => Record {
            fingerprint: claim.fingerprint,
            state: RecordState::InFlight {
                lease_remaining: claim.lease_until.saturating_duration_since(now),
            },
        },
        Entry::Completed(record) => Record {
            fingerprint: record.fingerprint,
            state: RecordState::Completed {
                // Encoded by this process: decoding fails only on a bug, reported as such.
                response: StoredResponse::decode(record.encoded.clone())
                    .map_err(|e| StoreError::corrupt(BACKEND, e))?,
                retention_remaining: record.expires_at.saturating_duration_since(now),
            },
        },
    })
}

impl Entry {
    fn is_live(&self, now: Instant) -> bool {
        match self {
            Entry::InFlight(claim) => claim.lease_until > now,
            Entry::Completed(record) => record.expires_at > now,
        }
    }
}

/// One shard: the records whose ids hash to it.
#[derive(Default)]
struct Shard {
    table: HashTable<(RecordId, Entry)>,
    /// Uses of completed records from least to most recent; a stale one is skipped.
    recency: VecDeque<Use>,
    next_stamp: u64,
    /// Completed records in `table`.
    completed: usize,
}

impl Shard {
    /// A new stamp for a record of `hash` used at `at`, queued as the most recent use.
    fn used(recency: &mut VecDeque<Use>, next_stamp: &mut u64, hash: u64, at: u64) -> u64 {
        let stamp = *next_stamp;
        *next_stamp += 1;
        recency.push_back(Use { hash, stamp, at });
        stamp
    }

    /// Whether `used` is the latest use of a record still in the table.
    fn is_current(table: &HashTable<(RecordId, Entry)>, used: &Use) -> bool {
        table
            .find(
                used.hash,
                |(_, e)| matches!(e, Entry::Completed(c) if c.stamp == used.stamp),
            )
            .is_some()
    }

    /// Drops stale uses once they outnumber the records, so the queue stays within about
    /// twice the completed records (amortized: each pass halves it at least).
    fn compact(&mut self) {
        if self.recency.len() <= 2 * self.completed + 64 {
            return;
        }
        let table = &self.table;
        self.recency.retain(|used| Self::is_current(table, used));
    }

    /// When this shard's least recently used record was last used, as far as its queue says
    /// without looking at the records: never later than the truth (the front use may be stale,
    /// its record used again since), [`EMPTY`] when the queue is.
    fn oldest_use(&self) -> u64 {
        self.recency.front().map_or(EMPTY, |used| used.at)
    }

    /// Removes the least recently used completed record, unless it is the one stamped `keep`
    /// or it was used after `not_after` (another shard holds an older one).
    fn evict_least_recently_used(
        &mut self,
        keep: Option<u64>,
        not_after: u64,
        shares: &Shares,
    ) -> Eviction {
        while let Some(&front) = self.recency.front() {
            if keep == Some(front.stamp) {
                // Every use before it was stale: the kept record is the shard's only one.
                return Eviction::Nothing;
            }
            let found = self.table.find_entry(
                front.hash,
                |(_, e)| matches!(e, Entry::Completed(c) if c.stamp == front.stamp),
            );
            let Ok(slot) = found else {
                self.recency.pop_front();
                continue;
            };
            if front.at > not_after {
                return Eviction::Newer;
            }
            self.recency.pop_front();
            let ((id, entry), _) = slot.remove();
            self.completed -= 1;
            if let Entry::Completed(record) = entry {
                let freed = weight(id.len(), &record.encoded);
                shares.refund(&id, freed);
                return Eviction::Freed(freed);
            }
        }
        Eviction::Nothing
    }

    /// Removes up to `budget` records that are no longer live: returns the claims and the
    /// completed records removed, and the completed records' weight.
    fn sweep(&mut self, now: Instant, mut budget: usize, shares: &Shares) -> (usize, usize, u64) {
        let (mut claims, mut completed, mut bytes) = (0, 0, 0);
        self.table.retain(|(id, entry)| {
            if budget == 0 || entry.is_live(now) {
                return true;
            }
            budget -= 1;
            match entry {
                Entry::InFlight(_) => claims += 1,
                Entry::Completed(record) => {
                    completed += 1;
                    let freed = weight(id.len(), &record.encoded);
                    shares.refund(id, freed);
                    bytes += freed;
                }
            }
            false
        });
        self.completed -= completed;
        (claims, completed, bytes)
    }
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

    /// Claims `id` for a running request, unless a live record holds it. At the bound under
    /// [`WhenFull::RefuseNewClaims`], expired records are swept first (see
    /// [`Records::sweep_if_due`]).
    pub(crate) fn claim(
        &self,
        id: &[u8],
        fingerprint: &Fingerprint,
        token: LeaseToken,
        lease: Duration,
    ) -> Result<ClaimOutcome, StoreError> {
        match self.try_claim(id, fingerprint, token, lease, true) {
            Attempt::Done(outcome) => outcome,
            Attempt::Full => {
                self.sweep_if_due();
                match self.try_claim(id, fingerprint, token, lease, false) {
                    Attempt::Done(outcome) => outcome,
                    Attempt::Full => Err(Self::full()),
                }
            }
        }
    }

    /// One attempt at [`Records::claim`]; `may_sweep` says whether a full store may ask for a
    /// sweep ([`Attempt::Full`]) rather than refuse.
    fn try_claim(
        &self,
        id: &[u8],
        fingerprint: &Fingerprint,
        token: LeaseToken,
        lease: Duration,
        may_sweep: bool,
    ) -> Attempt {
        let hash = hash_of(id);
        let mut guard = self.shard_of(hash);
        let now = Instant::now();
        let claim = Claim {
            fingerprint: *fingerprint,
            token,
            lease_until: now + lease,
        };
        let shard = &mut *guard;
        let found = shard.table.find_mut(hash, |(k, _)| **k == *id);
        if let Some((_, entry)) = found {
            if entry.is_live(now) {
                if let Entry::Completed(record) = entry {
                    let at = self.millis(now);
                    record.stamp = Shard::used(&mut shard.recency, &mut shard.next_stamp, hash, at);
                }
                let record = record_of(entry, now).map(ClaimOutcome::Existing);
                shard.compact();
                self.publish(shard_index(hash), shard);
                return Attempt::Done(record);
            }
            // A lapsed claim or an expired record: the new claim takes its slot, unless its
            // scope holds its share.
            if self.refuses_scope(id) {
                return Attempt::Done(Err(self.scope_full()));
            }
            match entry {
                // The lapsed claim's place among the in-flight ones passes to the new claim.
                Entry::InFlight(_) => *entry = Entry::InFlight(claim),
                Entry::Completed(record) => {
                    let freed = weight(id.len(), &record.encoded);
                    if let Err(full) = self.take_in_flight() {
                        return Attempt::Done(Err(full));
                    }
                    *entry = Entry::InFlight(claim);
                    shard.completed -= 1;
                    self.bytes.fetch_sub(freed, Ordering::Relaxed);
                    self.shares.refund(id, freed);
                }
            }
            return Attempt::Done(Ok(ClaimOutcome::Claimed));
        }
        if self.refuses_scope(id) {
            return Attempt::Done(Err(self.scope_full()));
        }
        if self.refuses_claims() {
            return match may_sweep {
                true => Attempt::Full,
                false => Attempt::Done(Err(Self::full())),
            };
        }
        if let Err(full) = self.take_in_flight() {
            return Attempt::Done(Err(full));
        }
        shard
            .table
            .insert_unique(hash, (Box::from(id), Entry::InFlight(claim)), |(k, _)| {
                hash_of(k)
            });
        Attempt::Done(Ok(ClaimOutcome::Claimed))
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
        self.shares.charge(id, hash, added);
        drop(guard);
        if self.when_full == WhenFull::EvictLeastRecentlyUsed {
            if self.shares.is_over(id) {
                self.evict_own_records(id, (shard_index(hash), stamp));
            }
            self.evict_to_bound((shard_index(hash), stamp));
        }
        FenceOutcome::Applied
    }

    /// At the bound, evicts the oldest stored records of the scope of `id` while it holds more
    /// than its share (never `just_stored`, the record the calling completion stored): a scope
    /// over its share makes room from its own records, not other scopes'.
    fn evict_own_records(&self, id: &[u8], just_stored: (usize, u64)) {
        let scope = crate::id::scope_of(id);
        while self.bytes() > self.max_bytes && self.shares.is_over(id) {
            let Some(hash) = self.shares.oldest(id) else {
                return;
            };
            let index = shard_index(hash);
            let mut guard = self.lock(index);
            let shard = &mut *guard;
            let found = shard.table.find_entry(hash, |(k, e)| {
                crate::id::scope_of(k) == scope
                    && matches!(e, Entry::Completed(c) if (index, c.stamp) != just_stored)
            });
            let Ok(slot) = found else {
                continue; // gone since, or the record just stored
            };
            let ((gone, entry), _) = slot.remove();
            if let Entry::Completed(record) = entry {
                shard.completed -= 1;
                let freed = weight(gone.len(), &record.encoded);
                self.bytes.fetch_sub(freed, Ordering::Relaxed);
                self.shares.refund(&gone, freed);
                self.evicted.fetch_add(1, Ordering::Relaxed);
                metrics::counter!("idempotency_memory_evictions_total").increment(1);
            }
            shard.compact();
            self.publish(index, shard);
        }
    }

    /// Evicts the least recently used records until the bound holds: each time from the shard
    /// whose published oldest use is the oldest. Published times are never later than the
    /// truth, so when that shard's least recently used record turns out to be newer than
    /// another shard's published time, the shard publishes its true time and the choice is
    /// made again. Never evicts `just_stored` (its shard and stamp), the record the calling
    /// completion stored: in a store of few records it may be the oldest, and evicting it
    /// would make the retry that may follow at once run again. (A record heavier than the
    /// whole bound so stays until the next completion.)
    fn evict_to_bound(&self, just_stored: (usize, u64)) {
        // Shards with nothing to evict but the record just stored.
        let mut passed = [false; SHARDS];
        // Choices made again because the chosen shard's oldest record was newer than it said.
        let mut made_again = 0;
        while self.bytes() > self.max_bytes {
            let (mut chosen, mut oldest, mut next) = (None, EMPTY, EMPTY);
            for (index, published) in self.oldest.iter().enumerate() {
                let at = published.load(Ordering::Relaxed);
                if passed[index] || at == EMPTY {
                    continue;
                }
                if chosen.is_none() || at < oldest {
                    next = oldest;
                    (chosen, oldest) = (Some(index), at);
                } else if at < next {
                    next = at;
                }
            }
            let Some(index) = chosen else {
                return;
            };
            // Each choice made again follows a shard publishing a later time, so this ends;
            // the bound only guards against completions elsewhere racing this one forever,
            // after which the chosen shard's oldest record goes whatever its time.
            let not_after = if made_again > 4 * SHARDS { EMPTY } else { next };
            let keep = (index == just_stored.0).then_some(just_stored.1);
            let eviction = {
                let mut shard = self.lock(index);
                let eviction = shard.evict_least_recently_used(keep, not_after, &self.shares);
                self.publish(index, &shard);
                eviction
            };
            match eviction {
                Eviction::Freed(freed) => {
                    self.bytes.fetch_sub(freed, Ordering::Relaxed);
                    self.evicted.fetch_add(1, Ordering::Relaxed);
                    metrics::counter!("idempotency_memory_evictions_total").increment(1);
                }
                Eviction::Newer => made_again += 1,
                Eviction::Nothing => passed[index] = true,
            }
        }
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
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use idempotency_core::BodyCanonicalization;
    use idempotency_core::http::{HeaderMap, StatusCode};

    const HOUR: Duration = Duration::from_secs(3600);

    /// An id in shard 0 (its carried hash has the top bits clear), distinct per `n`.
    fn id(n: u8) -> Vec<u8> {
        let mut id = u64::from(n).to_le_bytes().to_vec();
        id.extend_from_slice(&[0, 0, n]);
        id
    }

    fn fingerprint() -> Fingerprint {
        Fingerprint::of_request("POST", "/", b"", BodyCanonicalization::Raw)
    }

    fn response() -> StoredResponse {
        StoredResponse::new(
            StatusCode::OK,
            HeaderMap::new(),
            Bytes::from_static(b"done"),
        )
    }

    fn weight_of_one() -> u64 {
        weight(id(0).len(), &response().encode())
    }

    fn store(records: &Records, n: u8) {
        let token = LeaseToken::new();
        let claimed = records.claim(&id(n), &fingerprint(), token, HOUR).unwrap();
        assert_eq!(claimed, ClaimOutcome::Claimed);
        let completed = records.complete(&id(n), token, &response(), HOUR);
        assert_eq!(completed, FenceOutcome::Applied);
    }

    #[test]
    fn the_shard_bits_are_neither_hashbrown_s_tag_nor_its_bucket_bits() {
        let shard_bits = SHARD_SHIFT..SHARD_SHIFT + SHARDS.trailing_zeros();
        assert!(SHARDS.is_power_of_two());
        assert!(shard_bits.end <= 64 - 7, "overlaps the tag: {shard_bits:?}");
        assert!(
            shard_bits.start >= 24,
            "overlaps the bucket bits: {shard_bits:?}"
        );
        // Two hashes that differ only in their tag bits share a shard; in the shard bits, not.
        assert_eq!(shard_index(0), shard_index(0x7f << 57));
        assert_ne!(shard_index(0), shard_index(1 << SHARD_SHIFT));
    }

    #[test]
    fn the_least_recently_used_record_is_evicted_first() {
        let records = Records::new(
            3 * weight_of_one(),
            100,
            WhenFull::EvictLeastRecentlyUsed,
            u64::MAX,
        );
        for n in 1..=3 {
            store(&records, n);
        }
        assert_eq!(records.bytes(), 3 * weight_of_one());
        // Reading record 1 makes record 2 the least recently used.
        assert!(records.get(&id(1)).unwrap().is_some());
        store(&records, 4);
        assert_eq!(records.evicted(), 1);
        assert!(records.get(&id(2)).unwrap().is_none(), "2 was evicted");
        for n in [1, 3, 4] {
            assert!(records.get(&id(n)).unwrap().is_some(), "{n} was kept");
        }
        assert_eq!(records.bytes(), 3 * weight_of_one());
        assert_eq!(records.completed(), 3);
    }

    #[test]
    fn a_completion_never_evicts_the_record_it_stored() {
        let one = weight(spread_id(0).len(), &response().encode());
        let records = Records::new(
            one + one / 2,
            100,
            WhenFull::EvictLeastRecentlyUsed,
            u64::MAX,
        );
        // An older record in shard 1, then a new one in shard 0, which holds nothing older
        // than the new record (the cursor of an earlier version of eviction started there).
        let (older, newer) = (spread_id(1), spread_id(0));
        assert_eq!(
            (shard_index(hash_of(&older)), shard_index(hash_of(&newer))),
            (1, 0)
        );
        for id in [&older, &newer] {
            let token = LeaseToken::new();
            records.claim(id, &fingerprint(), token, HOUR).unwrap();
            let done = records.complete(id, token, &response(), HOUR);
            assert_eq!(done, FenceOutcome::Applied);
        }
        assert_eq!(records.evicted(), 1);
        assert!(
            records.get(&newer).unwrap().is_some(),
            "the new record was kept"
        );
        assert!(
            records.get(&older).unwrap().is_none(),
            "the older one was evicted"
        );
    }

    /// Stores `id` and waits for the store's millisecond clock to move on, so the next use is
    /// later by its clock.
    fn store_id_then_tick(records: &Records, id: &[u8]) {
        let token = LeaseToken::new();
        records.claim(id, &fingerprint(), token, HOUR).unwrap();
        let done = records.complete(id, token, &response(), HOUR);
        assert_eq!(done, FenceOutcome::Applied);
        std::thread::sleep(Duration::from_millis(2));
    }

    /// Whether `id` has a completed record, without counting as a use.
    fn holds(records: &Records, id: &[u8]) -> bool {
        let hash = hash_of(id);
        let shard = records.shard_of(hash);
        let found = shard.table.find(hash, |(k, _)| **k == *id);
        matches!(found, Some((_, Entry::Completed(_))))
    }

    #[test]
    fn eviction_takes_the_store_s_least_recently_used_record_whatever_its_shard() {
        let one = weight(spread_id(0).len(), &response().encode());
        let records = Records::new(3 * one, 100, WhenFull::EvictLeastRecentlyUsed, u64::MAX);
        // Three records in shards 2, 1 and 0, oldest first; then the oldest is read again,
        // so the one in shard 1 is the least recently used. Shard 0 comes first in any scan,
        // and shard 2 held the oldest record before the read.
        let ids = [spread_id(2), spread_id(1), spread_id(0)];
        for id in &ids {
            store_id_then_tick(&records, id);
        }
        assert!(records.get(&ids[0]).unwrap().is_some());
        std::thread::sleep(Duration::from_millis(2));
        // A fourth record, in shard 0, passes the bound: one record goes.
        store_id_then_tick(&records, &spread_id(3));
        assert_eq!(records.evicted(), 1);
        assert!(!holds(&records, &ids[1]), "shard 1's record was evicted");
        for kept in [&ids[0], &ids[2], &spread_id(3)] {
            assert!(holds(&records, kept), "{kept:?} was kept");
        }
        // And the next: shard 0's first record is now the least recently used.
        store_id_then_tick(&records, &spread_id(4));
        assert_eq!(records.evicted(), 2);
        assert!(
            !holds(&records, &ids[2]),
            "shard 0's first record was evicted"
        );
        for kept in [&ids[0], &spread_id(3), &spread_id(4)] {
            assert!(holds(&records, kept), "{kept:?} was kept");
        }
    }

    /// An id in shard `shard`, distinct per `n`.
    fn id_in(shard: u64, n: u16) -> Vec<u8> {
        let hash = (shard << SHARD_SHIFT) | u64::from(n);
        let mut id = hash.to_le_bytes().to_vec();
        id.extend_from_slice(&n.to_le_bytes());
        id
    }

    #[test]
    fn one_completion_evicting_hundreds_of_records_keeps_the_order() {
        let one = weight(id_in(0, 0).len(), &response().encode());
        // 300 records in shard 1, one a millisecond; one in shard 2 among them (after the
        // 279th), read again after the last, so its shard says it is older than it is.
        let records = Records::new(301 * one, 1000, WhenFull::EvictLeastRecentlyUsed, u64::MAX);
        let read_again = id_in(2, 0);
        for n in 1..=300 {
            store_id_then_tick(&records, &id_in(1, n));
            if n == 279 {
                store_id_then_tick(&records, &read_again);
            }
        }
        assert!(records.get(&read_again).unwrap().is_some());
        assert_eq!(records.evicted(), 0);
        // One large response in shard 3 takes the room of 286 small records.
        let large = StoredResponse::new(
            StatusCode::OK,
            HeaderMap::new(),
            Bytes::from(vec![b'x'; 286 * one as usize - COMPLETED_OVERHEAD]),
        );
        let (id, token) = (id_in(3, 0), LeaseToken::new());
        records.claim(&id, &fingerprint(), token, HOUR).unwrap();
        let done = records.complete(&id, token, &large, HOUR);
        assert_eq!(done, FenceOutcome::Applied);
        assert!(records.evicted() >= 286, "{} evicted", records.evicted());
        assert!(
            holds(&records, &read_again),
            "the record read last was evicted before older ones"
        );
        assert!(
            holds(&records, &id_in(1, 300)),
            "the newest small record was kept"
        );
        assert!(!holds(&records, &id_in(1, 280)), "an older one was evicted");
    }

    #[test]
    fn a_replayed_record_does_not_grow_the_recency_queue_without_bound() {
        let records = Records::new(1 << 20, 100, WhenFull::EvictLeastRecentlyUsed, u64::MAX);
        store(&records, 1);
        for _ in 0..10_000 {
            assert!(records.get(&id(1)).unwrap().is_some());
        }
        let queued = records.lock(0).recency.len();
        assert!(queued <= 2 + 64 + 1, "{queued} pairs queued for one record");
        // The record's own pair survived compaction: it is still evictable.
        assert_eq!(
            records
                .lock(0)
                .evict_least_recently_used(None, EMPTY, &records.shares),
            Eviction::Freed(weight_of_one())
        );
    }

    #[test]
    fn a_claim_over_an_expired_record_takes_its_slot_and_frees_its_bytes() {
        let records = Records::new(1 << 20, 100, WhenFull::EvictLeastRecentlyUsed, u64::MAX);
        let token = LeaseToken::new();
        records.claim(&id(1), &fingerprint(), token, HOUR).unwrap();
        let done = records.complete(&id(1), token, &response(), Duration::ZERO);
        assert_eq!(done, FenceOutcome::Applied);
        assert_eq!(records.bytes(), weight_of_one());
        let again = records
            .claim(&id(1), &fingerprint(), LeaseToken::new(), HOUR)
            .unwrap();
        assert_eq!(again, ClaimOutcome::Claimed);
        assert_eq!((records.bytes(), records.completed()), (0, 0));
        assert_eq!(records.in_flight(), 1);
        // Its old recency pair is stale: nothing is left to evict.
        assert_eq!(
            records
                .lock(0)
                .evict_least_recently_used(None, EMPTY, &records.shares),
            Eviction::Nothing
        );
    }

    #[test]
    fn a_store_refusing_claims_sweeps_expired_records_and_takes_claims_again() {
        let records = Records::new(
            2 * weight_of_one(),
            100,
            WhenFull::RefuseNewClaims,
            u64::MAX,
        );
        for n in 1..=2 {
            let token = LeaseToken::new();
            records.claim(&id(n), &fingerprint(), token, HOUR).unwrap();
            let ttl = Duration::from_millis(if n == 1 { 0 } else { 3_600_000 });
            let done = records.complete(&id(n), token, &response(), ttl);
            assert_eq!(done, FenceOutcome::Applied);
        }
        // Record 1 has expired; the bound still counts it until a sweep.
        assert_eq!(records.bytes(), 2 * weight_of_one());
        let claimed = records
            .claim(&id(3), &fingerprint(), LeaseToken::new(), HOUR)
            .unwrap();
        assert_eq!(claimed, ClaimOutcome::Claimed);
        assert_eq!(records.bytes(), weight_of_one());
        assert_eq!(records.evicted(), 0);
    }

    /// An id of scope `scope` (one byte) and key `n`, laid out as the store's ids are, in shard
    /// `n % 4`.
    fn scoped_id(scope: u8, n: u16) -> Vec<u8> {
        let hash = (u64::from(n % 4) << SHARD_SHIFT) | u64::from(n) | (u64::from(scope) << 16);
        let mut id = hash.to_le_bytes().to_vec();
        id.extend_from_slice(&1u16.to_le_bytes());
        id.push(scope);
        id.extend_from_slice(&n.to_le_bytes());
        id
    }

    fn store_in(records: &Records, id: &[u8]) {
        let token = LeaseToken::new();
        let claimed = records.claim(id, &fingerprint(), token, HOUR);
        assert!(matches!(claimed, Ok(ClaimOutcome::Claimed)), "{claimed:?}");
        assert_eq!(
            records.complete(id, token, &response(), HOUR),
            FenceOutcome::Applied
        );
    }

    #[test]
    fn a_scope_flooding_a_full_store_evicts_only_its_own_records() {
        let one = weight(scoped_id(0, 0).len(), &response().encode());
        let records = Records::new(10 * one, 100, WhenFull::EvictLeastRecentlyUsed, 2 * one);
        // The victim's records are the store's least recently used when the flood starts.
        let victim: Vec<Vec<u8>> = (0..2).map(|n| scoped_id(b'b', n)).collect();
        victim.iter().for_each(|id| store_in(&records, id));
        for n in 0..500 {
            store_in(&records, &scoped_id(b'a', n));
            check_accounting(&records);
            assert!(records.bytes() <= 10 * one);
        }
        for id in &victim {
            assert!(
                holds(&records, id),
                "the flood evicted another scope's record"
            );
        }
        // The flooding scope kept its newest records, within the bound.
        assert!(holds(&records, &scoped_id(b'a', 499)));
        assert!(!holds(&records, &scoped_id(b'a', 0)));
        assert!(records.evicted() >= 490);
    }

    #[test]
    fn without_shares_the_same_flood_evicts_the_other_scope_s_records() {
        // What the shares prevent: one least-recently-used order for every scope.
        let one = weight(scoped_id(0, 0).len(), &response().encode());
        let records = Records::new(10 * one, 100, WhenFull::EvictLeastRecentlyUsed, u64::MAX);
        let victim = scoped_id(b'b', 0);
        store_in(&records, &victim);
        for n in 0..20 {
            store_in(&records, &scoped_id(b'a', n));
        }
        assert!(!holds(&records, &victim));
    }

    #[test]
    fn a_refusing_store_refuses_the_scope_at_its_share_and_not_the_others() {
        let one = weight(scoped_id(0, 0).len(), &response().encode());
        let records = Records::new(10 * one, 100, WhenFull::RefuseNewClaims, 2 * one);
        store_in(&records, &scoped_id(b'a', 0));
        store_in(&records, &scoped_id(b'a', 1));
        let refused = records.claim(&scoped_id(b'a', 2), &fingerprint(), LeaseToken::new(), HOUR);
        assert!(
            matches!(refused, Err(StoreError::ScopeFull { .. })),
            "{refused:?}"
        );
        // Its stored keys still answer, and another scope still claims.
        assert!(matches!(
            records.claim(&scoped_id(b'a', 0), &fingerprint(), LeaseToken::new(), HOUR),
            Ok(ClaimOutcome::Existing(_))
        ));
        store_in(&records, &scoped_id(b'b', 0));
        check_accounting(&records);
    }

    /// The accounting the bound and the limits rest on, recomputed from the table.
    fn check_accounting(records: &Records) {
        let (mut in_flight, mut bytes, mut completed) = (0, 0, 0);
        for index in 0..SHARDS {
            let shard = records.lock(index);
            let mut in_shard = 0;
            for (id, entry) in shard.table.iter() {
                match entry {
                    Entry::InFlight(_) => in_flight += 1,
                    Entry::Completed(record) => {
                        in_shard += 1;
                        bytes += weight(id.len(), &record.encoded);
                        // Every record can still be found by the eviction order.
                        assert!(
                            shard
                                .recency
                                .iter()
                                .any(|u| u.hash == hash_of(id) && u.stamp == record.stamp),
                            "a record missing from its shard's recency queue"
                        );
                    }
                }
            }
            assert_eq!(shard.completed, in_shard, "shard {index}'s completed count");
            // The published oldest use is never later than the shard's true least recent use
            // (else eviction would pass over its records), and says empty only when it is.
            let published = records.oldest[index].load(Ordering::Relaxed);
            let truth = shard
                .recency
                .iter()
                .filter(|u| Shard::is_current(&shard.table, u))
                .map(|u| u.at)
                .min();
            if let Some(truth) = truth {
                assert!(
                    published <= truth,
                    "shard {index} published {published}, oldest {truth}"
                );
            }
            assert_eq!(
                published == EMPTY,
                shard.recency.is_empty(),
                "shard {index}'s emptiness"
            );
            completed += in_shard;
        }
        if records.shares.limit() != u64::MAX {
            let mut per_scope = std::collections::HashMap::new();
            for index in 0..SHARDS {
                for (id, entry) in records.lock(index).table.iter() {
                    if let Entry::Completed(record) = entry {
                        *per_scope
                            .entry(crate::id::scope_of(id).to_vec())
                            .or_insert(0) += weight(id.len(), &record.encoded);
                    }
                }
            }
            assert_eq!(records.shares.all(), per_scope, "each scope's weight");
        }
        assert_eq!(records.in_flight(), in_flight, "in-flight count");
        assert_eq!(records.bytes(), bytes, "bytes counted");
        assert_eq!(records.completed(), completed);
    }

    #[derive(Clone, Debug)]
    enum Op {
        Claim { id: u8, lease_ms: u8 },
        Complete { id: u8, retention_ms: u8 },
        Extend { id: u8 },
        Release { id: u8 },
        Get { id: u8 },
        Purge { limit: u8 },
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        // Leases and retentions of 0 or 1 ms expire during a run; 255 ms ones do not.
        let time = prop_oneof![Just(0u8), Just(1u8), Just(255u8)];
        prop_oneof![
            (0..12u8, time.clone()).prop_map(|(id, lease_ms)| Op::Claim { id, lease_ms }),
            (0..12u8, time).prop_map(|(id, retention_ms)| Op::Complete { id, retention_ms }),
            (0..12u8).prop_map(|id| Op::Extend { id }),
            (0..12u8).prop_map(|id| Op::Release { id }),
            (0..12u8).prop_map(|id| Op::Get { id }),
            (0..4u8).prop_map(|limit| Op::Purge { limit }),
        ]
    }

    /// Ids spread over a few shards, several per shard, in two scopes (`a` and `b`), laid out
    /// as the store's ids are (hash, scope length, scope, key).
    fn spread_id(n: u8) -> Vec<u8> {
        let hash = (u64::from(n % 3) << SHARD_SHIFT) | u64::from(n);
        let mut id = hash.to_le_bytes().to_vec();
        id.extend_from_slice(&1u16.to_le_bytes());
        id.push(b'a' + n % 2);
        id.push(n);
        id
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

        /// Whatever the operations, the counts the bounds rest on match the table, and at the
        /// bound an evicting store holds no more than its bound.
        #[test]
        fn the_accounting_matches_the_table_after_any_operations(
            ops in proptest::collection::vec(op(), 1..60),
            refuse in proptest::bool::ANY,
            room in 1..6u64,
            share in proptest::option::of(1..4u64),
        ) {
            let when_full = if refuse { WhenFull::RefuseNewClaims } else { WhenFull::EvictLeastRecentlyUsed };
            let one = weight(spread_id(0).len(), &response().encode());
            let max_bytes = room * one;
            let share = share.map_or(u64::MAX, |n| n * one);
            let records = Records::new(max_bytes, 8, when_full, share);
            let mut tokens = std::collections::HashMap::new();
            for op in ops {
                match op {
                    Op::Claim { id, lease_ms } => {
                        let token = LeaseToken::new();
                        let lease = Duration::from_millis(u64::from(lease_ms));
                        let refused_scope = refuse && records.shares.is_full(&spread_id(id));
                        match records.claim(&spread_id(id), &fingerprint(), token, lease) {
                            Ok(ClaimOutcome::Claimed) => {
                                proptest::prop_assert!(!refused_scope, "a scope at its share took a new claim");
                                tokens.insert(id, token);
                            }
                            Err(StoreError::ScopeFull { .. }) => {
                                proptest::prop_assert!(refused_scope, "a scope under its share was refused");
                            }
                            _ => {}
                        }
                    }
                    Op::Complete { id, retention_ms } => {
                        let token = tokens.get(&id).copied().unwrap_or_else(LeaseToken::new);
                        let retention = Duration::from_millis(u64::from(retention_ms));
                        let _ = records.complete(&spread_id(id), token, &response(), retention);
                        if when_full == WhenFull::EvictLeastRecentlyUsed {
                            proptest::prop_assert!(records.bytes() <= max_bytes);
                        }
                    }
                    Op::Extend { id } => {
                        let token = tokens.get(&id).copied().unwrap_or_else(LeaseToken::new);
                        let _ = records.extend(&spread_id(id), token, Duration::from_millis(255));
                    }
                    Op::Release { id } => {
                        let token = tokens.get(&id).copied().unwrap_or_else(LeaseToken::new);
                        let _ = records.release(&spread_id(id), token);
                    }
                    Op::Get { id } => {
                        records.get(&spread_id(id)).unwrap();
                    }
                    Op::Purge { limit } => {
                        records.purge_expired(usize::from(limit));
                    }
                }
                check_accounting(&records);
                proptest::prop_assert!(records.in_flight() <= 8);
            }
        }
    }
}
