//! One shard of the table: its claims and completed records, the order its completed records
//! were last used in, and what needs only the shard's lock (eviction of its least recently used
//! record, the sweep of expired records).

use super::{COMPLETED_OVERHEAD, EMPTY};
use crate::BACKEND;
use crate::id::RecordId;
use crate::shares::Shares;
use bytes::Bytes;
use hashbrown::HashTable;
use idempotency_core::store::{Record, RecordState};
use idempotency_core::{Fingerprint, LeaseToken, StoreError, StoredResponse};
use std::collections::VecDeque;
use std::time::Instant;

/// A running request's claim.
#[derive(Debug)]
pub(super) struct Claim {
    pub(super) fingerprint: Fingerprint,
    pub(super) token: LeaseToken,
    pub(super) lease_until: Instant,
}

/// A completed record.
#[derive(Debug)]
pub(super) struct Completed {
    pub(super) fingerprint: Fingerprint,
    /// The response in the stores' one encoding: compact, and its size is what it costs.
    pub(super) encoded: Bytes,
    pub(super) expires_at: Instant,
    /// Its latest place in the shard's recency queue.
    pub(super) stamp: u64,
}

/// A use of a completed record, in its shard's recency queue: the record's hash, the stamp it
/// was given (a use whose record is gone or was used again since, so carries another stamp, is
/// stale), and when it happened (milliseconds after the store's epoch).
#[derive(Clone, Copy, Debug)]
pub(super) struct Use {
    pub(super) hash: u64,
    pub(super) stamp: u64,
    pub(super) at: u64,
}

/// What [`Shard::evict_least_recently_used`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Eviction {
    /// Evicted a record of this weight.
    Freed(u64),
    /// Nothing to evict: no completed record, or only the one the caller keeps.
    Nothing,
    /// The shard's least recently used record was used after the given time: another shard
    /// holds an older one.
    Newer,
    /// The bound already holds (another completion evicted meanwhile): nothing was evicted.
    Enough,
}

#[derive(Debug)]
pub(super) enum Entry {
    InFlight(Claim),
    Completed(Completed),
}

/// Bytes a completed record under an id of `id_len` bytes takes.
pub(super) fn weight(id_len: usize, encoded: &Bytes) -> u64 {
    (id_len + encoded.len() + COMPLETED_OVERHEAD) as u64
}

/// The record a live entry answers with.
pub(super) fn record_of(entry: &Entry, now: Instant) -> Result<Record, StoreError> {
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
    pub(super) fn is_live(&self, now: Instant) -> bool {
        match self {
            Entry::InFlight(claim) => claim.lease_until > now,
            Entry::Completed(record) => record.expires_at > now,
        }
    }
}

/// One shard: the records whose ids hash to it.
#[derive(Default)]
pub(super) struct Shard {
    pub(super) table: HashTable<(RecordId, Entry)>,
    /// Uses of completed records from least to most recent; a stale one is skipped.
    pub(super) recency: VecDeque<Use>,
    pub(super) next_stamp: u64,
    /// Completed records in `table`.
    pub(super) completed: usize,
}

impl Shard {
    /// A new stamp for a record of `hash` used at `at`, queued as the most recent use.
    pub(super) fn used(
        recency: &mut VecDeque<Use>,
        next_stamp: &mut u64,
        hash: u64,
        at: u64,
    ) -> u64 {
        let stamp = *next_stamp;
        *next_stamp += 1;
        recency.push_back(Use { hash, stamp, at });
        stamp
    }

    /// Whether `used` is the latest use of a record still in the table.
    pub(super) fn is_current(table: &HashTable<(RecordId, Entry)>, used: &Use) -> bool {
        table
            .find(
                used.hash,
                |(_, e)| matches!(e, Entry::Completed(c) if c.stamp == used.stamp),
            )
            .is_some()
    }

    /// Drops stale uses once they outnumber the records, so the queue stays within about
    /// twice the completed records (amortized: each pass halves it at least).
    pub(super) fn compact(&mut self) {
        if self.recency.len() <= 2 * self.completed + 64 {
            return;
        }
        let table = &self.table;
        self.recency.retain(|used| Self::is_current(table, used));
    }

    /// When this shard's least recently used record was last used, as far as its queue says
    /// without looking at the records: never later than the truth (the front use may be stale,
    /// its record used again since), [`EMPTY`] when the queue is.
    pub(super) fn oldest_use(&self) -> u64 {
        self.recency.front().map_or(EMPTY, |used| used.at)
    }

    /// Removes the least recently used completed record, unless it is the one stamped `keep`
    /// or it was used after `not_after` (another shard holds an older one).
    pub(super) fn evict_least_recently_used(
        &mut self,
        keep: Option<u64>,
        not_after: u64,
        shares: &Shares,
        reserve: impl FnOnce(u64) -> bool,
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
            let (id, entry) = slot.get();
            let Entry::Completed(record) = entry else {
                unreachable!("the slot was found as a completed record")
            };
            let freed = weight(id.len(), &record.encoded);
            if !reserve(freed) {
                // Another completion's eviction made the room meanwhile.
                return Eviction::Enough;
            }
            self.recency.pop_front();
            let ((id, _), _) = slot.remove();
            self.completed -= 1;
            shares.refund(&id, freed);
            return Eviction::Freed(freed);
        }
        Eviction::Nothing
    }

    /// Removes up to `budget` records that are no longer live: returns the claims and the
    /// completed records removed, and the completed records' weight.
    pub(super) fn sweep(
        &mut self,
        now: Instant,
        mut budget: usize,
        shares: &Shares,
    ) -> (usize, usize, u64) {
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
