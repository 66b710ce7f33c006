//! What a store author needs, in one place: the [`IdempotencyStore`] trait every backend
//! implements, the values its methods take (scope, key, fingerprint, token, response, error),
//! the records and outcomes its primitives exchange, loss reporting, and the transactional side
//! a database store may offer. `use idempotency_core::store::*;` is the one import a store needs. An application needs none of it but
//! `IdempotencyStore` (as `Arc<dyn IdempotencyStore>`) and [`purge_periodically`], which the crate
//! root re-exports; `docs/writing-a-store.md` walks through implementing a store.

/// The values the trait's methods take and return, also at the crate root: a store needs no
/// other path than this module.
pub use crate::{
    DecodeError, FINGERPRINT_LEN, Fingerprint, FingerprintAlgorithm, FingerprintError,
    IdempotencyKey, LeaseToken, Scope, StoreError, StoredResponse,
};

pub use crate::error::CorruptRecord;
pub use crate::record::{ClaimOutcome, FenceOutcome, Record, RecordState};
pub use crate::state_loss::StateLoss;
pub use crate::transaction::{
    CommitOutcome, DiscardOutcome, LookupAnswered, LookupSignal, OneTransactionBegin, Settled,
    StoreTransaction, TransactionalStore,
};

mod purge;
mod settled_keys;

pub use purge::purge_periodically;
pub use settled_keys::{
    MOST_WATCHES_KEPT, OnSettled, SettleListener, SettledKeys, WATCH_KEPT_FOR, WATCH_PREFIX,
    parse_wake_id, wake_id,
};

use std::sync::Arc;
use std::time::Duration;

/// A call a store answers, as it is named in metrics (the `op` label of
/// `idempotency_store_duration_seconds` and `idempotency_store_errors_total`), in logs, and by
/// the conformance crate's fault injection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StoreOp {
    /// [`IdempotencyStore::claim`]
    Claim,
    /// [`IdempotencyStore::complete`]
    Complete,
    /// [`IdempotencyStore::extend`]
    Extend,
    /// [`IdempotencyStore::release`]
    Release,
    /// [`IdempotencyStore::get`], and
    /// [`TransactionalStore::held_by_transaction`]: the reads of a key (the second only for
    /// [`Engine::status`](crate::Engine::status) in the one-transaction modes).
    Get,
    /// [`IdempotencyStore::purge_expired`]
    Purge,
    /// Opening a request's transaction: [`TransactionalStore::begin_transaction`] (lease mode)
    /// or [`TransactionalStore::begin_one_transaction`] (one-transaction mode).
    BeginTransaction,
    /// [`StoreTransaction::settle`]: waiting for the key's lookup of a speculative transaction
    /// (its [`BeginTransaction`](StoreOp::BeginTransaction) only queued it).
    Settle,
    /// [`StoreTransaction::complete_and_commit`]: the response stored in the request's
    /// transaction, and the transaction committed.
    Commit,
    /// [`StoreTransaction::rollback`]
    Rollback,
    /// [`IdempotencyStore::watch_settle`]: a waiting duplicate asks to hear of its key's settle.
    Watch,
}

impl StoreOp {
    /// Every call, in the order of their discriminants (`op as usize` indexes it).
    pub const ALL: [StoreOp; 11] = [
        StoreOp::Claim,
        StoreOp::Complete,
        StoreOp::Extend,
        StoreOp::Release,
        StoreOp::Get,
        StoreOp::Purge,
        StoreOp::BeginTransaction,
        StoreOp::Settle,
        StoreOp::Commit,
        StoreOp::Rollback,
        StoreOp::Watch,
    ];

