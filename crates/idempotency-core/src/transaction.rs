//! Transactional completion: the handler's writes and the stored response commit together.
//!
//! A store whose records live in the same transactional database as the application's data
//! (PostgreSQL, ADR 009) implements [`TransactionalStore`]. For each request that proceeds, the
//! engine then offers a [`TransactionSlot`]: the handler opens it (the HTTP layer puts it in the
//! request extensions, and axum handlers take it as an extractor), does its writes in the
//! transaction, and returns its response; the engine stores that response in the **same**
//! transaction, fenced by the claim's token, and commits. So a crash, a store error or a lost
//! lease at any instant leaves both the side effect and the stored response, or neither.
//!
//! The handler never commits: the transaction types give it no way to, and the engine checks
//! at commit time that the transaction it opened is still the one running.

use crate::error::StoreError;
use crate::fingerprint::Fingerprint;
use crate::record::Record;
use crate::response::StoredResponse;
use std::any::Any;
use std::fmt;
use std::time::Duration;

use crate::key::IdempotencyKey;

use crate::record::LeaseToken;

use crate::scope::Scope;

/// A store that can open a database transaction in which the handler's writes and the stored
/// response commit together. Reached through
/// [`IdempotencyStore::transactional`](crate::IdempotencyStore::transactional).
#[async_trait::async_trait]
pub trait TransactionalStore: Send + Sync {
    /// Begins a transaction on the store's database and checks, inside it, that `token` still
    /// holds a live claim on `(scope, key)`. `Ok(None)` when it does not (the lease was lost):
    /// nothing is left open.
    ///
    /// As in [`begin_one_transaction`](TransactionalStore::begin_one_transaction), the store
    /// must end the transaction from the database's side when it sits idle, waiting for the
    /// application's next statement, for longer than `hold` (the engine passes its lease): the
    /// claim of a frozen or cut-off process lapses after one lease and a retry runs, and the
    /// retry's handler must not wait for ever on the rows the frozen transaction locked.
    async fn begin_transaction(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        token: LeaseToken,
        hold: Duration,
    ) -> Result<Option<Box<dyn StoreTransaction>>, StoreError>;

    /// Whether the store implements [`TransactionalStore::begin_one_transaction`], the
    /// one-transaction mode ([`ClaimMode::OneTransaction`](crate::ClaimMode::OneTransaction)).
    /// `false` by default.
    fn supports_one_transaction(&self) -> bool {
        false
    }

    /// Whether a one-transaction request's open transaction holds `(scope, key)` now (its
    /// lock, taken by [`begin_one_transaction`](TransactionalStore::begin_one_transaction)),
    /// read without taking the lock, so a request beginning at the same moment is never turned
    /// away by the look. What [`Engine::status`](crate::Engine::status) asks in the
    /// one-transaction modes when the key has no record: such a request's record exists only
    /// from its commit. One round trip; `false` by default (a store without the mode).
    async fn held_by_transaction(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
    ) -> Result<bool, StoreError> {
        let _ = (scope, key);
        Ok(false)
    }

    /// A duplicate of a one-transaction request that holds `(scope, key)` waits on this process
    /// ([`EngineConfig::in_flight_wait`](crate::EngineConfig#structfield.in_flight_wait)):
    /// the store makes sure it hears of settles
    /// ([`IdempotencyStore::settled_keys`](crate::IdempotencyStore::settled_keys)), then sends
    /// the key's watch to every process listening
    /// ([`WATCH_PREFIX`](crate::store::WATCH_PREFIX)), so that the process whose request holds
    /// the key sends its [`wake_id`](crate::store::wake_id) with that request's commit. Such a
    /// request has no record to mark before it commits, which is what
    /// [`IdempotencyStore::watch_settle`](crate::IdempotencyStore::watch_settle) does in the
    /// lease mode. One round trip (the first time, also opening the listening session); an
    /// error costs only the wake: the duplicate polls. `Ok(())` by default.
    async fn watch_transaction(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
    ) -> Result<(), StoreError> {
        let _ = (scope, key);
        Ok(())
    }

    /// This process's one-transaction requests may have duplicates waiting on other processes
    /// ([`TransactionalStore::watch_transaction`]): a store that hears of settles listens, so
    /// that it hears their watches. Called by the engine at each such request's begin when it
    /// lets duplicates wait; it must return at once (opening a session in a task of its own,
    /// [`SettleListener::open_in_background`](crate::store::SettleListener::open_in_background)).
    /// Nothing by default.
    fn listen_for_watches(&self) {}

