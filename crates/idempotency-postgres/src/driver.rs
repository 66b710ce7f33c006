//! What the store needs of a PostgreSQL driver: run one of its statements on a pooled
//! connection, open a transaction with a statement, finish one with a statement and `COMMIT`.
//! The store's operations and its transactions are written once over this
//! ([`crate::primitives`], [`crate::open_transaction`]); `tokio_driver/` (tokio-postgres and
//! deadpool) and `sqlx_driver/` implement it. Nothing here depends on the modules above it.
//!
//! [`Driver`] is the public, sealed name of a driver (`PostgresStore<D: Driver>`); what a
//! driver does is [`DriverOps`], which only this crate can name or implement.

use crate::record::{RecordColumns, corrupt_field};
use crate::schema::Sql;
use crate::sentinel::Sentinel;
use async_trait::async_trait;
use idempotency_core::StoreError;
use idempotency_core::store::{LookupAnswered, Record};

/// SQLSTATE of a division by zero: the store's statements divide by zero to abort a
/// transaction whose completion is refused.
pub(crate) const DIVISION_BY_ZERO: &str = "22012";
/// SQLSTATE of a unique violation: the one-transaction mode's insert refused.
pub(crate) const UNIQUE_VIOLATION: &str = "23505";

/// A parameter of one of the store's statements, as every driver binds it.
#[derive(Clone, Copy, Debug)]
pub enum Param<'a> {
    /// `text`
    Text(&'a str),
    /// `bytea`
    Bytes(&'a [u8]),
    /// `uuid`
    Uuid(uuid::Uuid),
    /// `int4`
    Int4(i32),
    /// `int8`
    Int8(i64),
    /// `float8`
    Float8(f64),
}

/// A [`Param`] that owns its value: what a statement sent in the background keeps.
#[derive(Clone, Debug)]
pub(crate) enum OwnedParam {
    Text(String),
    Bytes(Vec<u8>),
    Uuid(uuid::Uuid),
    Int4(i32),
    Int8(i64),
    Float8(f64),
}

impl OwnedParam {
    /// `params`, owned.
    pub(crate) fn all(params: &[Param<'_>]) -> Vec<OwnedParam> {
        params
            .iter()
            .map(|param| match *param {
                Param::Text(v) => OwnedParam::Text(v.to_owned()),
                Param::Bytes(v) => OwnedParam::Bytes(v.to_vec()),
                Param::Uuid(v) => OwnedParam::Uuid(v),
                Param::Int4(v) => OwnedParam::Int4(v),
                Param::Int8(v) => OwnedParam::Int8(v),
                Param::Float8(v) => OwnedParam::Float8(v),
            })
            .collect()
    }

    /// The parameter, borrowed.
    pub(crate) fn as_param(&self) -> Param<'_> {
        match self {
            OwnedParam::Text(v) => Param::Text(v),
            OwnedParam::Bytes(v) => Param::Bytes(v),
            OwnedParam::Uuid(v) => Param::Uuid(*v),
            OwnedParam::Int4(v) => Param::Int4(*v),
            OwnedParam::Int8(v) => Param::Int8(*v),
            OwnedParam::Float8(v) => Param::Float8(*v),
        }
    }
}

/// A statement to send after another on the same connection if the caller stops waiting for
/// the first (see [`Driver::query_or_undo`]).
#[derive(Clone, Copy, Debug)]
pub struct Undo<'a> {
    pub(crate) sql: &'a Sql,
    pub(crate) params: &'a [Param<'a>],
}

impl Undo<'_> {
    /// The statement and its parameters, owned, to send in the background.
    pub(crate) fn owned(&self) -> (Sql, Vec<OwnedParam>) {
        (self.sql.clone(), OwnedParam::all(self.params))
    }
}

/// How a driver sends an [`Undo`] in the background on a connection `C` it owns.
pub(crate) type SendUndo<C> =
    fn(C, Sql, Vec<OwnedParam>) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// Holds the connection a statement was sent on while its caller waits for the answer. Dropped
