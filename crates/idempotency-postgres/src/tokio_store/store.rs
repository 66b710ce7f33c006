//! The tokio-postgres and deadpool driver: the store's pool, its accessors, and the driver
//! interface the store's primitives and transactions are written over.

use super::error::{pool_error, query_error};
use super::session::TokioSession;
use super::statement::Ready;
use crate::driver::{
    Driver, DriverError, OwnedParam, Param, PendingRows, Undo, UndoOnDrop, driver_row,
};
use crate::error::PostgresStoreError;
use crate::error::{BACKEND, setup_error};
use crate::primitives::{StoreCore, store_on_core};
use crate::schema::Sql;
use crate::status::{self, RecordTimes, StoreStatus};
use async_trait::async_trait;
use deadpool_postgres::{ClientWrapper, Object, Pool};
use idempotency_core::{IdempotencyKey, Scope, StoreError};
use std::future::Future as _;
use std::ops::Deref;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

/// The driver: the pool, and how statements are sent.
pub(crate) struct TokioDriver {
    pub(crate) pool: Pool,
    /// Statements prepared once per connection; off, sent unnamed (for transaction poolers).
    /// Turned off by the driver itself when the server answers as a transaction pooler that
    /// does not keep prepared statements does (see [`TokioDriver::lost_a_prepared_statement`]).
    pub(crate) prepared: Arc<AtomicBool>,
}

impl TokioDriver {
    fn prepared(&self) -> bool {
        self.prepared.load(Ordering::Relaxed)
    }

    /// Whether `error` says that a statement this connection prepared is not on the server
    /// connection that got it (`26000 prepared statement "s0" does not exist`), or that one of
    /// that name is there already (`42P05`): what a transaction-mode pooler without prepared
    /// statement support (PgBouncer before 1.21, or without `max_prepared_statements`) answers,
    /// since it hands each transaction to any server connection. The driver then sends every
    /// later statement unnamed, and says so once. The statement that failed never ran.
    /// `prepared`: whether the failed call sent a prepared statement (another request may
    /// have switched the driver since).
    fn lost_a_prepared_statement(&self, prepared: bool, error: &tokio_postgres::Error) -> bool {
        lost_a_prepared_statement(&self.prepared, prepared, error)
    }
}

/// [`TokioDriver::lost_a_prepared_statement`] on the driver's flag `statements_prepared`
/// (for a task of its own).
fn lost_a_prepared_statement(
    statements_prepared: &AtomicBool,
    prepared: bool,
    error: &tokio_postgres::Error,
) -> bool {
    use tokio_postgres::error::SqlState;
    let lost = prepared
        && error.code().is_some_and(|code| {
            *code == SqlState::INVALID_SQL_STATEMENT_NAME || *code == SqlState::DUPLICATE_PSTATEMENT
        });
    if lost && statements_prepared.swap(false, Ordering::Relaxed) {
        tracing::error!(
            error = %error,
            "the server lost a prepared statement: this looks like a transaction-mode pooler \
             (PgBouncer) that does not keep prepared statements; sending statements unnamed \
             from now on. Add prepared_statements=false to the store's URL (or call \
             prepared_statements(false)) to start that way"
        );
    }
    lost
}

/// What every clone of a store shares.
pub(crate) type Inner = StoreCore<TokioDriver>;

/// The PostgreSQL store. Cheap to clone; clones share the pool.
#[derive(Clone)]
pub struct PostgresStore {
    pub(crate) inner: Arc<Inner>,
}

impl PostgresStore {
    /// The pool the store uses.
    pub fn pool(&self) -> &Pool {
        &self.inner.driver.pool
    }

    /// Checks that the table still holds what it held: returns `true` (and logs an error and
    /// counts it in `idempotency_store_state_lost_total`) when the table was emptied since the
    /// last check, by crash recovery of an UNLOGGED table, a failover or a `TRUNCATE`. Pools built
    /// by the store run this on every new connection; call it periodically on a pool you passed
    /// in with [`PostgresStore::builder_from_pool`].
    pub async fn check_state(&self) -> Result<bool, StoreError> {
        let client = self.client().await?;
        self.inner
            .table
            .watch
            .check(&mut TokioSession(&**client))
            .await
            .map_err(setup_error)
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

    pub(crate) async fn client(&self) -> Result<deadpool_postgres::Object, StoreError> {
        self.inner.driver.pool.get().await.map_err(pool_error)
    }
}

store_on_core!(PostgresStore);

/// A statement's parameters as tokio-postgres takes them, without allocating.
fn sql_params<'a>(params: &'a [Param<'_>]) -> [&'a (dyn ToSql + Sync); MAX_PARAMS] {
    const NONE: Option<i32> = None;
    std::array::from_fn(|i| match params.get(i) {
        Some(Param::Text(v)) => v as &(dyn ToSql + Sync),
        Some(Param::Bytes(v)) => v,
        Some(Param::Uuid(v)) => v,
        Some(Param::Int4(v)) => v,
        Some(Param::Int8(v)) => v,
        Some(Param::Float8(v)) => v,
        None => &NONE,
    })
}

/// The most parameters a store statement takes.
const MAX_PARAMS: usize = 8;

fn driver_error(e: tokio_postgres::Error) -> DriverError {
    DriverError {
        sqlstate: e.code().map(|code| code.code().to_owned()),
        error: query_error(e),
    }
}

/// A connection inside a transaction the store opened. Dropped before the transaction ended
/// (a panic, a cancelled request, a duplicate's answer), it is rolled back in the background
/// before it returns to the pool, or closed. Shared (an `Arc`) with the task that reads a
/// queued statement's answer ([`Driver::begin_queued`]); the connection returns to the pool
/// when the last holder lets go.
pub(crate) struct TokioTx(Option<Arc<Object>>);

impl Deref for TokioTx {
    type Target = ClientWrapper;

