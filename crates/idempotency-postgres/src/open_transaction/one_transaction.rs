//! The one-transaction mode's side of a request's transaction: the key's lookup and lock at
//! `BEGIN`, waited for; the completed record inserted with `COMMIT`; a refusal stored while the
//! lock still holds the key. The speculative mode (`speculative.rs`) begins and settles its own
//! way, then completes and discards here.

use super::{Hold, OpenTransaction, PostgresTransaction, commit_error, idle_limit_ms};
use crate::driver::{
    DIVISION_BY_ZERO, Driver, DriverRow, Param, UNIQUE_VIOLATION, record_from_row,
};
use crate::error::BACKEND;
use crate::primitives::StoreCore;
use idempotency_core::store::{
    CommitOutcome, CorruptRecord, DiscardOutcome, OneTransactionBegin, Record,
};
use idempotency_core::{
    Fingerprint, IdempotencyKey, LeaseToken, Scope, StoreError, StoredResponse,
};
use std::sync::Arc;
use std::time::Duration;

/// What a one-transaction-mode transaction inserts at commit time.
#[derive(Clone, Copy, Debug)]
pub(super) struct AtCommit {
    /// The request's fingerprint.
    pub(super) fingerprint: Fingerprint,
    /// The lookup saw an expired row of the key: the insert takes it over.
    pub(super) takeover: bool,
    /// The transaction's start, in seconds since the epoch, read with the lookup: the insert
    /// checks that it still runs in that transaction.
    pub(super) began: f64,
}

/// What [`StoreCore::begin_one_transaction`] found (the driver-generic `OneTransactionBegin`).
pub(crate) enum Begun<D: Driver> {
    Absent(OpenTransaction<D>),
    Existing(Record),
    Busy,
}

impl<D: Driver> Begun<D> {
    /// As core's `OneTransactionBegin`, the transaction handed out as a [`PostgresTransaction`].
    pub(crate) fn into_one_transaction_begin(self) -> OneTransactionBegin {
        match self {
            Begun::Absent(tx) => OneTransactionBegin::Absent(Box::new(PostgresTransaction(tx))),
            Begun::Existing(record) => OneTransactionBegin::Existing(record),
            Begun::Busy => OneTransactionBegin::Busy,
        }
    }
}

impl<D: Driver> OpenTransaction<D> {
    /// One-transaction mode: inserts the completed record and commits.
    pub(super) async fn insert_and_commit(
        &mut self,
        at_commit: AtCommit,
        response: &StoredResponse,
        retention: Duration,
    ) -> Result<CommitOutcome, StoreError> {
        let tx = self.take()?;
        let statements = &self.core.table.statements;
        // A duplicate on another process watches the key: the commit tells it.
        let watched = self
            .core
            .listener
            .settled_keys()
            .take_waited_for(&self.scope, &self.key);
        let sql = match (at_commit.takeover, watched) {
            (true, false) => &statements.one_transaction_takeover,
            (false, false) => &statements.one_transaction_insert,
            (true, true) => &statements.one_transaction_notifying.takeover,
            (false, true) => &statements.one_transaction_notifying.insert,
        };
        let encoded = response.encode();
        let hash = at_commit.fingerprint.to_bytes();
        let params = [
            Param::Text(self.scope.as_str()),
            Param::Text(self.key.as_str()),
            Param::Bytes(&hash[..]),
            Param::Float8(at_commit.began),
            Param::Int4(i32::from(response.status().as_u16())),
            Param::Bytes(&encoded[..]),
            Param::Float8(retention.as_secs_f64()),
        ];
        let (inserted, committed) = self.core.driver.commit_with(tx, sql, &params).await;
        match inserted {
            Ok(1) => committed
                .map(|()| CommitOutcome::Committed)
                .map_err(commit_error),
            Ok(_) => Err(StoreError::corrupt(
                BACKEND,
                CorruptRecord::Field("the completion wrote no row or several"),
            )),
            // Refused, and rolled back. Whose record stands, if any?
            Err(error) if error.is(DIVISION_BY_ZERO) || error.is(UNIQUE_VIOLATION) => {
                match self.core.get(&self.scope, &self.key).await? {
                    Some(record) => Ok(CommitOutcome::Superseded(record)),
                    // The unique index refused a row that is no longer live (it expired in
                    // between): nothing was written, the retry takes it over.
                    None if error.is(UNIQUE_VIOLATION) => Err(error.into()),
                    // Nothing stands: the check of the transaction failed, so the handler
                    // ended the transaction itself.
                    None => self.ended_by_handler().await,
                }
            }
            Err(error) => Err(commit_error(error)),
        }
    }
}

