//! A request's transaction, written once over a [`Driver`]: what every claim mode shares (the
//! connection, the key, the transaction's id, its rollback, the server's word on a transaction
//! the handler ended), the one dispatch on the mode's [`Hold`], the handler's
//! [`PostgresTransaction<D>`](PostgresTransaction), and the store's `TransactionalStore`
//! (`open_transaction/transactional_store.rs`). Each claim mode's begin, completion and discard
//! are in a file of its own: `open_transaction/lease.rs`, `open_transaction/one_transaction.rs`,
//! `open_transaction/speculative.rs`. Each driver's `Deref` to its connection is in
//! `tokio_store.rs` / `sqlx_store.rs`.

use crate::driver::{Driver, DriverError, DriverRow, Param, PendingRows};
use crate::error::BACKEND;
use crate::flavour::defaults_to_tokio_postgres;
use crate::primitives::StoreCore;
use idempotency_core::store::Settled;
use idempotency_core::store::{
    CommitOutcome, CorruptRecord, DiscardOutcome, LookupSignal, StoreTransaction,
};
use idempotency_core::{IdempotencyKey, LeaseToken, Scope, StoreError, StoredResponse};
use std::any::Any;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

mod lease;
mod one_transaction;
mod speculative;
mod transactional_store;

use one_transaction::AtCommit;
use speculative::unsettled;

/// A transaction the store opened for one request.
pub(crate) struct OpenTransaction<D: Driver> {
    /// The connection inside the transaction; taken when the transaction ends.
    tx: Option<D::Tx>,
    core: Arc<StoreCore<D>>,
    scope: Scope,
    key: IdempotencyKey,
    token: LeaseToken,
    /// The transaction's id, read at `BEGIN`: if the handler ends the transaction itself, the
    /// server says from it whether it committed.
    xid: i64,
    /// How it holds its key, per claim mode: what its completion writes.
    hold: Hold<D::Row>,
}

/// How a request's transaction holds its key, one variant per claim mode, which says what its
/// completion writes.
enum Hold<R> {
    /// The lease mode: the claim's record holds the key; the completion updates it.
    Claim,
    /// The one-transaction mode, and the speculative mode once its lookup is settled: the key's
    /// lock; the completion inserts the record.
    Lock(AtCommit),
    /// The speculative mode until its lookup is settled: the lookup queued behind `BEGIN`
    /// (its answer sets the transaction's id and what `at_commit` reads), and whether that
    /// answer came.
    PendingLookup {
        at_commit: AtCommit,
        lookup: PendingRows<R>,
        signal: LookupSignal,
    },
}

impl<R> Hold<R> {
    /// A pending lookup left unread (the transaction ends without it): the key's lock.
    fn forget_lookup(&mut self) {
        if let Hold::PendingLookup { at_commit, .. } = self {
            *self = Hold::Lock(*at_commit);
        }
    }
}

impl<D: Driver> OpenTransaction<D> {
    /// A transaction open on `tx` for `(scope, key)` and `token`, in the lease mode until
    /// `hold` is set.
    fn new(
        core: &Arc<StoreCore<D>>,
        tx: D::Tx,
        scope: &Scope,
        key: &IdempotencyKey,
        token: LeaseToken,
        xid: i64,
    ) -> Self {
        OpenTransaction {
            tx: Some(tx),
            core: Arc::clone(core),
            scope: scope.clone(),
            key: key.clone(),
            token,
            xid,
            hold: Hold::Claim,
        }
    }

    /// The driver's connection inside the transaction.
    pub(crate) fn handle(&self) -> &D::Tx {
        match &self.tx {
            Some(tx) => tx,
            None => unreachable!("the connection is only taken when the transaction is consumed"),
        }
    }

    /// The driver's connection inside the transaction, mutably (sqlx's executors take it so).
    #[cfg(feature = "sqlx")]
    pub(crate) fn handle_mut(&mut self) -> &mut D::Tx {
        match &mut self.tx {
            Some(tx) => tx,
            None => unreachable!("the connection is only taken when the transaction is consumed"),
        }
    }

    /// The table's qualified name (for `Debug`).
    pub(crate) fn table(&self) -> String {
        self.core.table.name.qualified()
    }

