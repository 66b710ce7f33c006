//! The tokio-postgres and deadpool driver: the pool, how statements are sent on it (prepared,
//! or unnamed behind a transaction pooler; `BEGIN` and `COMMIT` pipelined), and the connection
//! a request's transaction holds.

use super::driver_error::driver_error;
use super::options::TokioOptions;
use super::session::TokioSession;
use super::statement::Ready;
use super::transaction::{TokioTx, close};
use crate::driver::{
    ColumnRead, Driver, DriverError, DriverOps, OwnedParam, Param, PendingRows, Undo, UndoOnDrop,
};
use crate::error::{BACKEND, pool_error, setup_error};
use crate::schema::Sql;
use crate::sentinel::Sentinel;
use async_trait::async_trait;
use deadpool_postgres::{Object, Pool};
use idempotency_core::StoreError;
use idempotency_core::store::LookupAnswered;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

/// The tokio-postgres driver (feature `tokio-postgres`, on by default): `PostgresStore` is
/// `PostgresStore<TokioPostgres>`. The store's own deadpool pool, statements prepared once per
/// connection (or sent unnamed behind a transaction pooler), `BEGIN` and `COMMIT` pipelined
/// with the store's statements.
pub struct TokioPostgres {
    pub(crate) pool: Pool,
    /// Statements prepared once per connection; off, sent unnamed (for transaction poolers).
    /// Turned off by the driver itself when the server answers as a transaction pooler that
    /// does not keep prepared statements does (see [`TokioPostgres::lost_a_prepared_statement`]).
    pub(crate) prepared: Arc<AtomicBool>,
    /// The server-side bound of the sentinel's check (see `pool::setup_bound`).
    pub(crate) setup_bound: std::time::Duration,
    /// How the listening session connects: the pool's settings, when the store built the pool
    /// from a URL (an application's deadpool pool does not tell its settings).
    pub(crate) listen_target: Option<Arc<super::listen::ListenTarget>>,
}

impl std::fmt::Debug for TokioPostgres {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokioPostgres")
            .field("prepared_statements", &self.prepared())
            .finish_non_exhaustive()
    }
}

impl TokioPostgres {
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

/// [`TokioPostgres::lost_a_prepared_statement`] on the driver's flag `statements_prepared`
/// (for a task of its own).
pub(super) fn lost_a_prepared_statement(
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

/// A statement's parameters as tokio-postgres takes them, without allocating.
pub(super) fn sql_params<'a>(params: &'a [Param<'_>]) -> [&'a (dyn ToSql + Sync); MAX_PARAMS] {
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

impl<'r, T: tokio_postgres::types::FromSql<'r>> ColumnRead<'r, T> for Row {
    fn read(&'r self, i: usize) -> Result<T, ()> {
        self.try_get(i).map_err(drop)
    }
}

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

impl TokioPostgres {
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
    pub(super) async fn ready_before_begin<'a>(
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
    pub(super) async fn client(&self) -> Result<Object, DriverError> {
        self.pool.get().await.map_err(|e| DriverError {
            sqlstate: None,
            error: pool_error(e),
        })
    }
}

impl Driver for TokioPostgres {}

#[async_trait]
impl DriverOps for TokioPostgres {
    type Options = TokioOptions;
    type Row = Row;
    type Tx = TokioTx;

    /// A store built on an application's pool has no listening target; one told (or that
    /// found out) that a transaction-mode pooler is in front sends statements unnamed, and a
    /// `LISTEN` through such a pooler would be lent a server connection for one transaction and
    /// hear nothing after it.
    fn can_listen(&self) -> bool {
        self.listen_target.is_some() && self.prepared.load(std::sync::atomic::Ordering::Relaxed)
    }

    async fn listen(
        &self,
        channel: &str,
        notices: tokio::sync::mpsc::UnboundedSender<String>,
        stop: tokio_util::sync::CancellationToken,
    ) -> Result<bool, DriverError> {
        let Some(target) = self.listen_target.as_ref().filter(|_| self.can_listen()) else {
            return Ok(false);
        };
        target.listen(channel, notices, stop).await.map(|()| true)
    }

    async fn check_state(&self, watch: &Sentinel) -> Result<bool, StoreError> {
        let client = self.client().await.map_err(StoreError::from)?;
        watch
            .check_within(&mut TokioSession(&**client), self.setup_bound)
            .await
            .map_err(setup_error)
    }

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

    async fn query_without_waiting(
        &self,
        sql: &Sql,
        params: &[Param<'_>],
    ) -> Option<Result<Vec<Row>, DriverError>> {
        let mut timeouts = self.pool.timeouts();
        // Zero: deadpool tries for a permit without waiting.
        timeouts.wait = Some(std::time::Duration::ZERO);
        let client = match self.pool.timeout_get(&timeouts).await {
            Ok(client) => client,
            Err(deadpool_postgres::PoolError::Timeout(deadpool_postgres::TimeoutType::Wait)) => {
                return None;
            }
            Err(error) => {
                return Some(Err(DriverError {
                    sqlstate: None,
                    error: pool_error(error),
                }));
            }
        };
        Some(self.query_on(&client, sql, params).await)
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
    ) -> (Result<u64, DriverError>, Result<(), DriverError>) {
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
            ready.execute(&tx, &refs[..params.len()]),
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

    async fn rollback_and_query(
        &self,
        tx: TokioTx,
        sql: &Sql,
        params: &[Param<'_>],
    ) -> (Result<(), DriverError>, Result<Vec<Row>, DriverError>) {
        let Some(client) = tx.end() else {
            return (Ok(()), self.query(sql, params).await);
        };
        // Polled in this order, the ROLLBACK goes out first, and the statement (its one-time
        // prepare included) behind it on the same connection.
        let (rolled_back, rows) = tokio::join!(
            client.batch_execute("ROLLBACK"),
            self.query_on(&client, sql, params)
        );
        if rolled_back.is_err() {
            // Closed instead: that ends the transaction on the server.
            close(client);
        }
        (rolled_back.map_err(driver_error), rows)
    }

    fn pool_status(&self) -> idempotency_core::store::PoolStatus {
        let status = self.pool.status();
        idempotency_core::store::PoolStatus::new(
            status.max_size,
            status.size,
            status.available,
            Some(status.waiting),
        )
    }

    fn queues_statements(&self) -> bool {
        true
    }

    async fn begin_queued(
        &self,
        sql: &Sql,
        params: &[Param<'_>],
        answered: LookupAnswered,
    ) -> Result<(TokioTx, PendingRows<Row>), DriverError> {
        self.begin_queued_on_a_connection(sql, params, answered)
            .await
    }
}
