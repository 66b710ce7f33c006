//! The one-transaction modes: the key's lookup opens the request's transaction, and nothing is
//! written before the handler's own writes. Here, what both share ([`Engine::begin`]'s loop,
//! the guard of a transaction, the key claimed again once its transaction is gone without the
//! response) and [`ClaimMode::OneTransaction`](crate::ClaimMode::OneTransaction)'s own step,
//! `OneTransactionMode`: the lookup's answer waited for before the handler starts. The
//! speculative mode's steps are in `speculative.rs`.

use super::admission::Admitted;
use super::completion::{Completion, RollbackCause};
use super::guard::Guard;
use super::guard::hold::Hold;
use super::key_claim::KeyClaim;
use super::protocol::{Judged, TRANSACTION_RETRY_AFTER, judge};
use super::retry::spawn_release;
use super::shared::Shared;
use super::wait::{Next, WaitForKey};
use super::{Begin, Engine};
use crate::error::{ErrorChain, StoreError};
use crate::fingerprint::Fingerprint;
use crate::key::IdempotencyKey;
use crate::record::LeaseToken;
use crate::response::StoredResponse;
use crate::scope::Scope;
use crate::store::{ClaimOutcome, IdempotencyStore, StoreOp, StoreTransaction, TransactionalStore};
use crate::store::{OneTransactionBegin, Record};
use crate::transaction::TransactionSlot;
use futures_util::future::BoxFuture;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// The length given to the [`KeyClaim`] of a request in the one-transaction mode: its key is held
/// by its open transaction, which has no end but its own, so the lease never runs out.
const NO_LEASE_END: Duration = Duration::from_secs(30 * 365 * 86_400);

/// What a one-transaction mode does its own way at its begin: how the request's transaction is
/// opened with the key's lookup, and how the guard then holds the key. One type per mode
/// ([`OneTransactionMode`], `speculative.rs`'s `SpeculativeMode`), chosen once by
/// [`Engine::begin`]: no flag stands for the mode further down. The loop takes it as a trait
/// object, so it is compiled once.
pub(super) trait TransactionMode: Sync {
    /// Opens the request's transaction on `store` with the key's lookup.
    fn open<'a>(
        &self,
        store: &'a dyn TransactionalStore,
        scope: &'a Scope,
        key: &'a IdempotencyKey,
        fingerprint: &'a Fingerprint,
        token: LeaseToken,
        hold: Duration,
    ) -> BoxFuture<'a, Result<OneTransactionBegin, StoreError>>;

    /// How the guard of a request whose key `tx` found free holds it.
    fn hold(&self, fingerprint: Fingerprint, tx: &dyn StoreTransaction) -> Hold;
}

/// [`ClaimMode::OneTransaction`](crate::ClaimMode::OneTransaction): the key's lookup is
/// answered before the handler starts, so its transaction holds a free key's lock from its
/// first statement.
struct OneTransactionMode;

impl TransactionMode for OneTransactionMode {
    fn open<'a>(
        &self,
        store: &'a dyn TransactionalStore,
        scope: &'a Scope,
        key: &'a IdempotencyKey,
        fingerprint: &'a Fingerprint,
        token: LeaseToken,
        hold: Duration,
    ) -> BoxFuture<'a, Result<OneTransactionBegin, StoreError>> {
        store.begin_one_transaction(scope, key, fingerprint, token, hold)
    }

    fn hold(&self, fingerprint: Fingerprint, _: &dyn StoreTransaction) -> Hold {
        Hold::Transaction { fingerprint }
    }
}