    /// The name in metrics and logs: `claim`, `complete`, `extend`, `release`, `get`, `purge`,
    /// `begin_transaction`, `settle`, `commit`, `rollback`, `watch`.
    pub fn name(self) -> &'static str {
        match self {
            StoreOp::Claim => "claim",
            StoreOp::Complete => "complete",
            StoreOp::Extend => "extend",
            StoreOp::Release => "release",
            StoreOp::Get => "get",
            StoreOp::Purge => "purge",
            StoreOp::BeginTransaction => "begin_transaction",
            StoreOp::Settle => "settle",
            StoreOp::Commit => "commit",
            StoreOp::Rollback => "rollback",
            StoreOp::Watch => "watch",
        }
    }

    /// Whether this is one of the six primitives of [`IdempotencyStore`] (not a step of a
    /// request's transaction, nor the optional watch of a waiting duplicate).
    pub fn is_primitive(self) -> bool {
        !matches!(
            self,
            StoreOp::BeginTransaction
                | StoreOp::Settle
                | StoreOp::Commit
                | StoreOp::Rollback
                | StoreOp::Watch
        )
    }
}

/// Atomic primitives over records addressed by `(scope, key)`.
///
/// Stores do these primitives and nothing else; the protocol (what a mismatch means, when to
/// replay, which statuses to keep, waiting) lives once in [`Engine`](crate::Engine). Every store
/// keeps the invariants the conformance suite (`idempotency-conformance`) proves against it:
///
/// 1. of N concurrent claims of one `(scope, key)`, exactly one gets [`ClaimOutcome::Claimed`];
/// 2. records of different scopes never see each other;
/// 3. a completed record returns exactly the stored status, headers and body bytes;
/// 4. a claim never overwrites a live record, whatever its fingerprint;
/// 5. expired records (completed past their retention, in-flight past their lease) read as
///    absent, purged or not, by the store's own clock;
/// 6. `complete`, `extend` and `release` apply only while the token holds the in-flight claim;
/// 7. a released key can be claimed again at once;
/// 8. a failure is an `Err`, never an absent record.
///
/// The trait is object safe: `Arc<dyn IdempotencyStore>` implements it too.
#[async_trait::async_trait]
pub trait IdempotencyStore: Send + Sync {
    /// A short name for logs and metrics (`"postgres"`, `"redis"`, `"memory"`).
    fn backend(&self) -> &'static str;

    /// Atomically: if `(scope, key)` has no live record, inserts an in-flight record with
    /// `fingerprint`, owned by `token`, whose lease runs out after `lease`, and returns
    /// [`ClaimOutcome::Claimed`]; otherwise returns the live record unchanged.
    async fn claim(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        token: LeaseToken,
        lease: Duration,
    ) -> Result<ClaimOutcome, StoreError>;

    /// If `token` holds the in-flight claim on `(scope, key)`, stores `response` and keeps the
    /// record for `retention`; otherwise changes nothing and returns [`FenceOutcome::Stale`].
    async fn complete(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        token: LeaseToken,
        response: &StoredResponse,
        retention: Duration,
    ) -> Result<FenceOutcome, StoreError>;

    /// If `token` holds the in-flight claim on `(scope, key)` and its lease has not run out,
    /// moves the end of the lease to `lease` from now; otherwise changes nothing and returns
    /// [`FenceOutcome::Stale`]. The engine calls it while a handler runs (the heartbeat), so
    /// only the claim of a worker that stopped can lapse and be taken over.
    async fn extend(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        token: LeaseToken,
        lease: Duration,
    ) -> Result<FenceOutcome, StoreError>;

    /// If `token` holds the in-flight claim on `(scope, key)`, deletes the record so the key
    /// can be claimed again at once; otherwise changes nothing and returns
    /// [`FenceOutcome::Stale`].
    async fn release(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        token: LeaseToken,
    ) -> Result<FenceOutcome, StoreError>;

    /// Reads the live record of `(scope, key)`; expired records read as `None`.
    async fn get(&self, scope: &Scope, key: &IdempotencyKey) -> Result<Option<Record>, StoreError>;

    /// Deletes up to `limit` expired records and returns how many were deleted. Stores whose
    /// server expires records by itself (Redis) return 0. Only reclaims space: expired records
    /// are already absent on read.
    async fn purge_expired(&self, limit: usize) -> Result<u64, StoreError>;

