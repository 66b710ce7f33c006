//! The guard a proceeding request holds: its heartbeat, its transaction, and how its outcome
//! reaches the store (`guard/commit.rs`: ending the request's transaction; `guard/store.rs`:
//! storing a response outside one, now or in the background). What only one claim mode does
//! is in that mode's file: the lease's guard and its release in `lease.rs`, the
//! one-transaction modes' guard and their claim after the transaction in `one_transaction.rs`,
//! the speculative settle in `speculative.rs`.

use super::admission::Place;
use super::heartbeat_schedule::Registration;
use super::in_flight::InFlight;
use super::key_claim::KeyClaim;
use super::limit::Charge;
use super::retry::spawn_release;
use super::shared::Shared;
use crate::engine::config::ReplayPolicy;
use crate::error::ErrorChain;
use crate::response::StoredResponse;
use crate::store::IdempotencyStore;
use crate::store::StoreOp;
use crate::store::StoreTransaction;
use crate::transaction::{Taken, TransactionSlot};
use http::StatusCode;
use std::fmt;
use std::sync::Arc;

pub use super::completion::{Completion, RollbackCause, Superseded};
use hold::Hold;

/// Proof that this request holds the claim on its key, from the claim until its outcome is
/// stored. While it lives, a heartbeat extends the lease (when
/// [`EngineConfig::heartbeat`](crate::EngineConfig#structfield.heartbeat) is on), so neither a slow
/// handler, nor a handler blocking its thread, nor a slow response body lets the lease run out.
///
/// Hand the handler's response to [`Guard::complete`], or give the key back with
/// [`Guard::release`]. A guard dropped without either (a panic, a cancelled future) rolls back
/// its transaction and releases the key in the background; the lease is the last resort.
pub struct Guard<S: IdempotencyStore + 'static> {
    pub(super) shared: Arc<Shared<S>>,
    pub(super) claim: KeyClaim,
    /// Its place in the heartbeat schedule, until it stops.
    pub(super) heartbeat: Option<Registration>,
    /// Registering started the engine's heartbeat driver on this thread.
    pub(super) started_driver: bool,
    pub(super) transaction: Option<TransactionSlot>,
    /// Still holds the claim: neither completed nor released.
    pub(super) holding: bool,
    /// How the key is held.
    pub(super) hold: Hold,
    /// The count this request took from its scope's limit on new keys, given back if its key
    /// turns out not to be new ([`Completion::Superseded`]).
    pub(super) charge: Option<Charge>,
    /// Its place among the keys this process holds in flight, until its outcome is settled.
    pub(super) in_flight: Option<InFlight>,
    /// Its place among the request transactions admitted at once, until the transaction ends
    /// (not the guard: what follows a rollback, a claim of the key, may wait for a pooled
    /// connection, which a request waiting for a place may hold).
    /// Shared with the lease mode's opener, which takes the place when the handler opens the
    /// transaction. `None` on a store without admission (nothing allocated for it).
    pub(super) admitted: Option<Place>,
}

impl<S: IdempotencyStore + 'static> fmt::Debug for Guard<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Guard")
            .field("claim", &self.claim)
            .field("transaction", &self.transaction)
            .finish()
    }
}

