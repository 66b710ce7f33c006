//! What only the sqlx store offers: its builder on an application's `sqlx::PgPool`, its pool,
//! its migrations and status, and the handler's connection in a `SqlxPostgresTransaction`.

use crate::builder::PostgresStoreBuilder;
use crate::error::PostgresStoreError;
use crate::migrate::{MigrationReport, migrate_in};
use crate::open_transaction::PostgresTransaction;
use crate::primitives::StoreCore;
use crate::session::check_writer;
use crate::sqlx_driver::{Sqlx, SqlxSession};
use crate::status::{self, RecordTimes, StoreStatus};
use crate::store::PostgresStore;
use idempotency_core::{IdempotencyKey, Scope};
use sqlx::{PgConnection, PgPool};
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

/// The store on an application's [`sqlx::PgPool`] (feature `sqlx`): the table, SQL,
/// migrations, writer check and lost-state sentinel of `PostgresStore`, on sqlx instead of
/// tokio-postgres and deadpool.
///
/// ```no_run
/// use idempotency_postgres::{SqlxPostgresStore, TableMode};
///
/// # async fn run(pool: sqlx::PgPool) -> Result<(), idempotency_postgres::PostgresStoreError> {
/// let store = SqlxPostgresStore::builder_from_sqlx_pool(pool) // the pool your app already has
///     .table_mode(TableMode::Unlogged)
///     .build()
///     .await?;                                   // refuses a standby / reader endpoint
/// store.migrate().await?;                        // the same migrations as PostgresStore's
/// # Ok(()) }
/// ```
pub type SqlxPostgresStore = PostgresStore<Sqlx>;

/// A request's `sqlx::Transaction` on the store's pool (see [`PostgresTransaction`]): a handler runs
/// its queries with `.execute(&mut **tx)` (for `tx: Tx<SqlxPostgresTransaction>`), inside the
/// transaction.
///
/// ```no_run
/// # async fn handler(request: idempotency_core::http::Request<()>) -> Result<(), Box<dyn std::error::Error>> {
/// use idempotency_core::TransactionSlot;
/// use idempotency_postgres::{SqlxPostgresTransaction, sqlx};
///
/// let slot = request.extensions().get::<TransactionSlot>().ok_or("no idempotency transaction")?;
/// let mut tx = slot.open::<SqlxPostgresTransaction>().await?;
/// sqlx::query("INSERT INTO orders (item) VALUES ($1)")
///     .bind("book")
///     .execute(&mut **tx)
///     .await?;
/// drop(tx); // before returning the response
/// # Ok(()) }
/// ```
pub type SqlxPostgresTransaction = PostgresTransaction<Sqlx>;

/// Builds a [`SqlxPostgresStore`] on an existing [`sqlx::PgPool`].
pub type SqlxPostgresStoreBuilder = PostgresStoreBuilder<Sqlx>;

impl PostgresStore<Sqlx> {
    /// A builder for a store on `pool`. The pool's settings are the application's: its size,
    /// timeouts, TLS, and (for
    /// [`TableMode::LoggedAsyncCommit`](crate::TableMode::LoggedAsyncCommit))
    /// `synchronous_commit = off` on its connections
    /// (`PgConnectOptions::options([("synchronous_commit", "off")])`).
    ///
    /// The store's statements are cached on each connection, as sqlx caches the app's own.
    /// Behind a pooler in transaction mode that means the pooler must track prepared statements
    /// (PgBouncer 1.21 or later with `max_prepared_statements`); `docs/postgres.md` has the
    /// details.
    pub fn builder_from_sqlx_pool(pool: PgPool) -> SqlxPostgresStoreBuilder {
        PostgresStoreBuilder::with_options(pool)
    }

    /// The pool the store uses.
    pub fn pool(&self) -> &PgPool {
        &self.inner.driver.pool
    }

    /// Creates the table and index if missing and schedules the pg_cron purge job where pg_cron
    /// is installed: the migrations of the tokio-postgres store, by the same code, in one sqlx
    /// transaction under the same advisory lock.
    pub async fn migrate(&self) -> Result<MigrationReport, PostgresStoreError> {
        let mut tx = self.inner.driver.pool.begin().await?;
        let report = migrate_in(&mut SqlxSession(&mut tx), &self.inner.table).await?;
        tx.commit().await?;
        Ok(report)
    }

    /// Reads the state of the table, its migrations and its pg_cron purge job, as the
    /// tokio-postgres store does, by the same code. Reads only.
    pub async fn status(&self) -> Result<StoreStatus, PostgresStoreError> {
        let mut connection = self.inner.driver.pool.acquire().await?;
        status::read_status(&mut SqlxSession(&mut connection), &self.inner.table).await
    }

    /// When the live record of `(scope, key)` was created and how long until it expires;
    /// `None` when it is absent. For operators.
    pub async fn record_times(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
    ) -> Result<Option<RecordTimes>, PostgresStoreError> {
        let mut connection = self.inner.driver.pool.acquire().await?;
        status::read_record_times(
            &mut SqlxSession(&mut connection),
            &self.inner.table,
            scope,
            key,
        )
        .await
    }
}

impl PostgresStoreBuilder<Sqlx> {
    /// Checks that the server is a writer and, for
    /// [`TableMode::LoggedAsyncCommit`](crate::TableMode::LoggedAsyncCommit), that the pool's
    /// commits are asynchronous; then checks the state sentinel once (a table emptied since it
    /// was migrated counts as a loss).
    pub async fn build(self) -> Result<SqlxPostgresStore, PostgresStoreError> {
        let table = self.table.table()?;
        let pool = self.options;
        let mut connection = pool.acquire().await?;
        check_writer(&mut SqlxSession(&mut connection), table.mode).await?;
        // Before `migrate` the table does not exist yet: not a loss.
        if let Err(error) = table.watch.check(&mut SqlxSession(&mut connection)).await {
            tracing::debug!(error = %idempotency_core::ErrorChain(&error), "could not check the state sentinel");
        }
        drop(connection);
        Ok(PostgresStore {
            inner: Arc::new(StoreCore {
                table,
                driver: Sqlx { pool },
                transactions: self.transactions,
                listener: Default::default(),
            }),
        })
    }
}

/// The transaction's connection.
impl Deref for PostgresTransaction<Sqlx> {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        self.0.handle()
    }
}

impl DerefMut for PostgresTransaction<Sqlx> {
    fn deref_mut(&mut self) -> &mut PgConnection {
        self.0.handle_mut()
    }
}