    /// Whether [`TransactionalStore::begin_one_transaction_speculative`] queues the lookup with
    /// the handler's first statement (the PostgreSQL store on tokio-postgres), rather than
    /// falling back to [`TransactionalStore::begin_one_transaction`]: without it,
    /// [`ClaimMode::OneTransactionSpeculative`](crate::ClaimMode::OneTransactionSpeculative) is
    /// refused when the engine is built. Default false.
    fn supports_speculative(&self) -> bool {
        false
    }

    /// The one-transaction mode: begins a transaction, takes a transaction-scoped lock on
    /// `(scope, key)` **without waiting**, and reads the key's live record, all in one round
    /// trip; `token` names this request's hold on the key (a store may keep it beside the
    /// transaction; the PostgreSQL store identifies the transaction by its start time and
    /// writes no setting, which would cost every commit). Nothing is written.
    ///
    /// The transaction holds the key for as long as it is open, so the store must end it from
    /// the database's side when its process stops answering (a frozen VM, a stop-the-world, a
    /// host cut off the network): it may sit idle, waiting for the application's next
    /// statement, for at most `hold` (the engine passes its lease) before the database ends
    /// the session and rolls it back. Nothing it wrote then commits, and the key is free.
    ///
    /// - a live record: [`OneTransactionBegin::Existing`], the transaction ended;
    /// - no live record and the lock taken: [`OneTransactionBegin::Absent`], the transaction open and
    ///   holding the lock until it ends; its
    ///   [`complete_and_commit`](StoreTransaction::complete_and_commit) inserts the completed
    ///   record (with `fingerprint`) right before `COMMIT`;
    /// - no live record and the lock held by another transaction: [`OneTransactionBegin::Busy`], the
    ///   transaction ended.
    ///
    /// The store's unique index on `(scope, key)`, not the lock, is what keeps one record per
    /// key: the lock only keeps duplicates from running while the first is open. The default
    /// answers an error: the store has no such mode.
    async fn begin_one_transaction(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        token: LeaseToken,
        hold: Duration,
    ) -> Result<OneTransactionBegin, StoreError> {
        let _ = (scope, key, fingerprint, token, hold);
        Err(StoreError::Backend {
            backend: "transactional",
            source:
                "this store has no one-transaction mode (TransactionalStore::begin_one_transaction)"
                    .into(),
        })
    }

    /// The speculative one-transaction mode
    /// ([`ClaimMode::OneTransactionSpeculative`](crate::ClaimMode::OneTransactionSpeculative)):
    /// as [`TransactionalStore::begin_one_transaction`], but without waiting for the lookup: the store
    /// queues `BEGIN` and the lookup on a connection and answers [`OneTransactionBegin::Absent`] at once,
    /// so that the handler's first statement follows them in the same round trip. The lookup
    /// must abort the transaction when it finds the key taken, before any statement queued
    /// after it runs; [`StoreTransaction::settle`] then says what it found. The default is
    /// [`TransactionalStore::begin_one_transaction`] (a store that cannot queue the lookup).
    async fn begin_one_transaction_speculative(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        token: LeaseToken,
        hold: Duration,
    ) -> Result<OneTransactionBegin, StoreError> {
        self.begin_one_transaction(scope, key, fingerprint, token, hold)
            .await
    }
}

/// What the key's lookup of a speculative transaction found
/// ([`StoreTransaction::settle`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Settled {
    /// The key is free and this transaction holds its lock: the handler's writes stand, and
    /// the completion inserts the record at commit.
    Proceed,
    /// The key has a live record: the transaction was rolled back (none of the handler's
    /// writes exist).
    Existing(Record),
    /// A duplicate's transaction held the key: the transaction was rolled back.
    Busy,
}

/// What [`TransactionalStore::begin_one_transaction`] found.
#[non_exhaustive]
pub enum OneTransactionBegin {
    /// The key has no live record and this transaction holds its lock: run the request in it.
    Absent(Box<dyn StoreTransaction>),
    /// The key has a live record (completed, or claimed by a request in the lease mode).
    Existing(Record),
    /// Another open transaction holds the key's lock: a duplicate is running.
    Busy,
}

