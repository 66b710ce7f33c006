//! Any async work run once per key: the idempotent consumer of a queue, a job runner, a webhook
//! handler that is not behind the HTTP layer.
//!
//! [`Engine::once`] is the same protocol as an HTTP request's, with typed values in place of a
//! response: the input is fingerprinted (its canonical JSON), the work's `Ok` value is stored
//! (as JSON) and handed back to every later duplicate, a concurrent duplicate waits
//! ([`EngineConfig::in_flight_wait`](crate::EngineConfig#structfield.in_flight_wait)) or is told it is in
//! flight, and the same key with another input is refused.
//!
//! The error rule, chosen by where the work puts a failure:
//!
//! - `Err(e)` is **retryable**: nothing is stored, the key is released (the transaction rolled
//!   back), and a redelivery runs the work again;
//! - a **permanent** failure is a value: make `T` a `Result<Done, Refused>` and return
//!   `Ok(Err(refused))`. It is stored and every duplicate gets the same `Err(refused)` back
//!   without running anything. When the refusal follows a failed statement (a check
//!   constraint, a value the database refuses), call [`OnceContext::discard_writes`] first:
//!   the failed statement aborted the transaction, so its writes are rolled back and the
//!   refusal stored alone.
//!
//! On a transactional store (PostgreSQL) the work takes the store's transaction from its
//! [`OnceContext`], exactly as an HTTP handler does, and the result commits with the work's
//! writes: a crash at any instant leaves both or neither.

use crate::engine::{Begin, Completion, Engine, KeyClaim, RollbackCause, Superseded};
use crate::error::StoreError;
use crate::fingerprint::{BodyCanonicalization, Fingerprint};
use crate::key::IdempotencyKey;
use crate::response::StoredResponse;
use crate::scope::Scope;
use crate::store::IdempotencyStore;
use crate::transaction::{StoreTransaction, Transaction, TransactionError, TransactionSlot};
use bytes::Bytes;
use futures_util::FutureExt as _;
use http::{HeaderMap, HeaderValue, StatusCode, header};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

/// The method under which [`Engine::once`] fingerprints its input. With an empty path (an HTTP
/// request's always starts with `/`), a job's record and an HTTP request's record under the
/// same scope and key never match each other.
const ONCE_METHOD: &str = "ONCE";

/// What [`Engine::once`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome<T> {
    /// This call ran the work, and its value is stored for the duplicates (see `completion`).
    Ran {
        /// The work's value.
        value: T,
        /// How the value reached the store: [`Completion::Stored`] on the common path;
        /// [`Completion::Deferred`] when the store failed and storing goes on in the
        /// background; [`Completion::Stale`] when the lease was lost first (without a
        /// transaction the work's effects stand, and a duplicate may run it again: the
        /// heartbeat makes this rare, see `docs/failure-modes.md`).
        completion: Completion,
    },
    /// An earlier call with the same key and input ran the work: this is its stored value, and
    /// nothing ran now.
    Replayed(T),
}

impl<T> Outcome<T> {
    /// The value, whoever ran the work.
    pub fn into_value(self) -> T {
        match self {
            Outcome::Ran { value, .. } | Outcome::Replayed(value) => value,
        }
    }

    /// The value, whoever ran the work.
    pub fn value(&self) -> &T {
        match self {
            Outcome::Ran { value, .. } | Outcome::Replayed(value) => value,
        }
    }

    /// Whether the value was replayed from the store (nothing ran now).
    pub fn is_replayed(&self) -> bool {
        matches!(self, Outcome::Replayed(_))
    }
}