    fn deref(&self) -> &ClientWrapper {
        match &self.0 {
            Some(client) => client,
            None => unreachable!("the connection is only taken when the transaction ends"),
        }
    }
}

impl TokioTx {
    fn new(client: Object) -> Self {
        TokioTx(Some(Arc::new(client)))
    }

    /// The connection, which goes back to the pool when dropped.
    fn end(mut self) -> Option<Arc<Object>> {
        self.0.take()
    }
}

/// Closes `client` instead of pooling it (its session is in an unknown state), unless a task
/// still reads from it: that task's error ends it the same way.
fn close(client: Arc<Object>) {
    if let Ok(client) = Arc::try_unwrap(client) {
        drop(Object::take(client));
    }
}

impl Drop for TokioTx {
    fn drop(&mut self) {
        let Some(client) = self.0.take() else {
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    if client.batch_execute("ROLLBACK").await.is_err() {
                        close(client);
                    }
                });
            }
            Err(_) => close(client),
        }
    }
}

driver_row!(Row);

/// Sends an [`Undo`] on `client` (unnamed, so it needs nothing prepared on the connection);
/// a connection that fails it is closed rather than pooled.
fn send_undo(
    client: Object,
    sql: Sql,
    params: Vec<OwnedParam>,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
    Box::pin(async move {
        let params: Vec<Param<'_>> = params.iter().map(OwnedParam::as_param).collect();
        let refs = sql_params(&params);
        if let Err(error) = sql.execute(&client, &refs[..params.len()], false).await {
            tracing::warn!(
                backend = BACKEND,
                error = %error,
                "could not release an unanswered claim; it frees when its lease runs out"
            );
            drop(Object::take(client));
        }
    })
}

impl TokioDriver {
    /// Runs `sql` on `client`.
    async fn query_on(
        &self,
        client: &Object,
        sql: &Sql,
        params: &[Param<'_>],
    ) -> Result<Vec<Row>, DriverError> {
        let refs = sql_params(params);
        let prepared = self.prepared();
        match sql.query(client, &refs[..params.len()], prepared).await {
            // The statement never ran: send it again, unnamed.
            Err(error) if self.lost_a_prepared_statement(prepared, &error) => {
                sql.query(client, &refs[..params.len()], false).await
            }
            result => result,
        }
        .map_err(driver_error)
    }

    /// `sql` made ready on `client` (prepared there, unless statements go unnamed) before a
    /// pipeline that must send `BEGIN` first; whether it was prepared.
    async fn ready_before_begin<'a>(
        &self,
        client: &Object,
        sql: &'a Sql,
    ) -> Result<(Ready<'a>, bool), DriverError> {
        let prepared = self.prepared();
        let ready = match sql.ready(client, prepared).await {
            Err(error) if self.lost_a_prepared_statement(prepared, &error) => {
                sql.ready(client, false).await
            }
            result => result,
        }
        .map_err(driver_error)?;
        Ok((ready, prepared))
    }

    /// A pooled connection.
    async fn client(&self) -> Result<Object, DriverError> {
        self.pool.get().await.map_err(|e| DriverError {
            sqlstate: None,
            error: pool_error(e),
        })
    }
}

#[async_trait]
impl Driver for TokioDriver {
    type Row = Row;
    type Tx = TokioTx;

