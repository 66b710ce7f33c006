//! Claiming a key: one lookup under its shard's lock, with the bounds a claim is refused at.

use super::shard::{Claim, Entry, Shard, record_of, weight};
use super::{Attempt, Records, shard_index};
use crate::id::hash_of;
use crate::sync::Ordering;
use idempotency_core::store::ClaimOutcome;
use idempotency_core::{Fingerprint, LeaseToken, StoreError};
use std::time::{Duration, Instant};

impl Records {
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
}
