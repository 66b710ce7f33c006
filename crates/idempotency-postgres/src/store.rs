//! The store: one type over its driver, [`PostgresStore<D>`](PostgresStore), implementing the
//! core's store trait once, on the shared primitives (`primitives.rs`). What only one driver
//! offers (its pool, its builder) is in `tokio_store.rs` and `sqlx_store.rs`.

use crate::driver::Driver;
use crate::error::BACKEND;
use crate::flavour::defaults_to_tokio_postgres;
use crate::primitives::StoreCore;
use crate::schema::{StatementsSql, TableMode};
use idempotency_core::store::{ClaimOutcome, FenceOutcome, Footprint, Record, TransactionalStore};
use idempotency_core::{
    Fingerprint, IdempotencyKey, IdempotencyStore, LeaseToken, Scope, StoreError, StoredResponse,
};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

defaults_to_tokio_postgres! {
/// The PostgreSQL store: ADR 009's table on the driver `D`. Cheap to clone; clones share the
/// pool.
///
/// - `PostgresStore` (`D` = [`TokioPostgres`](crate::TokioPostgres), feature `tokio-postgres`,
///   the default): its own deadpool pool, `BEGIN` and `COMMIT` pipelined with the store's
///   statements, TLS with `tls`. Built with [`PostgresStore::builder`].
/// - `SqlxPostgresStore` = `PostgresStore<Sqlx>` (feature `sqlx`): on an application's
///   `sqlx::PgPool`. Built with `PostgresStore::builder_from_sqlx_pool`.
///
/// Both send the same SQL through the same code; `docs/postgres.md` says how to choose.
pub struct PostgresStore<D: Driver> {
    pub(crate) inner: Arc<StoreCore<D>>,
}
}

impl<D: Driver> Clone for PostgresStore<D> {
    fn clone(&self) -> Self {
        PostgresStore {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<D: Driver> fmt::Debug for PostgresStore<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresStore")
            .field("driver", &std::any::type_name::<D>())
            .field("table", &self.inner.table.name.qualified())
            .field("mode", &self.inner.table.mode)
            .finish_non_exhaustive()
    }
}

impl<D: Driver> PostgresStore<D> {
    /// The table mode.
    pub fn table_mode(&self) -> TableMode {
        self.inner.table.mode
    }

    /// The SQL of each store step, as rendered for this table (for `EXPLAIN` and for DBAs);
    /// the same text on both drivers.
    pub fn statements(&self) -> StatementsSql<'_> {
        self.inner.table.statements.sql()
    }

    /// The schema of the table.
    pub fn schema(&self) -> &str {
        &self.inner.table.name.schema
    }

    /// The quoted, schema-qualified table name.
    pub fn table_name(&self) -> String {
        self.inner.table.name.qualified()
    }

    /// How many times this store found its table emptied (see
    /// [`check_state`](PostgresStore::check_state)).
    pub fn state_losses(&self) -> u64 {
        self.inner.table.watch.losses.count()
    }

    /// Checks that the table still holds what it held: returns `true` (and logs an error and
    /// counts it in `idempotency_store_state_lost_total`) when the table was emptied since the
    /// last check, by crash recovery of an UNLOGGED table, a failover or a `TRUNCATE`. One
    /// single-row `INSERT .. ON CONFLICT DO NOTHING` per call. A pool the store built runs it on
    /// every new connection; on a pool you passed in, call it periodically (every 30 s, say).
    pub async fn check_state(&self) -> Result<bool, StoreError> {
        self.inner.driver.check_state(&self.inner.table.watch).await
    }
}

#[async_trait::async_trait]
impl<D: Driver> IdempotencyStore for PostgresStore<D> {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    async fn claim(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        token: LeaseToken,
        lease: Duration,
    ) -> Result<ClaimOutcome, StoreError> {
        self.inner
            .claim(scope, key, fingerprint, token, lease)
            .await
    }

    async fn complete(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        token: LeaseToken,
        response: &StoredResponse,
        retention: Duration,
    ) -> Result<FenceOutcome, StoreError> {
        self.inner
            .complete(scope, key, token, response, retention)
            .await
    }

    async fn extend(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        token: LeaseToken,
        lease: Duration,
    ) -> Result<FenceOutcome, StoreError> {
        self.inner.extend(scope, key, token, lease).await
    }

    async fn release(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        token: LeaseToken,
    ) -> Result<FenceOutcome, StoreError> {
        self.inner.release(scope, key, token).await
    }

    async fn get(&self, scope: &Scope, key: &IdempotencyKey) -> Result<Option<Record>, StoreError> {
        self.inner.get(scope, key).await
    }

    async fn purge_expired(&self, limit: usize) -> Result<u64, StoreError> {
        self.inner.purge_expired(limit).await
    }

    /// Unless turned off with the builder's `transactions(false)`: a handler's writes and its
    /// stored response can commit in one transaction on the store's pool.
    fn transactional(&self) -> Option<&dyn TransactionalStore> {
        if self.inner.transactions {
            Some(self)
        } else {
            None
        }
    }

    fn state_losses(&self) -> u64 {
        PostgresStore::state_losses(self)
    }

    async fn check_state(&self) -> Result<bool, StoreError> {
        PostgresStore::check_state(self).await
    }

    async fn footprint(&self) -> Result<Option<Footprint>, StoreError> {
        self.inner.footprint().await
    }

    fn pool_status(&self) -> Option<idempotency_core::store::PoolStatus> {
        Some(self.inner.driver.pool_status())
    }

    fn settled_keys(&self) -> Option<&idempotency_core::store::SettledKeys> {
        // Behind a transaction-mode pooler (or on an application's deadpool pool) nothing is
        // heard: duplicates poll.
        self.inner
            .driver
            .can_listen()
            .then(|| self.inner.listener.settled_keys())
    }

    async fn watch_settle(&self, scope: &Scope, key: &IdempotencyKey) -> Result<(), StoreError> {
        self.inner.watch_settle(scope, key).await
    }
}
