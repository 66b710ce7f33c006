//! The request's transaction on the sqlx store: the handler writes in a [`sqlx::Transaction`]
//! on the store's pool, and the stored response commits in the same transaction (the logic is
//! `open_transaction.rs`, shared with tokio-postgres).

use super::store::{SqlxDriver, SqlxPostgresStore};
use crate::open_transaction::{OpenTransaction, transactions_on_core};
use sqlx::PgConnection;
use std::ops::{Deref, DerefMut};

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
/// Compared with `PgTransaction` it costs two more round trips per
/// request: sqlx sends `BEGIN` and `COMMIT` on their own, where tokio-postgres pipelines them
/// with the store's check and completion. The transaction runs at READ COMMITTED.
pub struct SqlxTransaction(pub(crate) OpenTransaction<SqlxDriver>);

impl Deref for SqlxTransaction {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        self.0.handle()
    }
}

impl DerefMut for SqlxTransaction {
    fn deref_mut(&mut self) -> &mut PgConnection {
        self.0.handle_mut()
    }
}

transactions_on_core!(SqlxPostgresStore, SqlxTransaction);