    /// The store's transactional side, when its records live in a transactional database the
    /// application's writes can share (PostgreSQL): then a handler's writes and its stored
    /// response commit in one transaction (see [`TransactionalStore`]). `None` by default.
    fn transactional(&self) -> Option<&dyn TransactionalStore> {
        None
    }

    /// How many times this store has found its records lost (its [`StateLoss`]
    /// count: an UNLOGGED table emptied by a crash, Redis restarted without persistence or
    /// flushed). A cache in front of the store (the replay tier) drops what it copied before
    /// the count moved. 0 by default, for a store that cannot lose records without losing
    /// the process.
    fn state_losses(&self) -> u64 {
        0
    }

    /// Checks now whether the store lost its records since the last check (its sentinel is
    /// gone), counting a loss in [`state_losses`](IdempotencyStore::state_losses) and restoring
    /// the sentinel: `Ok(true)` when a loss was found, `Ok(false)` when nothing was lost. One
    /// round trip on PostgreSQL and Redis; `Ok(false)` by default, for a store that cannot lose
    /// its records without losing the process.
    async fn check_state(&self) -> Result<bool, StoreError> {
        Ok(false)
    }

    /// What the store holds, for the gauges an operator watches
    /// ([`monitoring::record_footprint`](crate::monitoring::record_footprint)): read cheaply,
    /// so a scrape may ask it every few seconds (PostgreSQL answers from its catalog, an
    /// estimate, without reading the table). `Ok(None)` by default: the store cannot tell
    /// without counting.
    async fn footprint(&self) -> Result<Option<Footprint>, StoreError> {
        Ok(None)
    }

    /// What the store's connection pool holds right now, read from memory (no round trip), for
    /// the gauges an operator watches ([`monitoring::record_pool`](crate::monitoring::record_pool)):
    /// a pool whose every connection is in use, with requests waiting, reads differently from
    /// a store that does not answer. `None` by default: the store has no pool.
    fn pool_status(&self) -> Option<PoolStatus> {
        None
    }

    /// The keys other processes settle, as this store hears of them ([`SettledKeys`]), so that
    /// an engine wakes its waiting duplicates at once rather than at their next poll. `None` by
    /// default: a store that cannot hear of them (the memory store, which has no other
    /// process); duplicates then learn of another process's settle by polling.
    fn settled_keys(&self) -> Option<&SettledKeys> {
        None
    }

    /// A duplicate of the request running `(scope, key)` waits on this process: the store makes
    /// sure it hears of settles ([`settled_keys`](IdempotencyStore::settled_keys)), then marks
    /// the key's running record as waited for, so that the request that settles it (by
    /// [`complete`](IdempotencyStore::complete) or [`release`](IdempotencyStore::release))
    /// sends the key's [`wake_id`] when the settle commits. A record that is no longer running
    /// is left as it is (the duplicate's next look finds it). One round trip (the first time,
    /// also opening the session that listens). An error costs only the wake: the duplicate
    /// polls. `Ok(())` by default.
    async fn watch_settle(&self, scope: &Scope, key: &IdempotencyKey) -> Result<(), StoreError> {
        let _ = (scope, key);
        Ok(())
    }
}

/// What a store's connection pool holds ([`IdempotencyStore::pool_status`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PoolStatus {
    /// The most connections the pool opens.
    pub max: usize,
    /// Connections open now.
    pub open: usize,
    /// Open connections no request holds.
    pub idle: usize,
    /// Calls waiting for a connection, where the pool tells.
    pub waiting: Option<usize>,
}

impl PoolStatus {
    /// A pool of at most `max` connections, `open` of them open and `idle` of those free, with
    /// `waiting` calls waiting for one.
    pub fn new(max: usize, open: usize, idle: usize, waiting: Option<usize>) -> Self {
        PoolStatus {
            max,
            open,
            idle,
            waiting,
        }
    }
}

