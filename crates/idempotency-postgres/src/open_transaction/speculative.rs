//! The speculative mode's side of a request's transaction: `BEGIN` and the key's lookup queued
//! and the transaction handed out at once, and the lookup settled later (before the handler's
//! first statement is answered, or before the completion): the key's lock, or the key's
//! record read behind the `ROLLBACK` on the same connection. The completion is the
//! one-transaction mode's (`one_transaction.rs`).

use super::one_transaction::{AtCommit, Begun};
use super::{Hold, OpenTransaction};
use crate::driver::{DIVISION_BY_ZERO, Driver, DriverError, DriverRow, Param, record_from_row};
use crate::error::BACKEND;
use crate::primitives::StoreCore;
use idempotency_core::store::{CorruptRecord, LookupSignal, Record, Settled};
use idempotency_core::{Fingerprint, IdempotencyKey, LeaseToken, Scope, StoreError};
use std::sync::Arc;
use std::time::Duration;

impl<D: Driver> StoreCore<D> {
    /// Speculative one-transaction mode (see
    /// [`TransactionalStore::begin_one_transaction_speculative`](idempotency_core::store::TransactionalStore::begin_one_transaction_speculative)):
    /// `BEGIN` and the aborting lookup are queued, and the transaction handed out at once. On
    /// a driver that cannot queue them, [`StoreCore::begin_one_transaction`].
    pub(crate) async fn begin_one_transaction_speculative(
        self: &Arc<Self>,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        token: LeaseToken,
        hold: Duration,
    ) -> Result<Begun<D>, StoreError> {
        if !self.driver.queues_statements() {
            return self
                .begin_one_transaction(scope, key, fingerprint, token, hold)
                .await;
        }
        let params = self.lookup_params(scope, key, hold);
        let (answered, signal) = LookupSignal::new();
        let (tx, lookup) = self
            .driver
            .begin_queued(&self.table.statements.speculative_lookup, &params, answered)
            .await?;
        // The transaction id and what `at_commit` reads from the lookup are set when it is settled.
        Ok(Begun::Absent(OpenTransaction {
            hold: Hold::PendingLookup {
                at_commit: AtCommit {
                    fingerprint: *fingerprint,
                    takeover: false,
                    began: 0.0,
                },
                lookup,
                signal,
            },
            ..OpenTransaction::new(self, tx, scope, key, token, 0)
        }))
    }
}

impl<D: Driver> OpenTransaction<D> {
    /// Speculative mode: waits for the key's lookup (see
    /// [`StoreTransaction::settle`](idempotency_core::store::StoreTransaction::settle)). A lookup
    /// that found the key taken aborted the transaction: it is rolled back, and the key's
    /// record read on another connection (none live: a duplicate's transaction is open).
    pub(crate) async fn settle(&mut self) -> Result<Settled, StoreError> {
        let (at_commit, lookup) = match std::mem::replace(&mut self.hold, Hold::Claim) {
            Hold::PendingLookup {
                at_commit, lookup, ..
            } => (at_commit, lookup),
            settled => {
                self.hold = settled;
                return Ok(Settled::Proceed);
            }
        };
        // Whatever the answer, the lookup is read: the transaction holds the key's lock (or
        // ends below).
        self.hold = Hold::Lock(at_commit);
        let answer = lookup.await.unwrap_or_else(|_| {
            Err(DriverError {
                sqlstate: None,
                error: StoreError::from_failure(
                    BACKEND,
                    true,
                    "the key's lookup ended without an answer",
                ),
            })
        });
        match answer {
            Ok(rows) => {
                let Some(row) = rows.first() else {
                    self.rollback().await?;
                    return Err(StoreError::corrupt(
                        BACKEND,
                        CorruptRecord::Field("the key's lookup returned no row"),
                    ));
                };
                let began = row.float8(0)?;
                let takeover = row.bool(1)?;
                self.xid = row.int8(2)?;
                if let Hold::Lock(at_commit) = &mut self.hold {
                    at_commit.began = began;
                    at_commit.takeover = takeover;
                }
                Ok(Settled::Proceed)
            }
            Err(error) if error.is(DIVISION_BY_ZERO) => {
                // Read on the connection the transaction held, behind its ROLLBACK: a replay
                // needs no second connection, and does not queue for the pool behind the
                // writers that hold it.
                Ok(match self.rollback_and_get().await? {
                    Some(record) => Settled::Existing(record),
                    None => Settled::Busy,
                })
            }
            Err(error) => {
                self.rollback().await?;
                Err(error.into())
            }
        }
    }

    /// Rolls the transaction back and reads the key's live record on its connection.
    async fn rollback_and_get(&mut self) -> Result<Option<Record>, StoreError> {
        self.hold.forget_lookup();
        let tx = self.take()?;
        let params = [
            Param::Text(self.scope.as_str()),
            Param::Text(self.key.as_str()),
        ];
        let get = &self.core.table.statements.get;
        let (rolled_back, rows) = self.core.driver.rollback_and_query(tx, get, &params).await;
        rolled_back?;
        let rows = rows?;
        rows.first().map(|row| record_from_row(row, 0)).transpose()
    }
}

/// A completion asked of a speculative transaction whose lookup `settle` did not settle: a
/// defect of the store's own code, reported rather than written.
pub(super) fn unsettled() -> StoreError {
    StoreError::corrupt(
        BACKEND,
        CorruptRecord::Field("the key's lookup was not settled before the completion"),
    )
}