/// before [`UndoOnDrop::answered`] (the caller gave up), it sends its [`Undo`] on that
/// connection in the background, so the server runs it after the statement, and the
/// connection goes back to the pool after both. Costs nothing until then.
pub(crate) struct UndoOnDrop<'a, C: Send + 'static> {
    connection: Option<C>,
    undo: Undo<'a>,
    send: SendUndo<C>,
}

impl<'a, C: Send + 'static> UndoOnDrop<'a, C> {
    pub(crate) fn new(connection: C, undo: Undo<'a>, send: SendUndo<C>) -> Self {
        UndoOnDrop {
            connection: Some(connection),
            undo,
            send,
        }
    }

    /// The connection.
    pub(crate) fn connection(&mut self) -> &mut C {
        match &mut self.connection {
            Some(connection) => connection,
            None => unreachable!("the connection is only taken when the guard ends"),
        }
    }

    /// The statement was answered: nothing to undo; the connection goes back to the pool.
    pub(crate) fn answered(mut self) {
        self.connection = None;
    }
}

impl<C: Send + 'static> Drop for UndoOnDrop<'_, C> {
    fn drop(&mut self) {
        let Some(connection) = self.connection.take() else {
            return;
        };
        let (sql, params) = self.undo.owned();
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn((self.send)(connection, sql, params));
            }
            // No runtime to send it on (only in a runtime's shutdown): the claim's lease runs
            // out on its own.
            Err(_) => tracing::warn!(
                "no Tokio runtime to release an unanswered claim on; it frees when its lease \
                 runs out"
            ),
        }
    }
}

/// A driver's failure: the store error it means, and the server's SQLSTATE when the server
/// answered with an error.
#[derive(Debug)]
pub struct DriverError {
    /// The server's SQLSTATE, if the server answered.
    pub(crate) sqlstate: Option<String>,
    /// What the failure means to the store.
    pub(crate) error: StoreError,
}

impl DriverError {
    /// Whether the server answered with SQLSTATE `code`.
    pub(crate) fn is(&self, code: &str) -> bool {
        self.sqlstate.as_deref() == Some(code)
    }
}

impl From<DriverError> for StoreError {
    fn from(e: DriverError) -> Self {
        e.error
    }
}

/// Reads column `i` of a driver's row as a `T`, for every `T` the driver decodes: each driver
/// implements it once, generically over its own decoding trait, and [`DriverRow`] names the
/// types the store reads. `Err(())` when the column is not a `T` (the caller names what it
/// expected).
pub trait ColumnRead<'r, T> {
    /// Column `i` as a `T`.
    fn read(&'r self, i: usize) -> Result<T, ()>;
}

/// A row as the store reads it: the four column types of its statements, read through the
/// driver's [`ColumnRead`].
pub trait DriverRow:
    Send
    + Sync
    + for<'r> ColumnRead<'r, Option<bool>>
    + for<'r> ColumnRead<'r, Option<&'r [u8]>>
    + for<'r> ColumnRead<'r, i64>
    + for<'r> ColumnRead<'r, f64>
{
    /// A `bool` column (`None` for NULL).
    fn opt_bool(&self, i: usize) -> Result<Option<bool>, StoreError> {
        column(
            ColumnRead::<Option<bool>>::read(self, i),
            "a boolean column",
        )
    }
    /// A `bytea` column (`None` for NULL).
    fn opt_bytes<'r>(&'r self, i: usize) -> Result<Option<&'r [u8]>, StoreError> {
        column(
            <Self as ColumnRead<'r, Option<&'r [u8]>>>::read(self, i),
            "a bytea column",
        )
    }
    /// An `int8` column.
    fn int8(&self, i: usize) -> Result<i64, StoreError> {
        column(ColumnRead::<i64>::read(self, i), "a bigint column")
    }
    /// A `float8` column.
    fn float8(&self, i: usize) -> Result<f64, StoreError> {
        column(
            ColumnRead::<f64>::read(self, i),
            "a double precision column",
        )
    }

    /// A non-NULL `bool` column.
    fn bool(&self, i: usize) -> Result<bool, StoreError> {
        self.opt_bool(i)?
            .ok_or_else(|| corrupt_field("a boolean column is NULL"))
    }
}

