//! What only the tokio-postgres store offers: its builders (a URL, or the application's
//! deadpool pool, and pool settings), its pool, its migrations and status over a pooled
//! connection, and the handler's connection in a [`PostgresTransaction`].

use crate::builder::PostgresStoreBuilder;
use crate::error::PostgresStoreError;
use crate::migrate::{MigrationReport, migrate_in};
use crate::open_transaction::PostgresTransaction;
use crate::primitives::StoreCore;
use crate::status::{self, RecordTimes, StoreStatus};
use crate::store::PostgresStore;
use crate::tokio_driver::{Source, TokioOptions, TokioPostgres, TokioSession, connect};
use deadpool_postgres::{ClientWrapper, Pool};
use idempotency_core::{IdempotencyKey, Scope};
use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

impl PostgresStore<TokioPostgres> {
    /// A builder for a store that makes its own pool from a `postgres://` URL.
    pub fn builder(url: impl Into<String>) -> PostgresStoreBuilder<TokioPostgres> {
        PostgresStoreBuilder::with_options(TokioOptions::new(Source::Url(url.into())))
    }

    /// A builder for a store on a pool the application already has. For
    /// [`TableMode::LoggedAsyncCommit`](crate::TableMode::LoggedAsyncCommit), its connections
    /// must run with `synchronous_commit = off`.
    pub fn builder_from_pool(pool: Pool) -> PostgresStoreBuilder<TokioPostgres> {
        PostgresStoreBuilder::with_options(TokioOptions::new(Source::Pool(pool)))
    }

    /// Connects to `url` with the defaults (table `public.idempotency_keys`, LOGGED, 16
    /// connections). Runs no DDL: create the table with [`PostgresStore::migrate`].
    pub async fn connect(url: impl Into<String>) -> Result<Self, PostgresStoreError> {
        Self::builder(url).build().await
    }

    /// The pool the store uses.
    pub fn pool(&self) -> &Pool {
        &self.inner.driver.pool
    }

    /// Creates the table and index if missing, and schedules the pg_cron purge job where pg_cron
    /// is installed. Idempotent; runs in one transaction under an advisory lock, so several
    /// instances starting at once do not collide. Fails if the existing table's persistence
    /// differs from the configured mode.
    pub async fn migrate(&self) -> Result<MigrationReport, PostgresStoreError> {
        let mut client = self.inner.driver.pool.get().await?;
        let tx = client.transaction().await?;
        let report = migrate_in(&mut TokioSession(&*tx), &self.inner.table).await?;
        tx.commit().await?;
        Ok(report)
    }

    /// Reads the state of the table, its migrations and its pg_cron purge job (from `cron.job`,
    /// so a job someone unscheduled or changed shows). Reads only.
    pub async fn status(&self) -> Result<StoreStatus, PostgresStoreError> {
        let client = self.inner.driver.pool.get().await?;
        status::read_status(&mut TokioSession(&**client), &self.inner.table).await
    }

    /// When the live record of `(scope, key)` was created and how long until it expires (its
    /// lease while in flight, its retention once completed); `None` when it is absent. For
    /// operators (`idempotency inspect`).
    pub async fn record_times(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
    ) -> Result<Option<RecordTimes>, PostgresStoreError> {
        let client = self.inner.driver.pool.get().await?;
        status::read_record_times(&mut TokioSession(&**client), &self.inner.table, scope, key).await
    }
}

impl PostgresStoreBuilder<TokioPostgres> {
    /// Whether the store's statements are prepared once per connection (default true, the
    /// fastest). Turn it off behind a connection pooler in transaction mode (PgBouncer,
    /// RDS Proxy): statements are then sent unnamed with their parameter types, still one round
    /// trip each, and nothing outlives a transaction on the server connection the pooler lent.
    /// The URL parameter `prepared_statements=false` does the same. (Your own statements must
    /// follow the same rule: `query_typed` / `execute_typed`, never `prepare_cached`.)
    pub fn prepared_statements(mut self, prepared: bool) -> Self {
        self.options.prepared_statements = prepared;
        self
    }

    /// Connections in the pool built from a URL (default 8). Size it by the database server's
    /// cores, not by your request concurrency: about 2-4 connections per core, shared by any
    /// number of concurrent requests; raise it for a server of more than 4 cores. On a 2-core
    /// server, 64 concurrent clients did best on 8 connections and 0.71x as well on 64
    /// (`docs/benchmarks.md`, "PostgreSQL with many clients"). On hot rows the engine runs
    /// fewer request transactions than the pool (`TransactionAdmission`, `docs/handlers.md`
    /// "Pool and lease under contention"); there the default of 8 committed 0.81-0.91x of the
    /// orders of the best pool measured, where 16 (the default before) committed 0.69-0.94x.
    pub fn pool_size(mut self, size: usize) -> Self {
        self.options.pool_size = size.max(1);
        self
    }

    /// Bound on connecting and on waiting for a pooled connection (default 5 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.options.connect_timeout = timeout;
        self
    }

    /// Builds the pool (for a URL), checks that the server is a writer and, for
    /// [`TableMode::LoggedAsyncCommit`](crate::TableMode::LoggedAsyncCommit), that commits are
    /// asynchronous.
    pub async fn build(self) -> Result<PostgresStore<TokioPostgres>, PostgresStoreError> {
        let table = self.table.table()?;
        let driver = connect(self.options, table.mode, &table.watch).await?;
        Ok(PostgresStore {
            inner: Arc::new(StoreCore {
                table,
                driver,
                transactions: self.transactions,
                listener: Default::default(),
            }),
        })
    }
}

/// The pooled connection inside the transaction: a handler runs `query`, `execute`,
/// `prepare_cached` and the rest of [`tokio_postgres::Client`] on it, inside the transaction.
impl Deref for PostgresTransaction<TokioPostgres> {
    type Target = ClientWrapper;

    fn deref(&self) -> &ClientWrapper {
        self.0.handle()
    }
}
