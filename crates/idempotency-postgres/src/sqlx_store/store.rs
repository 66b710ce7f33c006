//! The sqlx driver: the store on an application's pool, its accessors, and the driver interface
//! the store's primitives and transactions are written over (the same statements as the
//! tokio-postgres driver's).

use super::session::{SqlxSession, sqlx_error};
use crate::driver::{Driver, DriverError, OwnedParam, Param, Undo, UndoOnDrop, driver_row};
use crate::error::BACKEND;
use crate::error::{PostgresStoreError, setup_error};
use crate::primitives::{StoreCore, store_on_core};
use crate::schema::Sql;
use crate::status::{self, RecordTimes, StoreStatus};
use crate::{MigrationReport, migrate};
use async_trait::async_trait;
use idempotency_core::{IdempotencyKey, Scope, StoreError};
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::{PgPool, Postgres, Row};
use std::sync::Arc;

/// The driver: the application's pool.
pub(crate) struct SqlxDriver {
    pub(crate) pool: PgPool,
}

/// What every clone of a store shares.
pub(crate) type SqlxInner = StoreCore<SqlxDriver>;

/// The PostgreSQL store on an application's [`sqlx::PgPool`] (feature `sqlx`): the table,
/// SQL, migrations, writer check and lost-state sentinel of
/// `PostgresStore`, on sqlx instead of tokio-postgres and deadpool.
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

impl SqlxPostgresStore {
    /// The pool the store uses.
    pub fn pool(&self) -> &PgPool {
        &self.inner.driver.pool
    }

    /// Creates the table and index if missing and schedules the pg_cron purge job where pg_cron
    /// is installed: the migrations of `PostgresStore::migrate`,
    /// by the same code, in one sqlx transaction under the same advisory lock.
    pub async fn migrate(&self) -> Result<MigrationReport, PostgresStoreError> {
        let mut tx = self.inner.driver.pool.begin().await?;
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
        let mut connection = self.inner.driver.pool.acquire().await.map_err(sqlx_error)?;
        self.inner
            .table
            .watch
            .check(&mut SqlxSession(&mut connection))
            .await
            .map_err(setup_error)
    }

    /// Reads the state of the table, its migrations and its pg_cron purge job, as
    /// `PostgresStore::status` does, by the same code. Reads only.
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

store_on_core!(SqlxPostgresStore);

/// `sql` with `params` bound, as a sqlx query: prepared once per connection and cached there
/// (sqlx's default), so after the first use, one round trip.
fn bound<'q>(sql: &'q Sql, params: &[Param<'q>]) -> sqlx::query::Query<'q, Postgres, PgArguments> {
    params
        .iter()
        .fold(sqlx::query(&sql.text), |query, param| match *param {
            Param::Text(v) => query.bind(v),
            Param::Bytes(v) => query.bind(v),
            Param::Uuid(v) => query.bind(v),
            Param::Int4(v) => query.bind(v),
            Param::Int8(v) => query.bind(v),
            Param::Float8(v) => query.bind(v),
        })
}

fn driver_error(e: sqlx::Error) -> DriverError {
    let sqlstate = match &e {
        sqlx::Error::Database(db) => db.code().map(|code| code.into_owned()),
        _ => None,
    };
    DriverError {
        sqlstate,
        error: sqlx_error(e),
    }
}

driver_row!(PgRow);

/// Sends an [`Undo`] on `connection`; sqlx first reads what the statement before it answers.
/// A connection that fails it is closed rather than pooled.
fn send_undo(
    mut connection: PoolConnection<Postgres>,
    sql: Sql,
    params: Vec<OwnedParam>,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
    Box::pin(async move {
        let borrowed: Vec<Param<'_>> = params.iter().map(OwnedParam::as_param).collect();
        if let Err(error) = bound(&sql, &borrowed).execute(&mut *connection).await {
            tracing::warn!(
                backend = BACKEND,
                error = %error,
                "could not release an unanswered claim; it frees when its lease runs out"
            );
            connection.close_on_drop();
        }
    })
}

#[async_trait]
impl Driver for SqlxDriver {
    type Row = PgRow;
    /// Dropped before it ends, a sqlx transaction is rolled back before its connection is used
    /// again.
    type Tx = sqlx::Transaction<'static, Postgres>;

    async fn query(&self, sql: &Sql, params: &[Param<'_>]) -> Result<Vec<PgRow>, DriverError> {
        bound(sql, params)
            .fetch_all(&self.pool)
            .await
            .map_err(driver_error)
    }

    async fn query_or_undo(
        &self,
        sql: &Sql,
        params: &[Param<'_>],
        undo: Undo<'_>,
    ) -> Result<Vec<PgRow>, DriverError> {
        let connection = self.pool.acquire().await.map_err(driver_error)?;
        let mut pending = UndoOnDrop::new(connection, undo, send_undo);
        let result = bound(sql, params)
            .fetch_all(&mut **pending.connection())
            .await
            .map_err(driver_error);
        pending.answered();
        result
    }

    async fn execute(&self, sql: &Sql, params: &[Param<'_>]) -> Result<u64, DriverError> {
        let done = bound(sql, params)
            .execute(&self.pool)
            .await
            .map_err(driver_error)?;
        Ok(done.rows_affected())
    }

    /// Two round trips: sqlx sends `BEGIN` on its own.
    async fn begin_with(
        &self,
        sql: &Sql,
        params: &[Param<'_>],
    ) -> Result<(Self::Tx, Vec<PgRow>), DriverError> {
        let mut tx = self.pool.begin().await.map_err(driver_error)?;
        let rows = bound(sql, params)
            .fetch_all(&mut *tx)
            .await
            .map_err(driver_error)?;
        Ok((tx, rows))
    }

    /// Two round trips: sqlx sends `COMMIT` on its own. The `COMMIT` runs in a task of its own,
    /// so a caller that stops waiting (the engine's timeout) never drops sqlx's commit future
    /// halfway, which could leave its connection out of the pool; the commit then ends on the
    /// server's time and the connection goes back.
    async fn commit_with(
        &self,
        mut tx: Self::Tx,
        sql: &Sql,
        params: &[Param<'_>],
    ) -> (Result<Vec<PgRow>, DriverError>, Result<(), DriverError>) {
        match bound(sql, params).fetch_all(&mut *tx).await {
            Ok(rows) => {
                let committed = match tokio::spawn(tx.commit()).await {
                    Ok(committed) => committed.map_err(driver_error),
                    Err(join) => Err(DriverError {
                        sqlstate: None,
                        error: StoreError::from_failure(BACKEND, true, join),
                    }),
                };
                (Ok(rows), committed)
            }
            Err(error) => {
                if let Err(rollback) = tx.rollback().await {
                    // The connection is gone, and its transaction with it.
                    tracing::debug!(error = %rollback, "could not roll back a refused statement");
                }
                (Err(driver_error(error)), Ok(()))
            }
        }
    }

    async fn rollback(&self, tx: Self::Tx) -> Result<(), DriverError> {
        tx.rollback().await.map_err(driver_error)
    }
}
