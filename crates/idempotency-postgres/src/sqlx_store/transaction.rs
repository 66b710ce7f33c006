//! Transactional completion on sqlx: the handler writes in a [`sqlx::Transaction`] on the
//! store's pool, and the stored response commits in the same transaction.

use super::session::{has_sqlstate, sqlx_error};
use super::store::SqlxPostgresStore;
use crate::error::BACKEND;
use async_trait::async_trait;
use idempotency_core::{
    CommitOutcome, CorruptRecord, IdempotencyKey, LeaseToken, Scope, StoreError, StoreTransaction,
    StoredResponse, TransactionalStore,
};
use sqlx::{PgConnection, Postgres};
use std::any::Any;
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::time::Duration;

/// SQLSTATE 22012, division by zero: how the completion refuses (see `tx_complete`).
const REFUSED: &str = "22012";

/// A request's [`sqlx::Transaction`] on the store's pool: the handler's writes and its stored
/// response commit together, or not at all.
///
/// It derefs to the transaction's [`PgConnection`], so a handler runs its queries with
/// `.execute(&mut **tx)` (for `tx: Tx<SqlxTransaction>`), inside the transaction. It offers no
/// way to commit: the layer commits after the handler returns, storing the response in the same
/// transaction after checking, under the record's row lock, that this request still holds its
/// key. Do not run `COMMIT` or `ROLLBACK` yourself: the completion notices, stores nothing, and
/// answers 500.
///
/// In an axum handler, take it as `idempotency::Tx<SqlxTransaction>` (feature `axum`; the
/// example `examples/axum_sqlx.rs`); elsewhere, open it from the request's `TransactionSlot`
/// extension:
///
/// ```no_run
/// # async fn handler(request: idempotency_core::http::Request<()>) -> Result<(), Box<dyn std::error::Error>> {
/// use idempotency_core::TransactionSlot;
/// use idempotency_postgres::{SqlxTransaction, sqlx};
///
/// let slot = request.extensions().get::<TransactionSlot>().ok_or("no idempotency transaction")?;
/// let mut tx = slot.open::<SqlxTransaction>().await?;
/// sqlx::query("INSERT INTO orders (item) VALUES ($1)")
///     .bind("book")
///     .execute(&mut **tx)
///     .await?;
/// drop(tx); // before returning the response
/// # Ok(()) }
/// ```
///
/// Compared with [`PgTransaction`](crate::PgTransaction) it costs two more round trips per
/// request: sqlx sends `BEGIN` and `COMMIT` on their own, where tokio-postgres pipelines them
/// with the store's check and completion. The transaction runs at READ COMMITTED.
pub struct SqlxTransaction {
    /// The transaction; taken when it ends.
    tx: Option<sqlx::Transaction<'static, Postgres>>,
    store: SqlxPostgresStore,
    scope: Scope,
    key: IdempotencyKey,
    token: LeaseToken,
}

impl fmt::Debug for SqlxTransaction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlxTransaction")
            .field("table", &self.store.inner.table.name.qualified())
            .field("open", &self.tx.is_some())
            .finish_non_exhaustive()
    }
}

impl Deref for SqlxTransaction {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        match &self.tx {
            Some(tx) => tx,
            None => unreachable!("the transaction is only taken when it is consumed"),
        }
    }
}

impl DerefMut for SqlxTransaction {
    fn deref_mut(&mut self) -> &mut PgConnection {
        match &mut self.tx {
            Some(tx) => tx,
            None => unreachable!("the transaction is only taken when it is consumed"),
        }
    }
}

impl SqlxTransaction {
    /// After a refused completion: whether the token still holds a live claim (then the
    /// handler ended the store's transaction) or not (the lease was lost).
    async fn refusal_cause(&self) -> Result<CommitOutcome, StoreError> {
        let row = self
            .store
            .query(&self.store.inner.table.statements.tx_diagnose)
            .bind(self.scope.as_str())
            .bind(self.key.as_str())
            .bind(self.token.as_uuid())
            .fetch_optional(&self.store.inner.pool)
            .await
            .map_err(sqlx_error)?;
        let still_ours = row.and_then(|row| sqlx::Row::try_get::<Option<bool>, _>(&row, 0).ok());
        Ok(if still_ours.flatten() == Some(true) {
            CommitOutcome::EndedByHandler
        } else {
            CommitOutcome::LeaseLost
        })
    }
}

#[async_trait]
impl StoreTransaction for SqlxTransaction {
    async fn complete_and_commit(
        mut self: Box<Self>,
        response: &StoredResponse,
        retention: Duration,
    ) -> Result<CommitOutcome, StoreError> {
        let Some(mut tx) = self.tx.take() else {
            return Err(StoreError::corrupt(
                BACKEND,
                CorruptRecord::Field("the transaction was already consumed"),
            ));
        };
        let encoded = response.encode();
        // The completion locks the row and re-checks token, lease and mark; when it matches
        // nothing it divides by zero, which aborts the transaction.
        let completed = self
            .store
            .query(&self.store.inner.table.statements.tx_complete)
            .bind(self.scope.as_str())
            .bind(self.key.as_str())
            .bind(self.token.as_uuid())
            .bind(i32::from(response.status().as_u16()))
            .bind(&encoded[..])
            .bind(retention.as_secs_f64())
            .fetch_all(&mut *tx)
            .await;
        match completed {
            Ok(rows) if rows.len() == 1 => {
                tx.commit().await.map_err(sqlx_error)?;
                Ok(CommitOutcome::Committed)
            }
            Ok(rows) => {
                // Dropped, the transaction rolls back.
                drop(tx);
                Err(StoreError::corrupt(
                    BACKEND,
                    CorruptRecord::Field(if rows.is_empty() {
                        "the completion returned no row"
                    } else {
                        "the completion returned several rows"
                    }),
                ))
            }
            Err(error) if has_sqlstate(&error, REFUSED) => {
                if let Err(error) = tx.rollback().await {
                    // The connection is gone, and its transaction with it.
                    tracing::debug!(error = %error, "could not roll back a refused completion");
                }
                self.refusal_cause().await
            }
            Err(error) => Err(sqlx_error(error)),
        }
    }

    async fn rollback(mut self: Box<Self>) -> Result<(), StoreError> {
        match self.tx.take() {
            Some(tx) => tx.rollback().await.map_err(sqlx_error),
            None => Ok(()),
        }
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

#[async_trait]
impl TransactionalStore for SqlxPostgresStore {
    async fn begin_transaction(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        token: LeaseToken,
    ) -> Result<Option<Box<dyn StoreTransaction>>, StoreError> {
        // A sqlx transaction dropped before it ends (an error below, this future cancelled)
        // is rolled back before its connection is used again.
        let mut tx = self.inner.pool.begin().await.map_err(sqlx_error)?;
        let checked = self
            .query(&self.inner.table.statements.tx_check)
            .bind(scope.as_str())
            .bind(key.as_str())
            .bind(token.as_uuid())
            .fetch_optional(&mut *tx)
            .await
            .map_err(sqlx_error)?;
        if checked.is_some() {
            return Ok(Some(Box::new(SqlxTransaction {
                tx: Some(tx),
                store: self.clone(),
                scope: scope.clone(),
                key: key.clone(),
                token,
            })));
        }
        tracing::debug!(
            backend = BACKEND,
            "the claim was lost before its transaction opened"
        );
        tx.rollback().await.map_err(sqlx_error)?;
        Ok(None)
    }
}
