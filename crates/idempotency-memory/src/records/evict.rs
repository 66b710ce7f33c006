//! Eviction at the bound: a scope over its share evicts its own oldest records first, then the
//! store its least recently used ones, across shards without a store-wide lock.

use super::shard::{Entry, Eviction, weight};
use super::{EMPTY, Records, SHARDS, shard_index};
use crate::sync::Ordering;

impl Records {
    /// At the bound, evicts the oldest stored records of the scope of `id` while it holds more
    /// than its share (never `just_stored`, the record the calling completion stored): a scope
    /// over its share makes room from its own records, not other scopes'.
    pub(super) fn evict_own_records(&self, id: &[u8], just_stored: (usize, u64)) {
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
            let freed = match slot.get() {
                (gone, Entry::Completed(record)) => weight(gone.len(), &record.encoded),
                (_, Entry::InFlight(_)) => continue,
            };
            if !self.reserve_eviction(freed) {
                return; // another completion's eviction made the room meanwhile
            }
            let ((gone, _), _) = slot.remove();
            shard.completed -= 1;
            self.shares.refund(&gone, freed);
            self.evicted.fetch_add(1, Ordering::Relaxed);
            metrics::counter!("idempotency_memory_evictions_total").increment(1);
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
    pub(super) fn evict_to_bound(&self, just_stored: (usize, u64)) {
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
                let eviction =
                    shard.evict_least_recently_used(keep, not_after, &self.shares, |freed| {
                        self.reserve_eviction(freed)
                    });
                self.publish(index, &shard);
                eviction
            };
            match eviction {
                // Its weight was taken off the count by `reserve_eviction`.
                Eviction::Freed(_) => {
                    self.evicted.fetch_add(1, Ordering::Relaxed);
                    metrics::counter!("idempotency_memory_evictions_total").increment(1);
                }
                Eviction::Newer => made_again += 1,
                Eviction::Nothing => passed[index] = true,
                Eviction::Enough => return,
            }
        }
    }
}
