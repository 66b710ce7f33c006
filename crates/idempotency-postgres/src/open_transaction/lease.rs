//! The lease mode's side of a request's transaction: opened with a check that the claim still
//! holds the key, completed by updating the claim's record (fenced by token, lease and mark)
//! with `COMMIT`, discarded by a rollback (the claim's record still holds the key, and the
//! engine completes it after).

use super::{OpenTransaction, commit_error, idle_limit_ms};
use crate::driver::{DIVISION_BY_ZERO, Driver, DriverRow, Param};
use crate::error::BACKEND;
use crate::primitives::StoreCore;
use idempotency_core::store::{CommitOutcome, CorruptRecord, DiscardOutcome};
use idempotency_core::{IdempotencyKey, LeaseToken, Scope, StoreError, StoredResponse};
use std::sync::Arc;
use std::time::Duration;

impl<D: Driver> StoreCore<D> {
    /// Lease mode: begins a transaction and checks, inside it, that `token` still holds a live
    /// claim on `(scope, key)`; `None` (nothing left open) when it does not.
    pub(crate) async fn begin_transaction(
        self: &Arc<Self>,
        scope: &Scope,
        key: &IdempotencyKey,
        token: LeaseToken,
        hold: Duration,
    ) -> Result<Option<OpenTransaction<D>>, StoreError> {
        let params = [
            Param::Text(scope.as_str()),
            Param::Text(key.as_str()),
            Param::Uuid(token.as_uuid()),
            Param::Int8(idle_limit_ms(hold)),
        ];
        let (tx, rows) = self
            .driver
            .begin_with(&self.table.statements.tx_check, &params)
            .await?;
        let Some(row) = rows.first() else {
            tracing::debug!(
                backend = BACKEND,
                "the claim was lost before its transaction opened"
            );
            self.driver.rollback(tx).await?;
            return Ok(None);
        };
        let xid = row.int8(1)?;
        Ok(Some(OpenTransaction::new(self, tx, scope, key, token, xid)))
    }
}

impl<D: Driver> OpenTransaction<D> {
    /// Lease mode: completes the claim's record (fenced by token, lease and mark) and commits.
    pub(super) async fn update_and_commit(
        &mut self,
        response: &StoredResponse,
        retention: Duration,
    ) -> Result<CommitOutcome, StoreError> {
        let tx = self.take()?;
        let encoded = response.encode();
        let params = [
            Param::Text(self.scope.as_str()),
            Param::Text(self.key.as_str()),
            Param::Uuid(self.token.as_uuid()),
            Param::Int4(i32::from(response.status().as_u16())),
            Param::Bytes(&encoded[..]),
            Param::Float8(retention.as_secs_f64()),
        ];
        let statements = &self.core.table.statements;
        let (completed, committed) = self
            .core
            .driver
            .commit_with(tx, &statements.tx_complete, &params)
            .await;
        match completed {
            Ok(1) => committed
                .map(|()| CommitOutcome::Committed)
                .map_err(commit_error),
            Ok(rows) => Err(StoreError::corrupt(
                BACKEND,
                CorruptRecord::Field(if rows == 0 {
                    "the completion returned no row"
                } else {
                    "the completion returned several rows"
                }),
            )),
            // Refused: does the token still hold a live claim (then the handler ended the
            // store's transaction) or not (the lease was lost)?
            Err(error) if error.is(DIVISION_BY_ZERO) => {
                let rows = self
                    .core
                    .driver
                    .query(&statements.tx_diagnose, &params[..3])
                    .await?;
                let still_ours = match rows.first() {
                    Some(row) => row.opt_bool(0)? == Some(true),
                    None => false,
                };
                if still_ours {
                    self.ended_by_handler().await
                } else {
                    Ok(CommitOutcome::LeaseLost)
                }
            }
            Err(error) => Err(commit_error(error)),
        }
    }

    /// Rolls the handler's writes back; the claim's record holds the key, and the engine
    /// completes it with the response after. A rollback that fails ends the transaction with
    /// its connection, uncommitted: the claim's answer is still to be stored.
    pub(super) async fn discard_for_claim(&mut self) -> DiscardOutcome {
        if let Err(error) = self.rollback().await {
            tracing::warn!(
                backend = BACKEND,
                error = %idempotency_core::ErrorChain(&error),
                "could not roll back the discarded transaction; it ends with its connection"
            );
        }
        DiscardOutcome::RolledBack
    }
}
