//! The claims of running requests: a sharded hash table that is never evicted, bounded by a
//! count. Each operation reads the hash its record id carries, locks one shard, and touches one
//! slot.

use crate::id::{RecordId, hash_of};
use hashbrown::HashTable;
use idempotency_core::{Fingerprint, LeaseToken};
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

const SHARDS: usize = 64;

/// A running request's claim.
#[derive(Debug)]
pub(crate) struct Claim {
    pub(crate) fingerprint: Fingerprint,
    pub(crate) token: LeaseToken,
    pub(crate) lease_until: Instant,
}

/// One shard: the claims whose ids hash to it.
pub(crate) type Shard = HashTable<(RecordId, Claim)>;

/// The sharded table.
pub(crate) struct Claims {
    shards: Box<[Mutex<Shard>]>,
}

/// A shard, locked, and the hash of the id it was locked for.
pub(crate) struct Locked<'a> {
    pub(crate) shard: MutexGuard<'a, Shard>,
    hash: u64,
}

impl Claims {
    pub(crate) fn new() -> Self {
        Claims {
            shards: (0..SHARDS).map(|_| Mutex::new(HashTable::new())).collect(),
        }
    }

    /// Locks the shard of `id`.
    pub(crate) fn lock(&self, id: &[u8]) -> Locked<'_> {
        let hash = hash_of(id);
        // The top bits pick the shard; hashbrown uses the low ones (and the top 7 as tags, which
        // stay spread within a shard because the hash is 64 bits wide).
        let index = (hash >> 58) as usize % SHARDS;
        // No code panics while holding a shard lock; recover the table if that ever changes.
        let shard = self.shards[index]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        Locked { shard, hash }
    }

    /// Every shard in turn, locked (for purging).
    pub(crate) fn each_shard(&self, mut f: impl FnMut(&mut Shard)) {
        for shard in self.shards.iter() {
            f(&mut shard.lock().unwrap_or_else(|p| p.into_inner()));
        }
    }
}

impl Locked<'_> {
    pub(crate) fn get(&self, id: &[u8]) -> Option<&Claim> {
        self.shard
            .find(self.hash, |(k, _)| **k == *id)
            .map(|(_, claim)| claim)
    }

    pub(crate) fn get_mut(&mut self, id: &[u8]) -> Option<&mut Claim> {
        self.shard
            .find_mut(self.hash, |(k, _)| **k == *id)
            .map(|(_, claim)| claim)
    }

    /// Removes the claim of `id` and gives back its kept id with it.
    pub(crate) fn remove(&mut self, id: &[u8]) -> Option<(RecordId, Claim)> {
        match self.shard.find_entry(self.hash, |(k, _)| **k == *id) {
            Ok(entry) => Some(entry.remove().0),
            Err(_) => None,
        }
    }

    /// Inserts a claim for an id that has none.
    pub(crate) fn insert(&mut self, id: RecordId, claim: Claim) {
        self.shard
            .insert_unique(self.hash, (id, claim), |(k, _)| hash_of(k));
    }
}