/// Why [`Engine::once`] has no value. [`OnceError::is_retryable`] says whether the same key and
/// input may succeed later (for a queue consumer: requeue the message rather than dead-letter
/// it).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OnceError<E> {
    /// The work returned `Err`: nothing was stored, its transaction (if it took one) rolled
    /// back, and the key was released, so a redelivery runs the work again.
    #[error("the work failed; its key was released for a retry: {0}")]
    Work(E),
    /// A duplicate with the same key and input is running now: try again after `retry_after`.
    #[error("a duplicate with the same key is running; retry after {retry_after:?}")]
    InFlight {
        /// A hint for when to try again.
        retry_after: Duration,
    },
    /// The key was used with another input: never retryable, and never the other's value.
    #[error("the key was already used with a different input")]
    Mismatch,
    /// The work's transaction did not commit: none of its writes exist; run it again with the
    /// same key.
    #[error("the work's transaction did not commit; retry with the same key")]
    NotCommitted(RollbackCause),
    /// The work's `COMMIT` was sent but never confirmed (a timeout or a lost connection): its
    /// writes and value exist, or neither does. Run it again with the same key to learn which:
    /// a commit that happened replays its value, one that did not runs the work. Never treat
    /// it as not done under another key.
    #[error("the work's commit was not confirmed; retry with the same key to learn the outcome")]
    OutcomeUnknown,
    /// The work rolled its transaction back itself (nothing was stored and the key was
    /// released), ended it in a way the store could not tell, kept it after returning
    /// (nothing stored, the key claimed until its lease ends), or asked for it again while it
    /// held it ([`TransactionError::InUse`], answered at once; the transaction rolled back and
    /// the key released). A bug in the work. (A work that
    /// committed its transaction itself has its value stored after that commit: `Ok`.)
    #[error(
        "the work ended its idempotency transaction itself or kept it after returning; nothing \
         was stored"
    )]
    TransactionMisused,
    /// The store failed before the work could start; nothing ran.
    #[error("the idempotency store failed; the work did not run")]
    Store(#[source] StoreError),
    /// The input could not be serialized to be fingerprinted; nothing ran.
    #[error("the input could not be serialized as JSON")]
    Input(#[source] serde_json::Error),
    /// The work's value could not be serialized: nothing was stored, the transaction (if the
    /// work took one) rolled back and the key was released. Without a transaction the work's
    /// effects stand and a redelivery runs it again: a `Serialize` that can fail is a bug.
    #[error("the work's value could not be serialized as JSON; its key was released")]
    Output(#[source] serde_json::Error),
    /// The stored value of an earlier run could not be read as `T` (the type changed since it
    /// was stored); nothing ran now.
    #[error("the stored value of an earlier run could not be read as this type")]
    Stored(#[source] serde_json::Error),
}

impl<E> OnceError<E> {
    /// Whether the same key and input may succeed later: in flight, not committed (or not
    /// known to be), a store
    /// failure, or the work's own (retryable) error.
    pub fn is_retryable(&self) -> bool {
        match self {
            OnceError::Work(_)
            | OnceError::InFlight { .. }
            | OnceError::NotCommitted(_)
            | OnceError::OutcomeUnknown => true,
            OnceError::Store(error) => error.is_retryable(),
            OnceError::Mismatch
            | OnceError::TransactionMisused
            | OnceError::Input(_)
            | OnceError::Output(_)
            | OnceError::Stored(_) => false,
        }
    }
}

/// What the work of [`Engine::once`] is given: its claim, and on a transactional store the
/// transaction its writes commit in together with its value.
pub struct OnceContext {
    claim: KeyClaim,
    transaction: Option<TransactionSlot>,
}

impl fmt::Debug for OnceContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OnceContext")
            .field("claim", &self.claim)
            .field("transaction", &self.transaction)
            .finish()
    }
}

impl OnceContext {
    /// The claim: scope, key, fencing token, and [`KeyClaim::lost`] to stop early.
    pub fn claim(&self) -> &KeyClaim {
        &self.claim
    }

    /// The slot of the store's transaction, for code written against [`TransactionSlot`] (the
    /// HTTP layer hands handlers the same); `None` when the store is not transactional.
    pub fn transaction_slot(&self) -> Option<&TransactionSlot> {
        self.transaction.as_ref()
    }

    /// Rolls back every write of the work's transaction when the work returns, and stores its
    /// `Ok` value without them: how a work records a **permanent** refusal after a statement
    /// failed (the failure aborted the transaction, which can never commit, so returning
    /// `Ok(Err(refusal))` alone would be [`OnceError::NotCommitted`], retried for ever). Every
    /// duplicate then gets the refusal without running. See
    /// [`TransactionSlot::discard_writes`]; [`TransactionError::Unavailable`] when the store is
    /// not transactional (nothing the work wrote can be taken back).
    ///
    /// ```ignore
    /// let tx = ctx.transaction::<PostgresTransaction>().await?;
    /// match tx.execute("INSERT INTO tasks (title) VALUES ($1)", &[&title]).await {
    ///     Ok(_) => Ok(Ok(())),
    ///     // A data or constraint error: the same input always fails. Record why, once.
    ///     Err(e) if e.code().is_some_and(|c| idempotency_postgres::is_permanent_sqlstate(c.code())) => {
    ///         drop(tx);
    ///         ctx.discard_writes()?;
    ///         Ok(Err(format!("refused: {e:?}")))
    ///     }
    ///     Err(e) => Err(e.into()), // retryable: nothing stored, the key released
    /// }
    /// ```
    pub fn discard_writes(&self) -> Result<(), TransactionError> {
        match &self.transaction {
            Some(slot) => {
                slot.discard_writes();
                Ok(())
            }
            None => Err(TransactionError::Unavailable),
        }
    }

    /// The store's transaction as its type `T` (`idempotency_postgres::PostgresTransaction`, say),
    /// opened on first use; the work's value is stored in it and it commits after the work
    /// returns. Drop it before the work returns. [`TransactionError::Unavailable`] when the
    /// store is not transactional.
    pub async fn transaction<T: StoreTransaction>(
        &self,
    ) -> Result<Transaction<T>, TransactionError> {
        match &self.transaction {
            Some(slot) => slot.open().await,
            None => Err(TransactionError::Unavailable),
        }
    }
}

impl<S: IdempotencyStore + 'static> Engine<S> {
    /// Runs `work` once for `(scope, key)` and `input`, and hands its stored value to every
    /// duplicate (the [module docs](crate::once) give the error rule):
    ///
    /// ```
    /// use idempotency_core::{Engine, EngineConfig, IdempotencyKey, KeyFormat, Scope};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let engine = Engine::new(idempotency_memory::MemoryStore::default(), EngineConfig::default())?;
    /// let scope = Scope::new("tasks-consumer")?;
    /// let key = IdempotencyKey::parse(b"message-0001", KeyFormat::opaque())?;
    /// for _delivery in 0..3 {
    ///     let outcome = engine
    ///         .once(scope.clone(), key.clone(), &("create", "Buy milk"), |_ctx| async {
    ///             Ok::<u64, std::io::Error>(42) // the side effect, e.g. an INSERT
    ///         })
    ///         .await?;
    ///     assert_eq!(outcome.into_value(), 42); // the first ran it, the others replayed it
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// A call dropped while the work runs releases the key in the background (and rolls back
    /// its transaction). The value is stored as JSON under the engine's retention; the engine's
    /// [`ReplayPolicy`](crate::ReplayPolicy) is for HTTP statuses and does not apply.
    pub async fn once<I, T, E, F, Fut>(
        &self,
        scope: Scope,
        key: IdempotencyKey,
        input: &I,
        work: F,
    ) -> Result<Outcome<T>, OnceError<E>>
    where
        I: Serialize + ?Sized,
        T: Serialize + DeserializeOwned,
        F: FnOnce(OnceContext) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let input = serde_json::to_vec(input).map_err(OnceError::Input)?;
        let fingerprint = Fingerprint::of_input(&input);
        let guard = match self.begin(scope, key, fingerprint).await {
            Ok(Begin::Proceed(guard)) => guard,
            Ok(Begin::Replay(stored)) => return replayed(&stored),
            Ok(Begin::InFlight { retry_after }) => {
                return Err(OnceError::InFlight { retry_after });
            }
            Ok(Begin::Mismatch) => return Err(OnceError::Mismatch),
            Err(error) => return Err(OnceError::Store(error)),
        };
        let context = OnceContext {
            claim: guard.claim().clone(),
            transaction: guard.transaction().cloned(),
        };
        // A released key may turn out another's (the speculative mode settles it only now):
        // then its answer, not the work's error, nor its panic. A panic is caught with the
        // work's locals dropped, so the guard still reads the key before the panic goes on.
        let worked = AssertUnwindSafe(work(context)).catch_unwind().await;
        let value = match worked {
            Ok(Ok(value)) => value,
            Ok(Err(error)) => {
                let misused = guard
                    .transaction()
                    .is_some_and(TransactionSlot::was_misused);
                return match guard.release().await {
                    Completion::Superseded(superseded) => superseded_outcome(superseded),
                    _ if misused => Err(OnceError::TransactionMisused),
                    // The speculative lookup could not be settled: the work's error may come
                    // from statements refused because the key was another's. Not passed on.
                    Completion::RolledBack(cause) => Err(OnceError::NotCommitted(cause)),
                    _ => Err(OnceError::Work(error)),
                };
            }
            Err(panic) => {
                if let Completion::Superseded(superseded) = guard.release().await {
                    return superseded_outcome(superseded);
                }
                std::panic::resume_unwind(panic);
            }
        };
        let body = match serde_json::to_vec(&value) {
            Ok(body) => Bytes::from(body),
            Err(error) => {
                return match guard.release().await {
                    Completion::Superseded(superseded) => superseded_outcome(superseded),
                    _ => Err(OnceError::Output(error)),
                };
            }
        };
        let completion = guard.store_outcome(value_record(body), false).await;
        match completion {
            Completion::Stored
            | Completion::Deferred
            | Completion::Stale
            | Completion::Released => Ok(Outcome::Ran { value, completion }),
            Completion::RolledBack(cause) => Err(OnceError::NotCommitted(cause)),
            Completion::OutcomeUnknown => Err(OnceError::OutcomeUnknown),
            Completion::TransactionMisused => Err(OnceError::TransactionMisused),
            Completion::Superseded(superseded) => superseded_outcome(superseded),
        }
    }
}