/// Every row a driver can read the four column types from is a [`DriverRow`].
impl<R> DriverRow for R where
    R: Send
        + Sync
        + for<'r> ColumnRead<'r, Option<bool>>
        + for<'r> ColumnRead<'r, Option<&'r [u8]>>
        + for<'r> ColumnRead<'r, i64>
        + for<'r> ColumnRead<'r, f64>
{
}

/// A column read as its type, or the corrupt-record error that names what it should be.
pub(crate) fn column<T, E>(read: Result<T, E>, what: &'static str) -> Result<T, StoreError> {
    read.map_err(|_| corrupt_field(what))
}

/// The record in `row`'s columns from `offset` on (the statements' `RECORD_COLUMNS`).
pub(crate) fn record_from_row<R: DriverRow>(row: &R, offset: usize) -> Result<Record, StoreError> {
    RecordColumns {
        request_hash: row
            .opt_bytes(offset)?
            .ok_or_else(|| corrupt_field("request_hash"))?,
        in_flight: row.bool(offset + 1)?,
        remaining_ms: row.int8(offset + 2)?,
        response: row.opt_bytes(offset + 3)?.map(<[u8]>::to_vec),
    }
    .into_record()
}

/// The rows of a statement sent ahead, still on their way ([`Driver::begin_queued`]); a
/// dropped sender (the task that read them ended without an answer) reads as a lost
/// connection.
pub(crate) type PendingRows<R> = tokio::sync::oneshot::Receiver<Result<Vec<R>, DriverError>>;

/// A PostgreSQL driver under the store: `PostgresStore<D: Driver>`. Sealed: the drivers are
/// this crate's ([`TokioPostgres`](crate::TokioPostgres) with the feature `tokio-postgres`,
/// [`Sqlx`](crate::Sqlx) with `sqlx`).
pub trait Driver: DriverOps {}

