//! [`ClaimMode::Lease`](super::ClaimMode::Lease): the claim is a record written before the
//! handler runs, held by a lease the heartbeat renews; a duplicate reads it (replay, mismatch,
//! or in flight and waited for). Here, [`Engine::begin`] in this mode, its guard, and the
//! claim's release.

use super::admission::Place;
use super::completion::Completion;
use super::guard::Guard;
use super::guard::hold::Hold;
use super::key_claim::KeyClaim;
use super::opener::TxOpener;
use super::pending::PendingClaim;
use super::protocol::{self, Judged, judge};
use super::retry::spawn_release;
use super::shared::Shared;
use super::wait::{FIRST_POLL, Next, WaitForKey};
use super::{Begin, Engine};
use crate::error::{ErrorChain, StoreError};
use crate::fingerprint::Fingerprint;
use crate::key::IdempotencyKey;
use crate::record::LeaseToken;
use crate::scope::Scope;
use crate::store::{ClaimOutcome, IdempotencyStore, StoreOp};
use crate::transaction::TransactionSlot;
use std::sync::Arc;
use tokio::time::Instant;

impl<S: IdempotencyStore + 'static> Engine<S> {
    /// [`Engine::begin`] in the lease mode: one claim round trip when the key is new, or when
    /// no waiting is configured; a duplicate of a running request waits as
    /// [`EngineConfig::in_flight_wait`](crate::EngineConfig#structfield.in_flight_wait) says
    /// (the one policy of `wait.rs`), asking again when woken or when its poll is due.
    pub(super) async fn begin_with_lease(
        &self,
        scope: Scope,
        key: IdempotencyKey,
        fingerprint: Fingerprint,
    ) -> Result<Begin<S>, StoreError> {
        let config = &self.shared.config;
        let started = Instant::now();
        let mut pending = PendingClaim {
            shared: &self.shared,
            claim: Some((scope, key, LeaseToken::new())),
            sent_at: started,
            in_doubt: false,
        };
        let mut wait = WaitForKey::new(&self.shared.waiters, started, config.in_flight_wait);
        loop {
            let Some((scope, key, token)) = pending.claim.as_ref() else {
                unreachable!("the pending claim is only taken when begin returns")
            };
            let woken = wait.arm();
            if wait.seen_running().is_some() {
                // A claim sent again after waiting.
                pending.sent_at = Instant::now();
            }
            pending.in_doubt = true;
            let outcome = self
                .shared
                .call(
                    StoreOp::Claim,
                    self.shared
                        .store
                        .claim(scope, key, &fingerprint, *token, config.lease),
                )
                .await;
            let record = match outcome {
                Ok(ClaimOutcome::Claimed) => {
                    let guard = pending.into_guard();
                    if guard.started_heartbeat_driver() {
                        // A task spawned on a worker thread sits in that worker's LIFO slot,
                        // which no other worker can steal from: if the handler then blocks this
                        // thread, the heartbeat driver would never start. Yielding once lets it
                        // start (arming its timer), so its later wake-ups run on any free
                        // worker. Only the request that started the driver pays for this.
                        tokio::task::yield_now().await;
                    }
                    return self.admitted(guard).await;
                }
                Ok(ClaimOutcome::Existing(record)) => {
                    pending.in_doubt = false;
                    record
                }
                Err(error) => {
                    return match wait.seen_running() {
                        Some(retry_after) => {
                            tracing::debug!(
                                error = %crate::error::ErrorChain(&error),
                                "the store failed while waiting for a running duplicate; answering in flight"
                            );
                            Ok(Begin::InFlight { retry_after })
                        }
                        // `pending` is dropped armed: the claim may have been made.
                        None => Err(error),
                    };
                }
            };
            match judge(record, &fingerprint, config.retention) {
                Judged::Mismatch => {
                    pending.disarm();
                    return Ok(Begin::Mismatch);
                }
                Judged::Replay(response) => {
                    pending.disarm();
                    return Ok(Begin::Replay(response));
                }
                Judged::Running(lease_remaining) => {
                    let retry_after = lease_remaining.min(config.in_flight_retry_after);
                    // No nap past the running claim's lease: it may lapse, and this request
                    // then takes the key over.
                    let nap_at_most = lease_remaining.max(FIRST_POLL);
                    match wait
                        .running(scope, key, retry_after, nap_at_most, woken)
                        .await
                    {
                        Next::InFlight(retry_after) => {
                            pending.disarm();
                            return Ok(Begin::InFlight { retry_after });
                        }
                        // Another process's settle then wakes it too, on a store that can
                        // tell (before the store is asked again: a settle after that look is
                        // then heard).
                        Next::Watch => self.shared.watch_settle(scope, key).await,
                        Next::AskAgain => {}
                    }
                }
            }
        }
    }
}

impl<S: IdempotencyStore + 'static> Guard<S> {
    /// The guard of a lease-mode request whose claim record the store just wrote: a heartbeat
    /// extends its lease (when on), and on a transactional store the handler's transaction is
    /// opened on first use, taking its place among those admitted at once then.
    pub(super) fn with_lease(shared: Arc<Shared<S>>, claim: KeyClaim) -> Self {
        let (heartbeat, started_driver) = if shared.config.heartbeat {
            let (registration, started) = shared.heartbeats.register(&shared, &claim);
            (Some(registration), started)
        } else {
            (None, false)
        };
        let admitted: Option<Place> = shared.admission.as_ref().map(|_| Arc::default());
        let transaction = shared.store.transactional().is_some().then(|| {
            TransactionSlot::new(Box::new(TxOpener {
                shared: Arc::clone(&shared),
                claim: claim.clone(),
                admitted: admitted.clone(),
            }))
        });
        let in_flight = Some(shared.in_flight.enter());
        Guard {
            shared,
            claim,
            heartbeat,
            started_driver,
            transaction,
            holding: true,
            hold: Hold::Lease,
            charge: None,
            in_flight,
            admitted,
        }
    }

    /// After the request's transaction ended without its response: a lease-mode claim's record
    /// still holds the key and is released in the background (fenced by its token, retried
    /// until the lease runs out) so the retry can run; in the one-transaction modes the
    /// transaction was the key's only hold and went with it.
    pub(super) fn release_in_background(&self, why: &'static str) {
        if self.hold.has_claim_record() {
            spawn_release(Arc::clone(&self.shared), self.claim.clone(), why);
        }
    }

    /// Releases the claim (fenced by its token) so a retry runs at once; retried in the
    /// background until the lease runs out if the store fails.
    pub(super) async fn release_claim(&self) -> Completion {
        let shared = &self.shared;
        let claim = &self.claim;
        match shared
            .call(
                StoreOp::Release,
                shared
                    .store
                    .release(claim.scope(), claim.key(), claim.token()),
            )
            .await
        {
            Ok(outcome) => {
                let completion = protocol::after_release(Ok(outcome));
                if completion == Completion::Stale {
                    self.lost("the key was not released");
                }
                completion
            }
            Err(error) => {
                tracing::warn!(
                    backend = shared.store.backend(),
                    error = %ErrorChain(&error),
                    "could not release the key; retrying in the background until its lease runs out"
                );
                spawn_release(Arc::clone(shared), claim.clone(), "failed release");
                protocol::after_release(Err(&error))
            }
        }
    }
}
