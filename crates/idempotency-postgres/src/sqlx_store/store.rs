//! The sqlx store: its shared state, its accessors, and the six primitives, each one statement
//! (the same text as the tokio-postgres flavour's).

use super::session::{SqlxSession, sqlx_error};
use crate::error::{BACKEND, PostgresStoreError, setup_error};
use crate::schema::{Sql, TableMode};
use crate::store::StatementsSql;
use crate::table::{RecordColumns, Table, corrupt_field};
use crate::{MigrationReport, migrate};
use async_trait::async_trait;
use idempotency_core::{
    ClaimOutcome, FenceOutcome, Fingerprint, IdempotencyKey, IdempotencyStore, LeaseToken, Record,
    Scope, StoreError, StoredResponse, TransactionalStore,
};
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::{PgPool, Postgres, Row};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// What every clone of a store shares.
pub(crate) struct SqlxInner {
    pub(crate) table: Table,
    pub(crate) pool: PgPool,
    pub(crate) transactions: bool,
}

/// The PostgreSQL store on an application's [`sqlx::PgPool`] (feature `sqlx`): the table,
/// SQL, migrations, writer check and lost-state sentinel of
/// [`PostgresStore`](crate::PostgresStore), on sqlx instead of tokio-postgres and deadpool.
/// Cheap to clone; clones share the pool.
///
/// ```no_run
/// use idempotency_postgres::{SqlxPostgresStore, TableMode};
///
/// # async fn run(pool: sqlx::PgPool) -> Result<(), idempotency_postgres::PostgresStoreError> {
/// let store = SqlxPostgresStore::builder(pool)   // the pool your app already has
///     .table_mode(TableMode::Unlogged)
///     .build()
///     .await?;                                   // refuses a standby / reader endpoint
/// store.migrate().await?;                        // the same migrations as PostgresStore's
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct SqlxPostgresStore {
    pub(crate) inner: Arc<SqlxInner>,
}

impl fmt::Debug for SqlxPostgresStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlxPostgresStore")
            .field("table", &self.inner.table.name.qualified())
            .field("mode", &self.inner.table.mode)
            .finish_non_exhaustive()
    }
}

impl SqlxPostgresStore {
    /// The pool the store uses.
    pub fn pool(&self) -> &PgPool {
        &self.inner.pool
    }

    /// The table mode.
    pub fn table_mode(&self) -> TableMode {
        self.inner.table.mode
    }

    /// The SQL of each store step, as rendered for this table: the same text
    /// [`PostgresStore::statements`](crate::PostgresStore::statements) returns.
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

    /// Creates the table and index if missing and schedules the pg_cron purge job where pg_cron
    /// is installed: the migrations of [`PostgresStore::migrate`](crate::PostgresStore::migrate),
    /// by the same code, in one sqlx transaction under the same advisory lock.
    pub async fn migrate(&self) -> Result<MigrationReport, PostgresStoreError> {
        let mut tx = self.inner.pool.begin().await?;
        let report = migrate::migrate_in(&mut SqlxSession(&mut tx), &self.inner.table).await?;
        tx.commit().await?;
        Ok(report)
    }

    /// Checks that the table still holds what it held: returns `true` (and logs an error and
    /// counts it in `idempotency_store_state_lost_total`) when the table was emptied since the
    /// last check, by crash recovery of an UNLOGGED table, a failover or a `TRUNCATE`. The store
    /// checks once when it is built; the pool is yours, so call this periodically (a background
    /// task every 30 s, say): one single-row `INSERT .. ON CONFLICT DO NOTHING` per call.
    pub async fn check_state(&self) -> Result<bool, StoreError> {
        let mut connection = self.inner.pool.acquire().await.map_err(sqlx_error)?;
        self.inner
            .table
            .watch
            .check(&mut SqlxSession(&mut connection))
            .await
            .map_err(setup_error)
    }

    /// How many times this store found its table emptied (see
    /// [`SqlxPostgresStore::check_state`]).
    pub fn state_losses(&self) -> u64 {
        self.inner.table.watch.losses.count()
    }

    /// `sql` as a sqlx query, prepared once per connection and cached there (sqlx's default):
    /// after the first use, one round trip.
    pub(crate) fn query<'q>(&self, sql: &'q Sql) -> sqlx::query::Query<'q, Postgres, PgArguments> {
        sqlx::query(&sql.text)
    }

    /// Runs one fenced statement (complete, extend, release): applied when it changed the row.
    async fn fenced(
        &self,
        query: sqlx::query::Query<'_, Postgres, PgArguments>,
    ) -> Result<FenceOutcome, StoreError> {
        let done = query.execute(&self.inner.pool).await.map_err(sqlx_error)?;
        Ok(FenceOutcome::from_count(done.rows_affected()))
    }
}