/// The answer of a call whose key another's record or transaction holds.
fn superseded_outcome<T: DeserializeOwned, E>(
    superseded: Superseded,
) -> Result<Outcome<T>, OnceError<E>> {
    match superseded {
        Superseded::Replay(stored) => replayed(&stored),
        Superseded::Mismatch => Err(OnceError::Mismatch),
        Superseded::InFlight { retry_after } => Err(OnceError::InFlight { retry_after }),
    }
}

/// The record of a work's value: `200`, JSON.
fn value_record(body: Bytes) -> StoredResponse {
    let mut headers = HeaderMap::with_capacity(1);
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    StoredResponse::new(StatusCode::OK, headers, body)
}

fn replayed<T: DeserializeOwned, E>(stored: &StoredResponse) -> Result<Outcome<T>, OnceError<E>> {
    serde_json::from_slice(stored.body())
        .map(Outcome::Replayed)
        .map_err(OnceError::Stored)
}

impl Fingerprint {
    /// The fingerprint of a job's input, given as its JSON serialization: canonicalised (object
    /// keys sorted, so a map serialized in another order matches), and never equal to an HTTP
    /// request's fingerprint. [`Engine::once`] uses it.
    pub fn of_input(json: &[u8]) -> Self {
        Fingerprint::of_request(ONCE_METHOD, "", json, BodyCanonicalization::Json)
    }
}
