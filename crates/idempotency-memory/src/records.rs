//! The memory store's records: one sharded hash table holds the claims of running requests and
//! the completed records alike, so a claim is one lookup under one lock, and a completion turns
//! the claim's slot into the record in place.
//!
//! Completed records are bounded by the memory they take. Each shard keeps its completed records
//! in the order they were last used (a queue of `(hash, stamp)` pairs; using a record again
//! pushes it anew and leaves its old pair behind, skipped when reached and compacted away).
//! At the bound, the least recently used record of one shard after another is evicted.
//!
//! This replaced a moka cache for the completed records: at the bound, moka's per-entry
//! bookkeeping (its write log, access-order and timer-wheel nodes, the garbage collection of its
//! lock-free table) cost about 10 µs of CPU per fresh key, more than the layer and the engine
//! together; see `docs/benchmarks.md`.

use crate::BACKEND;
use crate::id::{RecordId, hash_of};
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

/// What one completed record costs beyond its id and encoded response, in bytes: its slot in
/// the table (with the table's spare capacity), its places in the recency queue, and the
/// allocator's headers on the id and the response. Measured on x86-64 Linux with glibc by
/// `tests/memory_bound.rs` (resident memory of a full store over the bytes counted).
pub(crate) const COMPLETED_OVERHEAD: usize = 350;

/// What happens when the completed records reach the bound.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum WhenFull {
    /// Evict the least recently used completed records to make room (the default). The order
    /// is approximate: one shard's least recently used record at a time, shard after shard, so
    /// it is close to the whole store's in a store of many records per shard (a 64 MiB store
    /// of small responses holds ~1,500 per shard), and in a store of only a few dozen records
    /// it is any shard's oldest, not the store's; a completion never evicts the record it
    /// stored. A retry of an evicted key runs its request again; evictions
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
    /// Completed records from least to most recently used, as `(hash, stamp)`; a pair whose
    /// record is gone or was used again since (its stamp differs) is stale.
    recency: VecDeque<(u64, u64)>,
    next_stamp: u64,
    /// Completed records in `table`.
    completed: usize,
}

impl Shard {
    /// A new stamp for a record of `hash` that was just used, queued as the most recent.
    fn used(recency: &mut VecDeque<(u64, u64)>, next_stamp: &mut u64, hash: u64) -> u64 {
        let stamp = *next_stamp;
        *next_stamp += 1;
        recency.push_back((hash, stamp));
        stamp
    }

    /// Drops stale pairs once they outnumber the records, so the queue stays within about
    /// twice the completed records (amortized: each pass halves it at least).
    fn compact(&mut self) {
        if self.recency.len() <= 2 * self.completed + 64 {
            return;
        }
        let table = &self.table;
        self.recency.retain(|&(hash, stamp)| {
            table
                .find(
                    hash,
                    |(_, e)| matches!(e, Entry::Completed(c) if c.stamp == stamp),
                )
                .is_some()
        });
    }

    /// Removes the least recently used completed record, unless it is the one stamped `keep`;
    /// its weight, if there was one to remove.
    fn evict_least_recently_used(&mut self, keep: Option<u64>) -> Option<u64> {
        while let Some(&(hash, stamp)) = self.recency.front() {
            if keep == Some(stamp) {
                // Every pair before it was stale: the kept record is the shard's only one.
                return None;
            }
            self.recency.pop_front();
            let found = self.table.find_entry(
                hash,
                |(_, e)| matches!(e, Entry::Completed(c) if c.stamp == stamp),
            );
            if let Ok(slot) = found {
                let ((id, entry), _) = slot.remove();
                self.completed -= 1;
                if let Entry::Completed(record) = entry {
                    return Some(weight(id.len(), &record.encoded));
                }
            }
        }
        None
    }