impl fmt::Debug for OneTransactionBegin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OneTransactionBegin::Absent(_) => f.write_str("Absent(..)"),
            OneTransactionBegin::Existing(record) => {
                f.debug_tuple("Existing").field(record).finish()
            }
            OneTransactionBegin::Busy => f.write_str("Busy"),
        }
    }
}

/// What [`StoreTransaction::complete_and_commit`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CommitOutcome {
    /// The response was stored and the transaction committed: the side effect and the record
    /// both exist.
    Committed,
    /// The token no longer held the claim (the lease ran out and the key was taken over): the
    /// transaction rolled back, so none of the handler's writes exist.
    LeaseLost,
    /// The transaction the store opened was no longer running: the handler ended it itself
    /// (a raw `COMMIT` or `ROLLBACK`), and the store cannot tell which. Whether its writes
    /// exist is unknown; nothing was stored.
    EndedByHandler,
    /// The handler committed the transaction the store opened itself (a raw `COMMIT`): its
    /// writes up to that `COMMIT` exist, and nothing was stored. After it, statements in a
    /// transaction the handler began were rolled back by the completion; statements outside
    /// any transaction committed each on its own (autocommit), and exist too. The engine
    /// stores the response outside the transaction, so the retry replays instead of running
    /// again.
    CommittedByHandler,
    /// The handler rolled the transaction the store opened back itself (a raw `ROLLBACK`): its
    /// writes before the `ROLLBACK` were undone, and nothing was stored. Statements it ran
    /// after the `ROLLBACK` ran outside any transaction and committed each on its own
    /// (autocommit): those exist, and the store can neither see nor undo them. The engine
    /// releases the key, so the retry runs (and writes them again).
    RolledBackByHandler,
    /// One-transaction mode: another request stored a record for the key first (the unique
    /// index refused ours). The transaction rolled back, so none of the handler's writes exist;
    /// the record is the one that stands, read after the rollback.
    Superseded(Record),
}

/// What [`StoreTransaction::discard_writes_and_store`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DiscardOutcome {
    /// The answer is the key's completed record, stored while this transaction still held the
    /// key; the transaction then rolled back, so none of the handler's writes exist.
    Stored,
    /// Another request's record stood for the key (the answer was not stored); the
    /// transaction rolled back. The record is the one that stands.
    Superseded(Record),
    /// The transaction rolled back and nothing was stored: the key is no longer held by it.
    /// The engine stores the answer with the store's primitives, and answers with whatever
    /// stands if another request took the key in between.
    RolledBack,
}