impl<S: IdempotencyStore + 'static> Engine<S> {
    /// [`Engine::begin`] in [`ClaimMode::OneTransaction`](crate::ClaimMode::OneTransaction): the
    /// loop's own future, with no other around it.
    pub(super) fn begin_in_transaction(
        &self,
        scope: Scope,
        key: IdempotencyKey,
        fingerprint: Fingerprint,
    ) -> impl Future<Output = Result<Begin<S>, StoreError>> + Send + '_ {
        self.begin_with_transaction(&OneTransactionMode, scope, key, fingerprint)
    }

    /// [`Engine::begin`] in a one-transaction `mode`: one round trip opens the request's
    /// transaction and reads the key in it; nothing is written before the handler's own writes.
    /// A duplicate finds the key's lock held (in flight) or its record (replay, or mismatch);
    /// waiting for it follows [`EngineConfig::in_flight_wait`](crate::EngineConfig#structfield.in_flight_wait) as in the lease mode.
    pub(super) async fn begin_with_transaction(
        &self,
        mode: &'static dyn TransactionMode,
        scope: Scope,
        key: IdempotencyKey,
        fingerprint: Fingerprint,
    ) -> Result<Begin<S>, StoreError> {
        let shared = &self.shared;
        let Some(store) = shared
            .store
            .transactional()
            .filter(|store| store.supports_one_transaction())
        else {
            return Err(StoreError::Backend {
                backend: shared.store.backend(),
                source: "ClaimMode::OneTransaction needs a store whose transactions support it \
                         (the PostgreSQL store with transactions on); this store does not"
                    .into(),
            });
        };
        let started = Instant::now();
        let mut wait = WaitForKey::new(&shared.waiters, started, shared.config.in_flight_wait);
        if !shared.config.in_flight_wait.is_zero() {
            // Duplicates of this request may wait on other processes: hear their watches.
            store.listen_for_watches();
        }
        loop {
            // Armed before the store is asked (see `WaitForKey::arm`).
            let woken = wait.arm();
            // Its place among the transactions admitted at once, before any connection is
            // taken; without a free one, a stored answer is read first (it needs none).
            let place = match self.place_for(&scope, &key).await {
                Ok(Placement::Place(place)) => place,
                Ok(Placement::Stored(record)) => {
                    match judge(record, &fingerprint, shared.config.retention) {
                        Judged::Mismatch => return Ok(Begin::Mismatch),
                        Judged::Replay(response) => return Ok(Begin::Replay(response)),
                        // A lease-mode claim of another instance: wait for it as below.
                        Judged::Running(_) => None,
                    }
                }
                Err(error) => {
                    return match wait.seen_running() {
                        Some(retry_after) => Ok(Begin::InFlight { retry_after }),
                        None => Err(error),
                    };
                }
            };
            let token = LeaseToken::new();
            // The request's transaction may sit idle for one lease at most: a frozen or cut-off
            // process holds the key no longer than a lease-mode claim would.
            let hold = shared.config.lease;
            let begun = shared
                .call(
                    StoreOp::BeginTransaction,
                    mode.open(store, &scope, &key, &fingerprint, token, hold),
                )
                .await;
            let running = match begun {
                Ok(OneTransactionBegin::Absent(tx)) => {
                    let claim = KeyClaim::new(scope, key, token, NO_LEASE_END, started);
                    let hold = mode.hold(fingerprint, tx.as_ref());
                    let guard = Guard::in_transaction(Arc::clone(shared), claim, hold, tx, place);
                    return self.admitted(guard).await;
                }
                Ok(OneTransactionBegin::Existing(record)) => {
                    match judge(record, &fingerprint, shared.config.retention) {
                        Judged::Mismatch => return Ok(Begin::Mismatch),
                        Judged::Replay(response) => return Ok(Begin::Replay(response)),
                        Judged::Running(lease_remaining) => lease_remaining,
                    }
                }
                Ok(OneTransactionBegin::Busy) => TRANSACTION_RETRY_AFTER,
                Err(error) => {
                    return match wait.seen_running() {
                        // Something already showed that another request holds the key.
                        Some(retry_after) => Ok(Begin::InFlight { retry_after }),
                        None => Err(error),
                    };
                }
            };
            let retry_after = running
                .min(TRANSACTION_RETRY_AFTER)
                .min(shared.config.in_flight_retry_after);
            // The key's holder has no lease to bound the nap: its transaction ends when it ends.
            match wait
                .running(&scope, &key, retry_after, Duration::MAX, woken)
                .await
            {
                Next::InFlight(retry_after) => return Ok(Begin::InFlight { retry_after }),
                // No record to mark before its commit: the watch goes to every process.
                Next::Watch => shared.watch_transaction(store, &scope, &key).await,
                Next::AskAgain => {}
            }
        }
    }

    /// A place among the request transactions admitted at once
    /// ([`TransactionAdmission`](crate::TransactionAdmission)), taken before the request's
    /// transaction takes a connection: at once when one is free. Otherwise the key's stored
    /// record, if it has one, is read first (one statement, no transaction: a replay never
    /// waits behind the writers), and the request waits for a place holding no connection up
    /// to the store timeout. `Place(None)` when the store has no admission.
    async fn place_for(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
    ) -> Result<Placement, StoreError> {
        let shared = &self.shared;
        let Some(admission) = &shared.admission else {
            return Ok(Placement::Place(None));
        };
        if let Some(place) = admission.try_admit() {
            return Ok(Placement::Place(Some(place)));
        }
        // Without contention a place comes free about as soon as the pool's queue would have
        // given a connection, and a lookup would be a round trip the bare handler does not
        // make: the request waits a moment for one first.
        if !admission.contended()
            && let Some(place) = admission.admit_quietly(QUIET_WAIT).await
        {
            return Ok(Placement::Place(Some(place)));
        }
        // Places are scarce: the transactions wait on each other (or on a lock from outside).
        // A replay must not queue behind them, so the key is looked up first.
        if let Some(record) = shared
            .call(StoreOp::Get, shared.store.get(scope, key))
            .await?
        {
            return Ok(Placement::Stored(record));
        }
        let waited = shared.config.store_timeout;
        let Some(place) = admission.admit(waited).await else {
            let limit = admission.limit();
            tracing::warn!(
                limit,
                ?waited,
                "no request transaction ended in time to admit this one: the database is \
                 contended (hot rows), or the pool is held; answering 503 store-busy"
            );
            return Err(StoreError::Busy {
                backend: shared.store.backend(),
                limit,
                waited,
            });
        };
        Ok(Placement::Place(Some(place)))
    }
}