/// What a driver does for the store. Public in name only: it lives in a private module, so no
/// other crate can name it, and so none can implement [`Driver`].
#[async_trait]
pub trait DriverOps: Send + Sync + 'static {
    /// What the store's builder takes for this driver only (a URL and pool settings, or a
    /// pool).
    type Options: Send;
    /// A row of a result.
    type Row: DriverRow + 'static;
    /// A connection inside a transaction the store opened. Dropped before it ended, it rolls
    /// back before its connection is used again.
    type Tx: Send + Sync + 'static;

    /// Runs `sql` on a pooled connection (one round trip once prepared there).
    async fn query(&self, sql: &Sql, params: &[Param<'_>]) -> Result<Vec<Self::Row>, DriverError>;

    /// Runs `sql` on a pooled connection like [`Driver::query`]; if the call is dropped before
    /// its answer (the engine's timeout), sends `undo` on the same connection in the
    /// background. A connection's statements run in the order they were sent, so the server
    /// runs `undo` after `sql` has ended, whenever that is (a lock wait, a slow or frozen
    /// server): a claim whose caller gave up can never land after its release.
    async fn query_or_undo(
        &self,
        sql: &Sql,
        params: &[Param<'_>],
        undo: Undo<'_>,
    ) -> Result<Vec<Self::Row>, DriverError>;

    /// Runs `sql` like [`Driver::query`] if a connection can be had from the pool without
    /// waiting for one to be returned (an idle one, or a new one while the pool is below its
    /// size); `None` when every connection is in use. For a caller that holds a connection
    /// already: waiting for a second one could wait for itself.
    async fn query_without_waiting(
        &self,
        sql: &Sql,
        params: &[Param<'_>],
    ) -> Option<Result<Vec<Self::Row>, DriverError>>;

    /// Runs `sql` on a pooled connection; the number of rows it changed.
    async fn execute(&self, sql: &Sql, params: &[Param<'_>]) -> Result<u64, DriverError>;

    /// Begins a transaction on a pooled connection and runs `sql` first in it (pipelined with
    /// `BEGIN` where the driver can: one round trip).
    async fn begin_with(
        &self,
        sql: &Sql,
        params: &[Param<'_>],
    ) -> Result<(Self::Tx, Vec<Self::Row>), DriverError>;

    /// Whether [`Driver::begin_queued`] hands the transaction out before the server answered
    /// (else the store does not speculate on this driver).
    fn queues_statements(&self) -> bool {
        false
    }

    /// Begins a transaction on a pooled connection with `sql` first in it, without waiting
    /// for either: both are on their way to the server when this returns, so statements sent
    /// on the transaction afterwards run after them, in the same round trip. The statement's
    /// rows come through the returned future, and `answered` is told when they came. By
    /// default, [`Driver::begin_with`], its rows handed over already answered.
    async fn begin_queued(
        &self,
        sql: &Sql,
        params: &[Param<'_>],
        answered: LookupAnswered,
    ) -> Result<(Self::Tx, PendingRows<Self::Row>), DriverError> {
        let (tx, rows) = self.begin_with(sql, params).await?;
        answered.answered();
        let (answer, pending) = tokio::sync::oneshot::channel();
        // The receiver is right here.
        let _ = answer.send(Ok(rows));
        Ok((tx, pending))
    }

    /// Runs `sql` in `tx`, then `COMMIT` (pipelined where the driver can: one round trip). A
    /// failed statement aborts the transaction, so nothing commits. The statement's result
    /// (the rows it wrote, or returned, as its command tag counts them; its rows are not
    /// read), then the commit's.
    async fn commit_with(
        &self,
        tx: Self::Tx,
        sql: &Sql,
        params: &[Param<'_>],
    ) -> (Result<u64, DriverError>, Result<(), DriverError>);

    /// Rolls `tx` back and returns its connection to the pool (or closes it when it cannot).
    async fn rollback(&self, tx: Self::Tx) -> Result<(), DriverError>;

    /// Rolls `tx` back, then runs `sql` on the same connection (pipelined where the driver
    /// can: one round trip, and no second connection from the pool, which may be held by the
    /// very transactions this one waits behind). The rollback's result, then the statement's.
    /// By default, [`Driver::rollback`] and then [`Driver::query`] on a pooled connection.
    async fn rollback_and_query(
        &self,
        tx: Self::Tx,
        sql: &Sql,
        params: &[Param<'_>],
    ) -> (Result<(), DriverError>, Result<Vec<Self::Row>, DriverError>) {
        let rolled_back = self.rollback(tx).await;
        (rolled_back, self.query(sql, params).await)
    }

    /// What the pool holds now, from memory.
    fn pool_status(&self) -> idempotency_core::store::PoolStatus;

    /// Checks the table's state sentinel on a pooled connection (see
    /// `PostgresStore::check_state`).
    async fn check_state(&self, watch: &Sentinel) -> Result<bool, StoreError>;

    /// Whether [`DriverOps::listen`] can open a session that hears notices: not behind a
    /// transaction-mode pooler (which does not carry `LISTEN`), as far as the driver knows.
    fn can_listen(&self) -> bool {
        true
    }

    /// Opens a session of the driver's own (not a pooled connection: a listening session is
    /// held for as long as the store lives) that listens on `channel`, a plain identifier, and
    /// sends each notice's payload to `notices` until `stop` is cancelled or the session ends,
    /// when `notices` is dropped. Returns once `LISTEN` is in force: a notice committed after
    /// that is heard. `Ok(false)` when the driver cannot open such a session.
    async fn listen(
        &self,
        channel: &str,
        notices: tokio::sync::mpsc::UnboundedSender<String>,
        stop: tokio_util::sync::CancellationToken,
    ) -> Result<bool, DriverError>;
}