    /// Removes up to `budget` records that are no longer live: returns the claims and the
    /// completed records removed, and the completed records' weight.
    fn sweep(&mut self, now: Instant, mut budget: usize) -> (usize, usize, u64) {
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
                    bytes += weight(id.len(), &record.encoded);
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
    evicted: AtomicU64,
    /// The next shard to evict from.
    cursor: AtomicUsize,
    /// When the table was built: the origin of `last_sweep`.
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
    pub(crate) fn new(max_bytes: u64, max_in_flight: usize, when_full: WhenFull) -> Self {
        Records {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            in_flight: AtomicUsize::new(0),
            max_in_flight,
            bytes: AtomicU64::new(0),
            max_bytes,
            when_full,
            evicted: AtomicU64::new(0),
            cursor: AtomicUsize::new(0),
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
        let now = self.epoch.elapsed().as_millis() as u64;
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
                    record.stamp = Shard::used(&mut shard.recency, &mut shard.next_stamp, hash);
                }
                let record = record_of(entry, now).map(ClaimOutcome::Existing);
                shard.compact();
                return Attempt::Done(record);
            }
            // A lapsed claim or an expired record: the new claim takes its slot.
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
                }
            }
            return Attempt::Done(Ok(ClaimOutcome::Claimed));
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
        let stamp = Shard::used(&mut shard.recency, &mut shard.next_stamp, hash);
        *entry = Entry::Completed(Completed {
            fingerprint,
            encoded,
            expires_at: now + retention,
            stamp,
        });
        shard.completed += 1;
        shard.compact();
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.bytes.fetch_add(added, Ordering::Relaxed);
        drop(guard);
        if self.when_full == WhenFull::EvictLeastRecentlyUsed {
            self.evict_to_bound((shard_index(hash), stamp));
        }
        FenceOutcome::Applied
    }

    /// Evicts least recently used records, shard after shard, until the bound holds; never
    /// `just_stored` (its shard and stamp), the record the calling completion stored: in a
    /// store of few records its shard may hold nothing older, and evicting it would make the
    /// retry that may follow at once run again. (A record heavier than the whole bound so
    /// stays until the next completion.)
    fn evict_to_bound(&self, just_stored: (usize, u64)) {
        let mut empty_shards = 0;
        while self.bytes() > self.max_bytes && empty_shards < SHARDS {
            let index = self.cursor.fetch_add(1, Ordering::Relaxed) % SHARDS;
            let keep = (index == just_stored.0).then_some(just_stored.1);
            let freed = self.lock(index).evict_least_recently_used(keep);
            match freed {
                Some(freed) => {
                    empty_shards = 0;
                    self.bytes.fetch_sub(freed, Ordering::Relaxed);
                    self.evicted.fetch_add(1, Ordering::Relaxed);
                    metrics::counter!("idempotency_memory_evictions_total").increment(1);
                }
                None => empty_shards += 1,
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
                record.stamp = Shard::used(&mut shard.recency, &mut shard.next_stamp, hash);
            }
            let record = record_of(entry, now)?;
            shard.compact();
            return Ok(Some(record));
        }
        let ((id, entry), _) = slot.remove();
        match entry {
            Entry::InFlight(_) => {
                self.in_flight.fetch_sub(1, Ordering::Relaxed);
            }
            Entry::Completed(record) => {
                shard.completed -= 1;
                self.bytes
                    .fetch_sub(weight(id.len(), &record.encoded), Ordering::Relaxed);
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
            let (claims, completed, bytes) = self.lock(index).sweep(now, limit - purged);
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
        let records = Records::new(3 * weight_of_one(), 100, WhenFull::EvictLeastRecentlyUsed);
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
        let records = Records::new(one + one / 2, 100, WhenFull::EvictLeastRecentlyUsed);
        // An older record in shard 1, then a new one in shard 0, where the eviction cursor
        // starts and which holds nothing older than the new record.
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

    #[test]
    fn a_replayed_record_does_not_grow_the_recency_queue_without_bound() {
        let records = Records::new(1 << 20, 100, WhenFull::EvictLeastRecentlyUsed);
        store(&records, 1);
        for _ in 0..10_000 {
            assert!(records.get(&id(1)).unwrap().is_some());
        }
        let queued = records.lock(0).recency.len();
        assert!(queued <= 2 + 64 + 1, "{queued} pairs queued for one record");
        // The record's own pair survived compaction: it is still evictable.
        assert_eq!(
            records.lock(0).evict_least_recently_used(None),
            Some(weight_of_one())
        );
    }

    #[test]
    fn a_claim_over_an_expired_record_takes_its_slot_and_frees_its_bytes() {
        let records = Records::new(1 << 20, 100, WhenFull::EvictLeastRecentlyUsed);
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
        assert_eq!(records.lock(0).evict_least_recently_used(None), None);
    }

    #[test]
    fn a_store_refusing_claims_sweeps_expired_records_and_takes_claims_again() {
        let records = Records::new(2 * weight_of_one(), 100, WhenFull::RefuseNewClaims);
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
                                .any(|&(h, s)| h == hash_of(id) && s == record.stamp),
                            "a record missing from its shard's recency queue"
                        );
                    }
                }
            }
            assert_eq!(shard.completed, in_shard, "shard {index}'s completed count");
            completed += in_shard;
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

    /// Ids spread over a few shards, several per shard.
    fn spread_id(n: u8) -> Vec<u8> {
        let hash = (u64::from(n % 3) << SHARD_SHIFT) | u64::from(n);
        let mut id = hash.to_le_bytes().to_vec();
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
        ) {
            let when_full = if refuse { WhenFull::RefuseNewClaims } else { WhenFull::EvictLeastRecentlyUsed };
            let max_bytes = room * weight(spread_id(0).len(), &response().encode());
            let records = Records::new(max_bytes, 8, when_full);
            let mut tokens = std::collections::HashMap::new();
            for op in ops {
                match op {
                    Op::Claim { id, lease_ms } => {
                        let token = LeaseToken::new();
                        let lease = Duration::from_millis(u64::from(lease_ms));
                        if let Ok(ClaimOutcome::Claimed) = records.claim(&spread_id(id), &fingerprint(), token, lease) {
                            tokens.insert(id, token);
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