    /// Whether the transaction is still open (for `Debug`).
    pub(crate) fn is_open(&self) -> bool {
        self.tx.is_some()
    }

    fn take(&mut self) -> Result<D::Tx, StoreError> {
        self.tx.take().ok_or_else(|| {
            StoreError::corrupt(
                BACKEND,
                CorruptRecord::Field("the transaction was already consumed"),
            )
        })
    }

    /// Rolls the transaction back.
    pub(crate) async fn rollback(&mut self) -> Result<(), StoreError> {
        self.hold.forget_lookup();
        match self.tx.take() {
            Some(tx) => Ok(self.core.driver.rollback(tx).await?),
            None => Ok(()),
        }
    }

    /// Stores `response` in the transaction and commits it (see
    /// [`StoreTransaction::complete_and_commit`](idempotency_core::store::StoreTransaction::complete_and_commit)).
    pub(crate) async fn complete_and_commit(
        &mut self,
        response: &StoredResponse,
        retention: Duration,
    ) -> Result<CommitOutcome, StoreError> {
        // A speculative transaction the engine did not settle first.
        match self.settle().await? {
            Settled::Proceed => {}
            Settled::Existing(record) => return Ok(CommitOutcome::Superseded(record)),
            // Busy: rolled back, none of the writes stand.
            _ => return Ok(CommitOutcome::LeaseLost),
        }
        match self.hold {
            Hold::Lock(at_commit) => self.insert_and_commit(at_commit, response, retention).await,
            Hold::Claim => self.update_and_commit(response, retention).await,
            Hold::PendingLookup { .. } => Err(unsettled()),
        }
    }

    /// Rolls the handler's writes back and stores `response` without them (see
    /// [`StoreTransaction::discard_writes_and_store`]): in the one-transaction modes before the
    /// transaction lets the key go; in the lease mode the claim's record holds the key, and the
    /// engine completes it after the rollback.
    pub(crate) async fn discard_writes_and_store(
        &mut self,
        response: &StoredResponse,
        retention: Duration,
    ) -> Result<DiscardOutcome, StoreError> {
        // A speculative transaction the engine did not settle first.
        match self.settle().await? {
            Settled::Proceed => {}
            Settled::Existing(record) => return Ok(DiscardOutcome::Superseded(record)),
            // Busy: rolled back, a duplicate holds the key; the engine's claim finds it.
            _ => return Ok(DiscardOutcome::RolledBack),
        }
        match self.hold {
            Hold::Lock(at_commit) => self.discard_and_store(at_commit, response, retention).await,
            Hold::PendingLookup { .. } => Err(unsettled()),
            Hold::Claim => Ok(self.discard_for_claim().await),
        }
    }

    /// The handler ended the store's transaction itself: how, as the server tells from the
    /// transaction's id. Committed: its writes (those before its `COMMIT`) exist. Rolled back:
    /// none exist. Neither said (the id is too old for the server to know): unknown.
    async fn ended_by_handler(&self) -> Result<CommitOutcome, StoreError> {
        let rows = self
            .core
            .driver
            .query(
                &self.core.table.statements.tx_status,
                &[Param::Int8(self.xid)],
            )
            .await?;
        let (committed, aborted) = match rows.first() {
            Some(row) => (row.opt_bool(0)?, row.opt_bool(1)?),
            None => (None, None),
        };
        Ok(match (committed, aborted) {
            (Some(true), _) => CommitOutcome::CommittedByHandler,
            (_, Some(true)) => CommitOutcome::RolledBackByHandler,
            _ => CommitOutcome::EndedByHandler,
        })
    }
}

/// A failure of the pipelined completion and `COMMIT`, as the store error that says whether the
/// commit may have happened (see
/// [`StoreTransaction::complete_and_commit`](idempotency_core::store::StoreTransaction::complete_and_commit)):
/// an error the server answered with ends the transaction uncommitted, so it is never reported
/// as unreachable (a serialization failure, say, which is otherwise retryable). A lost
/// connection, or the server stopping (SQLSTATE classes 08 and 57, sent as it terminates the
/// session), may have come after the commit: reported as it is, unreachable.
fn commit_error(error: DriverError) -> StoreError {
    let answered = match error.sqlstate.as_deref() {
        Some(code) => !matches!(code.get(..2), Some("08" | "57")),
        None => false,
    };
    if answered && error.error.is_unreachable() {
        StoreError::from_failure(BACKEND, false, error.error)
    } else {
        error.error
    }
}

