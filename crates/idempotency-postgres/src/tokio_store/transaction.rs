//! The request's transaction on the tokio-postgres store: the handler writes on the pooled
//! connection inside it, and the stored response commits in the same transaction (the logic is
//! `open_transaction.rs`, shared with sqlx).

use super::store::{PostgresStore, TokioDriver};
use crate::open_transaction::{OpenTransaction, transactions_on_core};
use deadpool_postgres::ClientWrapper;
use std::ops::Deref;

/// A request's transaction on the PostgreSQL store's pool: the handler's writes and its stored
/// response commit together, or not at all.
///
/// It derefs to the pooled connection ([`ClientWrapper`], which derefs to
/// [`tokio_postgres::Client`]), so a handler runs `query`, `execute`, `prepare_cached` and the
/// rest on it, inside the transaction. It offers no way to commit: the layer commits after the
/// handler returns, storing the response in the same transaction, after checking under the
/// record's row lock that this request still holds its key. Do not run `COMMIT` or `ROLLBACK`
/// yourself: the completion notices, stores nothing, and answers 500.
///
/// In an axum handler, take it as `idempotency::Tx<PgTransaction>` (feature `axum`); elsewhere,
/// open it from the request's `TransactionSlot` extension:
///
/// ```no_run
/// # async fn handler(request: idempotency_core::http::Request<()>) -> Result<(), Box<dyn std::error::Error>> {
/// use idempotency_core::TransactionSlot;
/// use idempotency_postgres::PgTransaction;
///
/// let slot = request.extensions().get::<TransactionSlot>().ok_or("no idempotency transaction")?;
/// let tx = slot.open::<PgTransaction>().await?;
/// tx.execute("INSERT INTO tasks (title) VALUES ($1)", &[&"Buy milk"]).await?;
/// drop(tx); // before returning the response
/// # Ok(()) }
/// ```
///
/// The transaction runs at PostgreSQL's default isolation, READ COMMITTED (the store's check is
/// its first statement, so it cannot be changed afterwards).
pub struct PgTransaction(pub(crate) OpenTransaction<TokioDriver>);

impl Deref for PgTransaction {
    type Target = ClientWrapper;

    fn deref(&self) -> &ClientWrapper {
        self.0.handle()
    }
}

transactions_on_core!(PostgresStore, PgTransaction);
