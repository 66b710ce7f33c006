//! Building the sqlx store on an application's pool.

use super::session::SqlxSession;
use super::store::{SqlxDriver, SqlxInner, SqlxPostgresStore};
use crate::error::PostgresStoreError;
use crate::session::check_writer;
use crate::table::TableSettings;
use sqlx::PgPool;
use std::fmt;
use std::sync::Arc;

/// Builds a [`SqlxPostgresStore`] on an existing [`sqlx::PgPool`].
pub struct SqlxPostgresStoreBuilder {
    pool: PgPool,
    table: TableSettings,
    transactions: bool,
}

impl fmt::Debug for SqlxPostgresStoreBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlxPostgresStoreBuilder")
            .field("table", &self.table)
            .finish_non_exhaustive()
    }
}

impl SqlxPostgresStore {
    /// A builder for a store on `pool`. The pool's settings are the application's: its size,
    /// timeouts, TLS, and (for [`TableMode::LoggedAsyncCommit`](crate::TableMode::LoggedAsyncCommit)) `synchronous_commit = off` on
    /// its connections (`PgConnectOptions::options([("synchronous_commit", "off")])`).
    ///
    /// The store's statements are cached on each connection, as sqlx caches the app's own.
    /// Behind a pooler in transaction mode that means the pooler must track prepared statements
    /// (PgBouncer 1.21 or later with `max_prepared_statements`); `docs/postgres.md` has the
    /// details.
    pub fn builder(pool: PgPool) -> SqlxPostgresStoreBuilder {
        SqlxPostgresStoreBuilder {
            pool,
            table: TableSettings::default(),
            transactions: true,
        }
    }
}

impl SqlxPostgresStoreBuilder {
    crate::table::table_setters!();

    /// Whether handlers are offered a transaction in which their writes commit together with
    /// the stored response ([`SqlxTransaction`](super::SqlxTransaction); default true). Off,
    /// every request is completed on its own statement.
    pub fn transactions(mut self, offer: bool) -> Self {
        self.transactions = offer;
        self
    }

    /// Checks that the server is a writer and, for [`TableMode::LoggedAsyncCommit`](crate::TableMode::LoggedAsyncCommit), that the
    /// pool's commits are asynchronous; then checks the state sentinel once (a table emptied
    /// since it was migrated counts as a loss).
    pub async fn build(self) -> Result<SqlxPostgresStore, PostgresStoreError> {
        let table = self.table.table()?;
        let mut connection = self.pool.acquire().await?;
        check_writer(&mut SqlxSession(&mut connection), table.mode).await?;
        // Before `migrate` the table does not exist yet: not a loss.
        if let Err(error) = table.watch.check(&mut SqlxSession(&mut connection)).await {
            tracing::debug!(error = %idempotency_core::ErrorChain(&error), "could not check the state sentinel");
        }
        drop(connection);
        Ok(SqlxPostgresStore {
            inner: Arc::new(SqlxInner {
                table,
                driver: SqlxDriver { pool: self.pool },
                transactions: self.transactions,
            }),
        })
    }
}