/// How long a request waits for a place before it looks its key up, while the admission is
/// not contended: longer than a place takes to come free on a busy server without hot rows
/// (32 clients on 14 places here: a few milliseconds), short beside a replay's budget.
const QUIET_WAIT: Duration = Duration::from_millis(25);

/// Where a request stands before its transaction begins.
enum Placement {
    /// It may begin, in this place (none: the store has no admission).
    Place(Option<Admitted>),
    /// No place was free, and the key has a record: answered from it.
    Stored(Record),
}

impl<S: IdempotencyStore + 'static> Guard<S> {
    /// The guard of a one-transaction request: the key is held by `tx` alone (no claim record,
    /// so no heartbeat and nothing to release), as `hold` says, and the response is inserted in
    /// it. `place`: the transaction's place among those admitted at once (`None` on a store
    /// without admission).
    fn in_transaction(
        shared: Arc<Shared<S>>,
        claim: KeyClaim,
        hold: Hold,
        tx: Box<dyn StoreTransaction>,
        place: Option<Admitted>,
    ) -> Self {
        let in_flight = Some(shared.in_flight.enter());
        Guard {
            shared,
            claim,
            heartbeat: None,
            started_driver: false,
            transaction: Some(TransactionSlot::opened(tx)),
            holding: true,
            hold,
            charge: None,
            in_flight,
            admitted: place.map(|place| Arc::new(std::sync::Mutex::new(Some(place)))),
        }
    }

    /// Stores the answer of a request whose transaction rolled back (its writes discarded):
    /// with the lease mode's claim, which held the key throughout; in the one-transaction
    /// modes the key is claimed first, and if another request took it since the rollback, the
    /// client gets what that request stands for.
    pub(super) async fn store_after_rollback(&self, response: StoredResponse) -> Completion {
        let shared = &self.shared;
        match self.claim_after_transaction().await {
            None | Some(Ok(ClaimOutcome::Claimed)) => {}
            Some(Ok(ClaimOutcome::Existing(record))) => {
                tracing::debug!(
                    backend = shared.store.backend(),
                    "another request took the key after the discarded writes rolled back: \
                     answering with what it stands for"
                );
                return Completion::Superseded(self.superseded_by(record));
            }
            Some(Err(error)) => {
                tracing::warn!(
                    backend = shared.store.backend(),
                    error = %ErrorChain(&error),
                    "could not claim the key to store the answer whose writes were discarded"
                );
                // The claim may have landed: fenced by the token, so only ours goes.
                spawn_release(
                    Arc::clone(shared),
                    self.claim.clone(),
                    "discard not claimed",
                );
                return Completion::RolledBack(RollbackCause::Store);
            }
        }
        self.store(response).await
    }

    /// In the one-transaction modes the key's only hold was the request's transaction, which
    /// is gone: claims the key with this request's token, so the response can be stored.
    /// `None` in the lease mode, whose claim's record holds the key throughout.
    async fn claim_after_transaction(&self) -> Option<Result<ClaimOutcome, StoreError>> {
        let fingerprint = self.hold.fingerprint()?;
        let (shared, claim) = (&self.shared, &self.claim);
        // The claim ends with the engine's lease from the moment it is sent: if storing the
        // response then fails, the background store stops when another request may hold the key.
        claim.reclaimed(tokio::time::Instant::now(), shared.config.lease);
        let claimed = shared.store.claim(
            claim.scope(),
            claim.key(),
            &fingerprint,
            claim.token(),
            shared.config.lease,
        );
        Some(shared.call(StoreOp::Claim, claimed).await)
    }

    /// Stores the response outside the request's transaction, which the handler committed
    /// itself: its writes stand, so the response goes to its client even if another request
    /// took the key. The one-transaction mode holds no record yet: the key is claimed with this
    /// request's token first.
    pub(super) async fn store_after_handler_commit(&self, response: StoredResponse) -> Completion {
        match self.claim_after_transaction().await {
            None | Some(Ok(ClaimOutcome::Claimed)) => {}
            Some(Ok(ClaimOutcome::Existing(_))) => {
                return self.lost("another request took the key after the handler's COMMIT");
            }
            Some(Err(error)) => {
                tracing::error!(
                    backend = self.shared.store.backend(),
                    error = %ErrorChain(&error),
                    "could not record the key after the handler's own COMMIT: a retry of \
                     this request will run it again"
                );
                return Completion::Stale;
            }
        }
        self.store(response).await
    }
}