    async fn query(&self, sql: &Sql, params: &[Param<'_>]) -> Result<Vec<Row>, DriverError> {
        let client = self.client().await?;
        self.query_on(&client, sql, params).await
    }

    async fn query_or_undo(
        &self,
        sql: &Sql,
        params: &[Param<'_>],
        undo: Undo<'_>,
    ) -> Result<Vec<Row>, DriverError> {
        let mut pending = UndoOnDrop::new(self.client().await?, undo, send_undo);
        let result = self.query_on(pending.connection(), sql, params).await;
        pending.answered();
        result
    }

    async fn execute(&self, sql: &Sql, params: &[Param<'_>]) -> Result<u64, DriverError> {
        let client = self.client().await?;
        let refs = sql_params(params);
        let prepared = self.prepared();
        match sql.execute(&client, &refs[..params.len()], prepared).await {
            Err(error) if self.lost_a_prepared_statement(prepared, &error) => {
                sql.execute(&client, &refs[..params.len()], false).await
            }
            result => result,
        }
        .map_err(driver_error)
    }

    async fn begin_with(
        &self,
        sql: &Sql,
        params: &[Param<'_>],
    ) -> Result<(TokioTx, Vec<Row>), DriverError> {
        let client = self.client().await?;
        let (ready, prepared) = self.ready_before_begin(&client, sql).await?;
        // From here on, dropping `tx` (an error below, this future cancelled) rolls the
        // connection back before it returns to the pool.
        let tx = TokioTx::new(client);
        let refs = sql_params(params);
        // One round trip: BEGIN and the statement are pipelined.
        let (begun, rows) = tokio::join!(
            tx.batch_execute("BEGIN"),
            ready.query(&tx, &refs[..params.len()])
        );
        begun.map_err(driver_error)?;
        // A lost prepared statement aborts this transaction (its error goes up); the next
        // request's statements go out unnamed.
        let rows = rows
            .inspect_err(|error| {
                self.lost_a_prepared_statement(prepared, error);
            })
            .map_err(driver_error)?;
        Ok((tx, rows))
    }

    async fn commit_with(
        &self,
        tx: TokioTx,
        sql: &Sql,
        params: &[Param<'_>],
    ) -> (Result<Vec<Row>, DriverError>, Result<(), DriverError>) {
        // Ready (prepared) before the pipeline: the statement must go out before the COMMIT.
        let prepared = self.prepared();
        let ready = match sql.ready(&tx, prepared).await {
            Ok(ready) => ready,
            Err(e) => {
                self.lost_a_prepared_statement(prepared, &e);
                return (Err(driver_error(e)), Ok(()));
            }
        };
        let refs = sql_params(params);
        // One round trip: the statement and the COMMIT are pipelined. A failed statement
        // aborts the transaction, so the COMMIT behind it rolls back.
        let (rows, committed) = tokio::join!(
            ready.query(&tx, &refs[..params.len()]),
            tx.batch_execute("COMMIT")
        );
        // The transaction ended either way: the connection goes back to the pool as it is.
        drop(tx.end());
        let rows = rows.inspect_err(|error| {
            self.lost_a_prepared_statement(prepared, error);
        });
        (rows.map_err(driver_error), committed.map_err(driver_error))
    }

    async fn rollback(&self, tx: TokioTx) -> Result<(), DriverError> {
        let Some(client) = tx.end() else {
            return Ok(());
        };
        match client.batch_execute("ROLLBACK").await {
            Ok(()) => Ok(()),
            Err(error) => {
                // Closed instead: that ends the transaction on the server.
                close(client);
                Err(driver_error(error))
            }
        }
    }

    fn queues_statements(&self) -> bool {
        true
    }

    async fn begin_queued(
        &self,
        sql: &Sql,
        params: &[Param<'_>],
    ) -> Result<(TokioTx, PendingRows<Row>), DriverError> {
        let client = self.client().await?;
        let (ready, prepared) = self.ready_before_begin(&client, sql).await?;
        let ready = ready.into_owned();
        let tx = TokioTx::new(client);
        let Some(shared) = tx.0.clone() else {
            unreachable!("a new transaction holds its connection")
        };
        let params = OwnedParam::all(params);
        let statements_prepared = Arc::clone(&self.prepared);
        let reader = async move {
            let params: Vec<Param<'_>> = params.iter().map(OwnedParam::as_param).collect();
            let refs = sql_params(&params);
            let (begun, rows) = tokio::join!(
                shared.batch_execute("BEGIN"),
                ready.query(&shared, &refs[..params.len()])
            );
            begun.map_err(driver_error)?;
            // As in `begin_with`: the next request's statements go out unnamed.
            rows.inspect_err(|error| {
                lost_a_prepared_statement(&statements_prepared, prepared, error);
            })
            .map_err(driver_error)
        };
        let (answer, pending) = tokio::sync::oneshot::channel();
        let mut reader = Box::pin(async move {
            let _ = answer.send(reader.await);
        });
        // Polled once here, `BEGIN` and the statement are sent (each future sends its request
        // when first polled, in `join!`'s order) before the caller can send anything on the
        // transaction; the task then reads their answers.
        let mut context = std::task::Context::from_waker(std::task::Waker::noop());
        if reader.as_mut().poll(&mut context).is_pending() {
            tokio::spawn(reader);
        }
        Ok((tx, pending))
    }
}

impl PostgresStore {
    /// Creates the table and index if missing, and schedules the pg_cron purge job where pg_cron
    /// is installed. Idempotent; runs in one transaction under an advisory lock, so several
    /// instances starting at once do not collide. Fails if the existing table's persistence
    /// differs from the configured mode.
    pub async fn migrate(&self) -> Result<crate::MigrationReport, crate::PostgresStoreError> {
        let mut client = self.inner.driver.pool.get().await?;
        let tx = client.transaction().await?;
        let report = crate::migrate::migrate_in(&mut TokioSession(&*tx), &self.inner.table).await?;
        tx.commit().await?;
        Ok(report)
    }
}
