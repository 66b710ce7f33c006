//! Each scope's share of the memory bound: what its completed records weigh, so that one scope
//! (one authenticated user) cannot fill the store and have every other user's records evicted,
//! which would make their retries run again.
//!
//! At the bound, a completion whose scope holds more than its share evicts that scope's own
//! oldest records, not the store's least recently used ones: a user flooding the store with new
//! keys pushes out only its own records. Under
//! [`WhenFull::RefuseNewClaims`](crate::WhenFull::RefuseNewClaims), a scope at its share has its
//! new claims refused (`StoreError::ScopeFull`, 429 at the HTTP layer) instead of everyone's.
//! [`Scope::UNSCOPED`], the one key space of an app without users, has no share: it is the
//! whole store.
//!
//! Each scope keeps the hashes of its completed records in the order they were stored. Entries
//! whose record is gone are skipped when reached, and the oldest entries are dropped once they
//! outnumber the scope's records twice over (records expire oldest first, so those are the
//! stale ones; a live record dropped so is still evicted by the store's order).

use crate::id::scope_of;
use crate::sync::{Mutex, MutexGuard};
use idempotency_core::Scope;
use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasher;

const SHARDS: usize = 16;

/// One scope's completed records.
#[derive(Default)]
struct Held {
    bytes: u64,
    records: usize,
    /// The hashes of its records, oldest stored first (some gone since).
    order: VecDeque<u64>,
}

type Map = HashMap<Box<[u8]>, Held, foldhash::fast::FixedState>;

/// The weight of each scope's completed records, sharded by scope.
pub(crate) struct Shares {
    /// A scope's share; `u64::MAX` turns the accounting off.
    limit: u64,
    shards: Box<[Mutex<Map>]>,
    hasher: foldhash::fast::FixedState,
}

impl Shares {
    pub(crate) fn new(limit: u64) -> Self {
        Shares {
            limit,
            shards: (0..SHARDS)
                .map(|_| Mutex::new(HashMap::with_hasher(foldhash::fast::FixedState::default())))
                .collect(),
            hasher: foldhash::fast::FixedState::default(),
        }
    }

    /// The share of one scope.
    pub(crate) fn limit(&self) -> u64 {
        self.limit
    }

    fn enabled(&self) -> bool {
        self.limit != u64::MAX
    }

    fn shard(&self, scope: &[u8]) -> MutexGuard<'_, Map> {
        let index = (self.hasher.hash_one(scope) as usize) % SHARDS;
        // No code panics while holding it; recover the map if that ever changes.
        self.shards[index]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Counts the record of `id` (whose id carries `hash`), weighing `weight`, in its scope;
    /// whether the scope now holds more than its share (never the unscoped key space).
    pub(crate) fn charge(&self, id: &[u8], hash: u64, weight: u64) -> bool {
        if !self.enabled() {
            return false;
        }
        let scope = scope_of(id);
        let mut shard = self.shard(scope);
        let held = match shard.get_mut(scope) {
            Some(held) => held,
            None => shard.entry(Box::from(scope)).or_default(),
        };
        held.bytes += weight;
        held.records += 1;
        held.order.push_back(hash);
        let keep = 2 * held.records + 64;
        if held.order.len() > keep {
            let stale = held.order.len() - keep;
            held.order.drain(..stale);
        }
        held.bytes > self.limit && scope != Scope::UNSCOPED.as_bytes()
    }

    /// Takes the record of `id`, weighing `weight`, off its scope, forgetting a scope left
    /// with nothing.
    pub(crate) fn refund(&self, id: &[u8], weight: u64) {
        if !self.enabled() {
            return;
        }
        let scope = scope_of(id);
        let mut shard = self.shard(scope);
        if let Some(held) = shard.get_mut(scope) {
            held.bytes = held.bytes.saturating_sub(weight);
            held.records = held.records.saturating_sub(1);
            if held.records == 0 {
                shard.remove(scope);
            }
        }
    }

    /// Whether the scope of `id` holds more than its share, or `at_least` its share (never
    /// the unscoped key space).
    fn holds(&self, id: &[u8], at_least: bool) -> bool {
        if !self.enabled() {
            return false;
        }
        let scope = scope_of(id);
        if scope == Scope::UNSCOPED.as_bytes() {
            return false;
        }
        self.shard(scope)
            .get(scope)
            .is_some_and(|held| held.bytes > self.limit || (at_least && held.bytes == self.limit))
    }

    /// Whether the scope of `id` holds its share or more: under `RefuseNewClaims`, its new
    /// claims are refused.
    pub(crate) fn is_full(&self, id: &[u8]) -> bool {
        self.holds(id, true)
    }

    /// Whether the scope of `id` holds more than its share: at the bound, its completions
    /// evict its own records.
    pub(crate) fn is_over(&self, id: &[u8]) -> bool {
        self.holds(id, false)
    }

    /// Takes the hash of the oldest stored record of the scope of `id` off its order (the
    /// record may be gone since).
    pub(crate) fn oldest(&self, id: &[u8]) -> Option<u64> {
        let scope = scope_of(id);
        self.shard(scope).get_mut(scope)?.order.pop_front()
    }

    /// Every scope and what its records weigh.
    #[cfg(test)]
    pub(crate) fn all(&self) -> HashMap<Vec<u8>, u64> {
        let mut all = HashMap::new();
        for shard in self.shards.iter() {
            let shard = shard.lock().unwrap_or_else(|p| p.into_inner());
            all.extend(shard.iter().map(|(k, held)| (k.to_vec(), held.bytes)));
        }
        all
    }
}