/// What a store holds ([`IdempotencyStore::footprint`]); a figure the store cannot tell
/// cheaply is `None`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Footprint {
    /// Records (in flight, completed, expired not yet purged); an estimate where counting
    /// would read them all.
    pub records: Option<u64>,
    /// Bytes the records take (on PostgreSQL the table with its index and TOAST; in memory the
    /// weight the store counts against its capacity).
    pub bytes: Option<u64>,
}

impl Footprint {
    /// A footprint of `records` records taking `bytes` bytes.
    pub fn new(records: Option<u64>, bytes: Option<u64>) -> Self {
        Footprint { records, bytes }
    }
}

macro_rules! forward_store {
    ($($ptr:ident),*) => {$(
        #[async_trait::async_trait]
        impl<T: IdempotencyStore + ?Sized> IdempotencyStore for $ptr<T> {
            fn backend(&self) -> &'static str {
                (**self).backend()
            }
            async fn claim(
                &self,
                scope: &Scope,
                key: &IdempotencyKey,
                fingerprint: &Fingerprint,
                token: LeaseToken,
                lease: Duration,
            ) -> Result<ClaimOutcome, StoreError> {
                (**self).claim(scope, key, fingerprint, token, lease).await
            }
            async fn complete(
                &self,
                scope: &Scope,
                key: &IdempotencyKey,
                token: LeaseToken,
                response: &StoredResponse,
                retention: Duration,
            ) -> Result<FenceOutcome, StoreError> {
                (**self).complete(scope, key, token, response, retention).await
            }
            async fn extend(
                &self,
                scope: &Scope,
                key: &IdempotencyKey,
                token: LeaseToken,
                lease: Duration,
            ) -> Result<FenceOutcome, StoreError> {
                (**self).extend(scope, key, token, lease).await
            }
            async fn release(
                &self,
                scope: &Scope,
                key: &IdempotencyKey,
                token: LeaseToken,
            ) -> Result<FenceOutcome, StoreError> {
                (**self).release(scope, key, token).await
            }
            async fn get(
                &self,
                scope: &Scope,
                key: &IdempotencyKey,
            ) -> Result<Option<Record>, StoreError> {
                (**self).get(scope, key).await
            }
            async fn purge_expired(&self, limit: usize) -> Result<u64, StoreError> {
                (**self).purge_expired(limit).await
            }
            fn transactional(&self) -> Option<&dyn TransactionalStore> {
                (**self).transactional()
            }
            fn state_losses(&self) -> u64 {
                (**self).state_losses()
            }
            async fn check_state(&self) -> Result<bool, StoreError> {
                (**self).check_state().await
            }
            async fn footprint(&self) -> Result<Option<Footprint>, StoreError> {
                (**self).footprint().await
            }
            fn pool_status(&self) -> Option<PoolStatus> {
                (**self).pool_status()
            }
            fn settled_keys(&self) -> Option<&SettledKeys> {
                (**self).settled_keys()
            }
            async fn watch_settle(
                &self,
                scope: &Scope,
                key: &IdempotencyKey,
            ) -> Result<(), StoreError> {
                (**self).watch_settle(scope, key).await
            }
        }
    )*};
}

forward_store!(Arc, Box);

#[cfg(test)]
mod tests {
    use super::StoreOp;

    /// `op as usize` indexes `ALL` (the metrics' key arrays and the fault table rely on it), and
    /// no two calls share a metric label.
    #[test]
    fn every_op_indexes_all_and_has_its_own_name() {
        for (i, op) in StoreOp::ALL.into_iter().enumerate() {
            assert_eq!(op as usize, i, "{op:?}");
        }
        let mut names: Vec<_> = StoreOp::ALL.map(StoreOp::name).into();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), StoreOp::ALL.len());
        let primitives = StoreOp::ALL.into_iter().filter(|op| op.is_primitive());
        assert_eq!(primitives.count(), 6);
    }
}