impl<S: IdempotencyStore + 'static> Guard<S> {
    /// This request counted against its scope's limit on new keys with `charge`.
    pub(crate) fn charged(mut self, charge: Charge) -> Self {
        self.charge = Some(charge);
        self
    }

    /// The request's transaction ended (`committed`: with its work, or its refusal, stored):
    /// its place goes to the next.
    fn transaction_ended(&self, committed: bool) {
        let Some(Ok(mut admitted)) = self.admitted.as_ref().map(|place| place.lock()) else {
            return;
        };
        // Taken out (and dropped here, which gives it back) whether or not it committed.
        let place = admitted.take();
        if let Some(mut place) = place
            && committed
        {
            place.committed();
        }
    }

    /// Registering this request started the engine's heartbeat driver on this thread.
    pub(crate) fn started_heartbeat_driver(&self) -> bool {
        self.started_driver
    }

    /// The claim as the handler sees it: key, scope, fencing token, whether it is still held.
    pub fn claim(&self) -> &KeyClaim {
        &self.claim
    }

    /// The transaction the handler may write in, when the store is transactional
    /// ([`IdempotencyStore::transactional`]): opened on first use, committed by
    /// [`Guard::complete`] together with the stored response.
    pub fn transaction(&self) -> Option<&TransactionSlot> {
        self.transaction.as_ref()
    }

    /// Whether a response with `status` would be stored under the engine's policy (so a caller
    /// can skip buffering a body that will not be kept).
    pub fn stores(&self, status: StatusCode) -> bool {
        self.shared.config.replay_policy.stores(status)
    }

    /// Stores the handler's response and commits the request's transaction with it when the
    /// handler opened one; releases the key (rolling the transaction back) when the policy does
    /// not store its status. One store round trip on the common path. Never frees a key whose
    /// side effect may stand: if storing fails, the claim is kept and storing is retried in the
    /// background until the lease runs out ([`Completion::Deferred`]).
    pub async fn complete(self, response: StoredResponse) -> Completion {
        if !self.stores(response.status()) {
            return self.release().await;
        }
        self.store_outcome(response, true).await
    }

    /// [`Guard::complete`] under `policy` instead of the engine's: for callers that serve
    /// several routes from one engine, each with its own policy (the tower layer's per-route
    /// variants).
    pub async fn complete_with(
        self,
        policy: &ReplayPolicy,
        response: StoredResponse,
    ) -> Completion {
        if !policy.stores(response.status()) {
            return self.release().await;
        }
        self.store_outcome(response, true).await
    }

    /// [`Guard::complete`] without the replay policy: `response` is stored whatever its status
    /// (`Engine::once` stores values, not HTTP responses).
    /// `warn_unused`: warn when a one-transaction request never took its transaction (an HTTP
    /// handler that forgot it); a job's work may legitimately decide without writing.
    pub(crate) async fn store_outcome(
        mut self,
        response: StoredResponse,
        warn_unused: bool,
    ) -> Completion {
        // The heartbeat goes on until the response is stored: a slow store call must not let
        // the lease lapse while it runs.
        self.claim.completing();
        let discard = self
            .transaction
            .as_ref()
            .is_some_and(TransactionSlot::discards_writes);
        let completion = match self.take_transaction().await {
            // Boxed: settling and committing a transaction is most of this future's state, and
            // a store without transactions (memory, Redis) never gets here; inline, every
            // request's future would carry its size. One allocation beside a database commit.
            Taken::Open { tx, used } => {
                Box::pin(self.commit_transaction(tx, used, response, discard, warn_unused)).await
            }
            Taken::Busy => self.transaction_busy(),
            Taken::Unopened | Taken::Closed if !self.hold.has_claim_record() => {
                tracing::error!(
                    backend = self.shared.store.backend(),
                    "the request's transaction was closed before its response could be stored"
                );
                Completion::TransactionMisused
            }
            Taken::Unopened | Taken::Closed => self.store(response).await,
        };
        self.stop_heartbeat();
        self.finish(completion)
    }

    /// The request's open transaction at completion: settles the key's lookup (speculative),
    /// then commits the transaction with the response (or, when the handler's writes are to be
    /// discarded, stores the response without them).
    async fn commit_transaction(
        &self,
        tx: Box<dyn StoreTransaction>,
        used: bool,
        response: StoredResponse,
        discard: bool,
        warn_unused: bool,
    ) -> Completion {
        let tx = match self.settle(tx).await {
            Ok(tx) => tx,
            Err(answer) => return answer,
        };
        if discard {
            return self.store_without_writes(tx, response).await;
        }
        if !used && warn_unused && !self.hold.has_claim_record() {
            tracing::warn!(
                backend = self.shared.store.backend(),
                "ClaimMode::OneTransaction: the handler never took the request's \
                 transaction, so whatever it did is outside it and not made once by it; \
                 use ClaimMode::Lease for handlers whose side effects are not writes in \
                 the transaction"
            );
        }
        self.commit(tx, response).await
    }

    /// Gives the key back so a retry can run at once, rolling back the request's transaction
    /// first. Call it when the side effect did not happen (the handler failed); a failed
    /// release is retried in the background until the lease runs out. In the speculative
    /// one-transaction mode the key may turn out to be another's (its lookup is read only
    /// now): then [`Completion::Superseded`], the answer the request gets instead.
    pub async fn release(self) -> Completion {
        // Boxed: the release's state (a rollback, the lookup's settling, a store call) is
        // larger than the rest of most callers' futures, and it runs on the less common paths
        // (a status not stored, a failed handler); inline, every request's future would carry
        // its size, copied whenever the future is moved or boxed.
        Box::pin(self.release_now()).await
    }

    async fn release_now(mut self) -> Completion {
        self.stop_heartbeat();
        match self.take_transaction().await {
            Taken::Open { tx, .. } => match self.settle(tx).await {
                Ok(tx) => self.rollback(tx).await,
                // The key was taken: the stored answer, not the handler's.
                Err(answer) => return self.finish(answer),
            },
            // It can never commit: only the engine commits, and it gives up on it here.
            Taken::Busy => tracing::warn!(
                "the handler still holds its transaction; it rolls back when the handler drops it"
            ),
            Taken::Unopened | Taken::Closed => {}
        }
        if !self.hold.has_claim_record() {
            // The transaction was the only hold on the key: rolled back, the key is free.
            return self.finish(Completion::Released);
        }
        let completion = self.release_claim().await;
        self.finish(completion)
    }

    async fn take_transaction(&mut self) -> Taken {
        match self.transaction.take() {
            Some(slot) => slot.take(self.shared.config.store_timeout).await,
            None => Taken::Unopened,
        }
    }

    fn stop_heartbeat(&mut self) {
        if let Some(registration) = self.heartbeat.take() {
            self.shared.heartbeats.finished(&self.claim, registration);
        }
    }

    fn leave_in_flight(&mut self) {
        if let Some(entry) = self.in_flight.take() {
            self.shared.in_flight.leave(entry);
        }
    }

    fn finish(mut self, completion: Completion) -> Completion {
        self.holding = false;
        self.leave_in_flight();
        // Its duplicates waiting on this process ask the store now (stored: they replay;
        // released: one of them runs).
        self.shared
            .waiters
            .wake(self.claim.scope(), self.claim.key());
        if let (Completion::Superseded(_), Some(charge), Some(limiter)) =
            (&completion, self.charge.take(), &self.shared.limiter)
        {
            // Another request's key (a replay, a mismatch, a duplicate): not a new key.
            limiter.refund(self.claim.scope(), charge);
        }
        self.claim.finish();
        completion.count();
        completion
    }
}

