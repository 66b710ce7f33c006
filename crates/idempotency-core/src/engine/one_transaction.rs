//! [`Engine::begin`] in [`ClaimMode::OneTransaction`]: the key's lookup opens the request's
//! transaction, and nothing is written before the handler's own writes.

use super::admission::Admitted;
use super::config::ClaimMode;
use super::guard::Guard;
use super::key_claim::KeyClaim;
use super::protocol::{Judged, TRANSACTION_RETRY_AFTER, judge};
use super::wait::{Next, WaitForKey};
use super::{Begin, Engine};
use crate::error::StoreError;
use crate::fingerprint::Fingerprint;
use crate::key::IdempotencyKey;
use crate::record::LeaseToken;
use crate::scope::Scope;
use crate::store::IdempotencyStore;
use crate::store::StoreOp;
use crate::store::{OneTransactionBegin, Record};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// The length given to the [`KeyClaim`] of a request in the one-transaction mode: its key is held
/// by its open transaction, which has no end but its own, so the lease never runs out.
const NO_LEASE_END: Duration = Duration::from_secs(30 * 365 * 86_400);

impl<S: IdempotencyStore + 'static> Engine<S> {
    /// [`Engine::begin`] in [`ClaimMode::OneTransaction`]: one round trip opens the request's
    /// transaction and reads the key in it; nothing is written before the handler's own writes.
    /// A duplicate finds the key's lock held (in flight) or its record (replay, or mismatch);
    /// waiting for it follows [`EngineConfig::in_flight_wait`](crate::EngineConfig#structfield.in_flight_wait) as in the lease mode.
    pub(super) async fn begin_in_transaction(
        &self,
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
        // `Engine::new` refused the speculative mode with a wait, or on a store that cannot
        // queue the lookup.
        let speculative = shared.config.claim_mode == ClaimMode::OneTransactionSpeculative;
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
                .call(StoreOp::BeginTransaction, async {
                    if speculative {
                        store
                            .begin_one_transaction_speculative(
                                &scope,
                                &key,
                                &fingerprint,
                                token,
                                hold,
                            )
                            .await
                    } else {
                        store
                            .begin_one_transaction(&scope, &key, &fingerprint, token, hold)
                            .await
                    }
                })
                .await;
            let running = match begun {
                Ok(OneTransactionBegin::Absent(tx)) => {
                    let claim = KeyClaim::new(scope, key, token, NO_LEASE_END, started);
                    let guard = Guard::in_transaction(
                        Arc::clone(shared),
                        claim,
                        fingerprint,
                        tx,
                        speculative,
                    );
                    let guard = match place {
                        Some(place) => guard.admitted(place),
                        None => guard,
                    };
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