/// `hold` as the server's `idle_in_transaction_session_timeout`, in whole milliseconds: at least
/// 1 (0 would turn the bound off) and at most what the setting takes (`i32::MAX`, 24.8 days).
fn idle_limit_ms(hold: Duration) -> i64 {
    i64::try_from(hold.as_millis())
        .unwrap_or(i64::MAX)
        .clamp(1, i64::from(i32::MAX))
}

defaults_to_tokio_postgres! {
/// A request's transaction on the store's pool, on the driver `D`: the handler's writes and its
/// stored response commit together, or not at all.
///
/// It derefs to the driver's connection inside the transaction (`PostgresTransaction`: deadpool's
/// `ClientWrapper`, which derefs to `tokio_postgres::Client`; `SqlxPostgresTransaction` =
/// `PostgresTransaction<Sqlx>`: `sqlx::PgConnection`), so a handler runs its statements on it, inside
/// the transaction. It offers no way to commit: the layer commits after the handler returns,
/// storing the response in the same transaction after checking that this request still holds
/// its key. Do not run `COMMIT` or `ROLLBACK` yourself: the completion notices and stores
/// nothing, and statements run after them are outside any transaction (`docs/failure-modes.md`).
///
/// In an axum handler, take it as `idempotency::Tx<PostgresTransaction>` (feature `axum`); elsewhere,
/// open it from the request's `TransactionSlot` extension:
///
/// ```no_run
/// # #[cfg(feature = "tokio-postgres")]
/// # async fn handler(request: idempotency_core::http::Request<()>) -> Result<(), Box<dyn std::error::Error>> {
/// use idempotency_core::TransactionSlot;
/// use idempotency_postgres::PostgresTransaction;
///
/// let slot = request.extensions().get::<TransactionSlot>().ok_or("no idempotency transaction")?;
/// let tx = slot.open::<PostgresTransaction>().await?;
/// tx.execute("INSERT INTO tasks (title) VALUES ($1)", &[&"Buy milk"]).await?;
/// drop(tx); // before returning the response
/// # Ok(()) }
/// ```
///
/// The transaction runs at the connection's default isolation (READ COMMITTED unless the URL's
/// `options` set `default_transaction_isolation`: the store's check is its first statement, so
/// `SET TRANSACTION` in the handler comes too late). Savepoints are allowed in it; what a handler
/// does with deadlocks, serialization failures and refusals is in `docs/handlers.md` of the
/// repository. On sqlx it costs two more round
/// trips per request: sqlx sends `BEGIN` and `COMMIT` on their own, where tokio-postgres
/// pipelines them with the store's statements.
pub struct PostgresTransaction<D: Driver>(pub(crate) OpenTransaction<D>);
}

impl<D: Driver> fmt::Debug for PostgresTransaction<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresTransaction")
            .field("driver", &std::any::type_name::<D>())
            .field("table", &self.0.table())
            .field("open", &self.0.is_open())
            .finish_non_exhaustive()
    }
}

#[async_trait::async_trait]
impl<D: Driver> StoreTransaction for PostgresTransaction<D> {
    async fn complete_and_commit(
        mut self: Box<Self>,
        response: &StoredResponse,
        retention: Duration,
    ) -> Result<CommitOutcome, StoreError> {
        self.0.complete_and_commit(response, retention).await
    }

    async fn rollback(mut self: Box<Self>) -> Result<(), StoreError> {
        self.0.rollback().await
    }

    async fn discard_writes_and_store(
        mut self: Box<Self>,
        response: &StoredResponse,
        retention: Duration,
    ) -> Result<DiscardOutcome, StoreError> {
        self.0.discard_writes_and_store(response, retention).await
    }

    async fn settle(&mut self) -> Result<Settled, StoreError> {
        self.0.settle().await
    }

    fn lookup_signal(&self) -> Option<LookupSignal> {
        match &self.0.hold {
            Hold::PendingLookup { signal, .. } => Some(signal.clone()),
            Hold::Claim | Hold::Lock(_) => None,
        }
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}