/// An open transaction of a [`TransactionalStore`], bound to one claim.
///
/// Implementations also expose the database handle the handler writes with (through `Deref`
/// to their driver's client, say), and never a way to commit it.
#[async_trait::async_trait]
pub trait StoreTransaction: Send + Sync + 'static {
    /// In this transaction: stores `response` for `retention` if the claim's token still holds
    /// the claim, then commits. [`CommitOutcome::LeaseLost`] and the outcomes of a transaction
    /// the handler ended itself ([`CommitOutcome::EndedByHandler`],
    /// [`CommitOutcome::CommittedByHandler`], [`CommitOutcome::RolledBackByHandler`]) store
    /// nothing.
    ///
    /// An `Err` whose [`is_unreachable`](StoreError::is_unreachable) is true (the connection
    /// dropped, the server stopped) means the outcome is unknown: the `COMMIT` may have
    /// happened. Any other `Err` must mean that it did not (the database answered with an
    /// error, so the transaction ended without committing). Either way the record still
    /// carries the claim's token unless the commit happened, so a fenced release afterwards is
    /// always safe. (The engine's own timeout around this call also counts as unknown.)
    async fn complete_and_commit(
        self: Box<Self>,
        response: &StoredResponse,
        retention: Duration,
    ) -> Result<CommitOutcome, StoreError>;

    /// Rolls the transaction back: none of its writes exist afterwards.
    async fn rollback(self: Box<Self>) -> Result<(), StoreError>;

    /// Rolls the handler's writes back and stores `response` for `retention` as the key's
    /// completed record ([`TransactionSlot::discard_writes`]), keeping the key held from its
    /// lookup until the record lands: in the one-transaction modes the transaction's lock is the
    /// only hold on the key, so a store that can write the record elsewhere (another
    /// connection) before it rolls back does so, and a duplicate never finds the key free
    /// between the rollback and the record (it would run, and a committed order would stand
    /// beside a stored refusal).
    ///
    /// The default rolls back and answers [`DiscardOutcome::RolledBack`]: the engine then
    /// claims the key and stores the answer itself, and answers with what stands if another
    /// request took the key in between (a rollback that fails is no reason not to store the
    /// answer: that transaction ends with its connection, uncommitted). An `Err` that
    /// [`is_unreachable`](StoreError::is_unreachable) means the record may or may not have
    /// landed; any other `Err`, that it did not. Either way the writes are rolled back.
    async fn discard_writes_and_store(
        self: Box<Self>,
        response: &StoredResponse,
        retention: Duration,
    ) -> Result<DiscardOutcome, StoreError> {
        let _ = (response, retention);
        if let Err(error) = self.rollback().await {
            // Nothing commits on a transaction that failed to roll back: it ends with its
            // connection. Storing the answer is still right.
            tracing::warn!(
                error = %crate::error::ErrorChain(&error),
                "could not roll back the discarded transaction; it ends with its connection"
            );
        }
        Ok(DiscardOutcome::RolledBack)
    }

    /// For a transaction of [`TransactionalStore::begin_one_transaction_speculative`]: waits for the
    /// key's lookup and says what it found; on anything but [`Settled::Proceed`] the
    /// transaction is rolled back. The engine calls it before it completes or releases such a
    /// transaction. The default (a transaction whose lookup was answered before it was handed
    /// out): [`Settled::Proceed`].
    async fn settle(&mut self) -> Result<Settled, StoreError> {
        Ok(Settled::Proceed)
    }

    /// For a transaction of [`TransactionalStore::begin_one_transaction_speculative`] whose
    /// lookup is still on its way: a signal of its answer, which the engine watches so that a
    /// request whose lookup the database does not answer is answered within the store timeout
    /// (the handler's statements wait behind the lookup, and nothing else bounds them). `None`
    /// (the default): the lookup was answered before the transaction was handed out.
    fn lookup_signal(&self) -> Option<LookupSignal> {
        None
    }

    /// `self` as `Any`, so [`TransactionSlot::open`] can hand the handler the concrete type.
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

/// Why a request's transaction could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TransactionError {
    /// The request has no transaction to offer: it is not behind the idempotency layer (a
    /// method or route it does not cover, or no key), or its store is not transactional.
    #[error(
        "this request has no idempotency transaction: it is not covered by the idempotency layer \
         (method, route or missing key), or the store does not support transactions \
         (only the PostgreSQL store does)"
    )]
    Unavailable,
    /// The lease was lost before the transaction was opened: another request may be running
    /// this one.
    #[error("the request's idempotency lease was lost; another request may hold its key")]
    LeaseLost,
    /// The request already finished, and its transaction with it.
    #[error("the request's idempotency transaction is already closed")]
    Closed,
    /// The transaction is already taken: a [`Transaction`] of this request is still alive
    /// (two `Tx` extractors in one handler, a helper that asks for it again while its caller
    /// holds it). It is one connection, held by one [`Transaction`] at a time; asking again is
    /// answered at once instead of waiting for a holder that is usually the caller itself.
    /// The request is refused (HTTP: `500 transaction-misused`), its writes rolled back and
    /// its key released.
    #[error(
        "the request's idempotency transaction is already taken (a Transaction or Tx of this \
         request is still alive): take it once and pass it down"
    )]
    InUse,
    /// The transaction is of another store's type than the one asked for.
    #[error("the request's idempotency transaction is not a {expected}")]
    WrongType {
        /// The type asked for.
        expected: &'static str,
    },
    /// The store could not open the transaction.
    #[error("could not open the idempotency transaction")]
    Store(#[source] StoreError),
}

impl TransactionError {
    /// True when retrying the request later may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            TransactionError::LeaseLost => true,
            TransactionError::Store(e) => e.is_retryable(),
            _ => false,
        }
    }
}

mod lookup_signal;
mod slot;

pub use lookup_signal::{LookupAnswered, LookupSignal};
pub(crate) use slot::{OpenFuture, Opener, Taken};
pub use slot::{Transaction, TransactionSlot};