/// The record in `row`'s columns from `offset` on (see `RECORD_COLUMNS`).
fn record_from_row(row: &PgRow, offset: usize) -> Result<Record, StoreError> {
    RecordColumns {
        request_hash: row
            .try_get(offset)
            .map_err(|_| corrupt_field("request_hash"))?,
        in_flight: row
            .try_get(offset + 1)
            .map_err(|_| corrupt_field("lease_token"))?,
        remaining_ms: row
            .try_get(offset + 2)
            .map_err(|_| corrupt_field("locked_until"))?,
        response: row
            .try_get(offset + 3)
            .map_err(|_| corrupt_field("response"))?,
    }
    .into_record()
}

#[async_trait]
impl IdempotencyStore for SqlxPostgresStore {
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
        let hash = fingerprint.to_bytes();
        let lease_secs = lease.as_secs_f64();
        // As in the tokio-postgres flavour: a row committed after the statement's snapshot
        // conflicts with the insert but is invisible to the read, so nothing comes back; the
        // next attempt sees it.
        for _ in 0..8 {
            let row = self
                .query(&self.inner.table.statements.claim)
                .bind(scope.as_str())
                .bind(key.as_str())
                .bind(&hash[..])
                .bind(token.as_uuid())
                .bind(lease_secs)
                .fetch_optional(&self.inner.pool)
                .await
                .map_err(sqlx_error)?;
            if let Some(row) = row {
                let claimed: bool = row.try_get(0).map_err(|_| corrupt_field("claimed"))?;
                return if claimed {
                    Ok(ClaimOutcome::Claimed)
                } else {
                    record_from_row(&row, 1).map(ClaimOutcome::Existing)
                };
            }
        }
        Err(StoreError::Unavailable {
            backend: BACKEND,
            source: "the claim kept racing with concurrent claims of the same key".into(),
        })
    }

    async fn complete(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        token: LeaseToken,
        response: &StoredResponse,
        retention: Duration,
    ) -> Result<FenceOutcome, StoreError> {
        let encoded = response.encode();
        self.fenced(
            self.query(&self.inner.table.statements.complete)
                .bind(scope.as_str())
                .bind(key.as_str())
                .bind(token.as_uuid())
                .bind(i32::from(response.status().as_u16()))
                .bind(&encoded[..])
                .bind(retention.as_secs_f64()),
        )
        .await
    }

    async fn extend(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        token: LeaseToken,
        lease: Duration,
    ) -> Result<FenceOutcome, StoreError> {
        self.fenced(
            self.query(&self.inner.table.statements.extend)
                .bind(scope.as_str())
                .bind(key.as_str())
                .bind(token.as_uuid())
                .bind(lease.as_secs_f64()),
        )
        .await
    }

    async fn release(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        token: LeaseToken,
    ) -> Result<FenceOutcome, StoreError> {
        self.fenced(
            self.query(&self.inner.table.statements.release)
                .bind(scope.as_str())
                .bind(key.as_str())
                .bind(token.as_uuid()),
        )
        .await
    }

    async fn get(&self, scope: &Scope, key: &IdempotencyKey) -> Result<Option<Record>, StoreError> {
        let row = self
            .query(&self.inner.table.statements.get)
            .bind(scope.as_str())
            .bind(key.as_str())
            .fetch_optional(&self.inner.pool)
            .await
            .map_err(sqlx_error)?;
        row.map(|row| record_from_row(&row, 0)).transpose()
    }

    async fn purge_expired(&self, limit: usize) -> Result<u64, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let done = self
            .query(&self.inner.table.statements.purge)
            .bind(limit)
            .execute(&self.inner.pool)
            .await
            .map_err(sqlx_error)?;
        Ok(done.rows_affected())
    }

    /// Unless turned off with
    /// [`SqlxPostgresStoreBuilder::transactions`](super::SqlxPostgresStoreBuilder::transactions):
    /// a handler's writes and its stored response commit in one sqlx transaction (see
    /// [`SqlxTransaction`](super::SqlxTransaction)).
    fn transactional(&self) -> Option<&dyn TransactionalStore> {
        if self.inner.transactions {
            Some(self)
        } else {
            None
        }
    }
}