impl<D: Driver> OpenTransaction<D> {
    /// One-transaction modes: stores `response` as the key's record without the handler's
    /// writes, on another connection while this transaction still holds the key's lock, then
    /// rolls back (see
    /// [`StoreTransaction::discard_writes_and_store`](idempotency_core::store::StoreTransaction::discard_writes_and_store)).
    /// With no connection to be had at once (the pool is the app's transactions'), it rolls back
    /// first and the engine claims the key: waiting for a second connection while holding one
    /// could wait for ever on a small pool.
    pub(super) async fn discard_and_store(
        &mut self,
        at_commit: AtCommit,
        response: &StoredResponse,
        retention: Duration,
    ) -> Result<DiscardOutcome, StoreError> {
        let encoded = response.encode();
        let hash = at_commit.fingerprint.to_bytes();
        let params = [
            Param::Text(self.scope.as_str()),
            Param::Text(self.key.as_str()),
            Param::Bytes(&hash[..]),
            Param::Int4(i32::from(response.status().as_u16())),
            Param::Bytes(&encoded[..]),
            Param::Float8(retention.as_secs_f64()),
        ];
        let statement = &self.core.table.statements.discarded_insert;
        let inserted = self
            .core
            .driver
            .query_without_waiting(statement, &params)
            .await;
        // The record landed (or was refused) while the lock held the key: now it may go.
        if let Err(error) = self.rollback().await {
            tracing::warn!(
                backend = BACKEND,
                error = %idempotency_core::ErrorChain(&error),
                "could not roll back the discarded transaction; it ends with its connection"
            );
        }
        match inserted {
            None => Ok(DiscardOutcome::RolledBack),
            Some(Ok(rows)) if !rows.is_empty() => Ok(DiscardOutcome::Stored),
            // A live record stands (another mode's claim, a record older than this lookup).
            Some(Ok(_)) => Ok(match self.core.get(&self.scope, &self.key).await? {
                Some(record) => DiscardOutcome::Superseded(record),
                // It expired in between: the engine claims the key.
                None => DiscardOutcome::RolledBack,
            }),
            Some(Err(error)) => Err(error.into()),
        }
    }
}

impl<D: Driver> StoreCore<D> {
    /// The parameters of the key's lookup that begins a request's transaction, in either
    /// one-transaction mode: the scope, the key, the transaction's idle bound (`hold`) and the
    /// key's lock id.
    pub(super) fn lookup_params<'a>(
        &self,
        scope: &'a Scope,
        key: &'a IdempotencyKey,
        hold: Duration,
    ) -> [Param<'a>; 4] {
        [
            Param::Text(scope.as_str()),
            Param::Text(key.as_str()),
            Param::Int8(idle_limit_ms(hold)),
            Param::Int8(self.table.statements.lock_id(scope.as_str(), key.as_str())),
        ]
    }

    /// One-transaction mode (see
    /// [`TransactionalStore::begin_one_transaction`](idempotency_core::store::TransactionalStore::begin_one_transaction)).
    /// A transaction that is not handed out ends when it is dropped: the answer to a duplicate
    /// does not wait for its `ROLLBACK`.
    pub(crate) async fn begin_one_transaction(
        self: &Arc<Self>,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        token: LeaseToken,
        hold: Duration,
    ) -> Result<Begun<D>, StoreError> {
        let params = self.lookup_params(scope, key, hold);
        let (tx, rows) = self
            .driver
            .begin_with(&self.table.statements.one_transaction_begin, &params)
            .await?;
        let Some(row) = rows.first() else {
            return Err(StoreError::corrupt(
                BACKEND,
                CorruptRecord::Field("the key's lookup returned no row"),
            ));
        };
        let locked = row.bool(0)?;
        let began = row.float8(1)?;
        let live = row.opt_bool(2)?;
        if live == Some(true) {
            return record_from_row(row, 4).map(Begun::Existing);
        }
        if !locked {
            return Ok(Begun::Busy);
        }
        let xid = row.int8(3)?;
        Ok(Begun::Absent(OpenTransaction {
            hold: Hold::Lock(AtCommit {
                fingerprint: *fingerprint,
                takeover: live == Some(false),
                began,
            }),
            ..OpenTransaction::new(self, tx, scope, key, token, xid)
        }))
    }
}