impl<S: IdempotencyStore + 'static> Drop for Guard<S> {
    fn drop(&mut self) {
        self.stop_heartbeat();
        self.leave_in_flight();
        if !self.holding {
            return;
        }
        self.claim.finish();
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(
                "guard dropped outside a Tokio runtime: the key frees when its lease runs out"
            );
            return;
        };
        let shared = Arc::clone(&self.shared);
        let claim = self.claim.clone();
        let transaction = self.transaction.take();
        let release = self.hold.has_claim_record();
        let tasks = shared.tasks.clone();
        tasks.spawn_on(
            async move {
                let open = match transaction {
                    Some(slot) => slot.take(shared.config.store_timeout).await,
                    None => Taken::Unopened,
                };
                if let Taken::Open { tx, .. } = open
                    && let Err(error) = shared.call(StoreOp::Rollback, tx.rollback()).await
                {
                    tracing::warn!(error = %ErrorChain(&error), "could not roll back a dropped request's transaction; it ends with its connection");
                }
                if release {
                    // Wakes the key's waiting duplicates once the release is applied.
                    spawn_release(shared, claim, "dropped guard");
                } else {
                    // The transaction was the key's only hold: rolled back, the key is free.
                    shared.waiters.wake(claim.scope(), claim.key());
                }
            },
            &runtime,
        );
    }
}

mod commit;
pub(super) mod hold;
mod store;
#[cfg(test)]
mod tests;
