//! How a guard that holds a transaction ends it: the response stored and committed with the
//! handler's writes, stored after a handler that committed itself, or the claim released after
//! a rollback.

use super::{Completion, Guard, Hold, RollbackCause, Superseded};
use crate::engine::one_transaction::TRANSACTION_RETRY_AFTER;
use crate::engine::protocol::{self, Judged, judge};
use crate::engine::retry::spawn_release;
use crate::store::{ClaimOutcome, CommitOutcome, DiscardOutcome, Record, StoreTransaction};
use crate::store::{Settled, StoreOp};
use crate::{ErrorChain, IdempotencyStore, StoreError, StoredResponse};
use std::sync::Arc;

impl<S: IdempotencyStore + 'static> Guard<S> {
    /// What the request answers when `record` stands for its key instead of its own.
    fn superseded_by(&self, record: Record) -> Superseded {
        let judged = match self.hold.fingerprint() {
            Some(fingerprint) => judge(record, &fingerprint, self.shared.config.retention),
            // Only the one-transaction modes insert records at commit time.
            None => Judged::Mismatch,
        };
        protocol::superseded(judged)
    }

    /// For a speculative transaction, waits for the key's lookup: the transaction back when
    /// the key is this request's, or the answer the request gets instead (the transaction
    /// rolled back, none of the handler's writes standing).
    pub(super) async fn settle(
        &self,
        mut tx: Box<dyn StoreTransaction>,
    ) -> Result<Box<dyn StoreTransaction>, Completion> {
        if !matches!(self.hold, Hold::Speculative { .. }) {
            return Ok(tx);
        }
        let shared = &self.shared;
        match shared.call(StoreOp::Settle, tx.settle()).await {
            Ok(Settled::Proceed) => Ok(tx),
            Ok(Settled::Existing(record)) => {
                tracing::debug!(
                    backend = shared.store.backend(),
                    "the key was taken before the speculative request: its writes rolled back"
                );
                Err(Completion::Superseded(self.superseded_by(record)))
            }
            Ok(Settled::Busy) => Err(Completion::Superseded(Superseded::InFlight {
                retry_after: TRANSACTION_RETRY_AFTER.min(shared.config.in_flight_retry_after),
            })),
            Err(error) => {
                tracing::warn!(
                    backend = shared.store.backend(),
                    error = %ErrorChain(&error),
                    "the key's lookup failed: the request's transaction is rolled back"
                );
                self.rollback(tx).await;
                Err(Completion::RolledBack(RollbackCause::Store))
            }
        }
    }

    /// Stores the response in the request's transaction and commits both.
    pub(super) async fn commit(
        &self,
        tx: Box<dyn StoreTransaction>,
        response: StoredResponse,
    ) -> Completion {
        let shared = &self.shared;
        let committed = shared
            .call(
                StoreOp::Commit,
                tx.complete_and_commit(&response, shared.config.retention),
            )
            .await;
        self.transaction_ended(matches!(
            committed,
            Ok(CommitOutcome::Committed | CommitOutcome::CommittedByHandler)
        ));
        match committed {
            Ok(CommitOutcome::Committed) => Completion::Stored,
            Ok(CommitOutcome::Superseded(record)) => {
                tracing::debug!(
                    backend = shared.store.backend(),
                    "another request completed the key first; the transaction rolled back"
                );
                Completion::Superseded(self.superseded_by(record))
            }
            Ok(CommitOutcome::LeaseLost) => {
                self.lost("the transaction was rolled back");
                Completion::RolledBack(RollbackCause::LeaseLost)
            }
            Ok(CommitOutcome::CommittedByHandler) => {
                tracing::error!(
                    backend = shared.store.backend(),
                    "the handler committed the idempotency transaction itself (a raw COMMIT): its \
                     writes up to it exist (and any statement it ran after it outside a \
                     transaction), so the response is stored after them, outside the \
                     transaction (a crash in between would let a retry run again). Never end \
                     the request's transaction in the handler"
                );
                self.store_after_handler_commit(response).await
            }
            Ok(CommitOutcome::RolledBackByHandler) => {
                tracing::error!(
                    backend = shared.store.backend(),
                    "the handler rolled the idempotency transaction back itself (a raw \
                     ROLLBACK): its writes before it were undone, but any statement it ran after \
                     it ran outside a transaction and committed on its own (those writes stand, \
                     and the retry will make them again). Nothing is stored and the key is \
                     released for the retry. Never end the request's transaction in the handler"
                );
                if !self.hold.is_transaction() {
                    self.release_claim().await;
                }
                Completion::TransactionMisused
            }
            Ok(CommitOutcome::EndedByHandler) => {
                tracing::error!(
                    backend = shared.store.backend(),
                    "the handler ended the idempotency transaction itself (COMMIT or ROLLBACK): \
                     its writes and the response cannot be tied together, so nothing was stored \
                     and the key stays claimed until its lease runs out. Never end the \
                     request's transaction in the handler"
                );
                Completion::TransactionMisused
            }
            Err(error) => {
                // A timeout or a lost connection: the COMMIT may have happened. Anything else
                // is the database's own refusal, which ended the transaction uncommitted.
                let unknown = error.is_unreachable();
                if unknown {
                    tracing::warn!(
                        backend = shared.store.backend(),
                        error = %ErrorChain(&error),
                        "the request's COMMIT was not confirmed: it may or may not have happened"
                    );
                } else {
                    tracing::warn!(
                        backend = shared.store.backend(),
                        error = %ErrorChain(&error),
                        "the request's transaction did not commit"
                    );
                }
                if !self.hold.is_transaction() {
                    // Fenced by the token: if the commit did happen after all, the record is
                    // completed and no longer carries the token, so nothing is released and
                    // the retry replays; otherwise the retry runs.
                    spawn_release(
                        Arc::clone(shared),
                        self.claim.clone(),
                        "transaction not committed",
                    );
                }
                protocol::after_failed_commit(&error)
            }
        }
    }

    /// Rolls the handler's writes back and stores the response on its own
    /// ([`TransactionSlot::discard_writes`](crate::TransactionSlot::discard_writes)), the key held
    /// from its lookup until the record lands: the store writes the record before its
    /// transaction lets the key go where it can; otherwise the key is claimed right after the
    /// rollback, and a request that took it in between is what the client is answered with
    /// (one answer per key: a refusal never stands beside a committed effect).
    pub(super) async fn store_without_writes(
        &self,
        tx: Box<dyn StoreTransaction>,
        response: StoredResponse,
    ) -> Completion {
        let shared = &self.shared;
        let discarded = shared
            .call(
                StoreOp::Commit,
                tx.discard_writes_and_store(&response, shared.config.retention),
            )
            .await;
        self.transaction_ended(matches!(discarded, Ok(DiscardOutcome::Stored)));
        match discarded {
            Ok(DiscardOutcome::Stored) => Completion::Stored,
            Ok(DiscardOutcome::Superseded(record)) => {
                Completion::Superseded(self.superseded_by(record))
            }
            Ok(DiscardOutcome::RolledBack) => self.store_after_rollback(response).await,
            Err(error) => {
                tracing::warn!(
                    backend = shared.store.backend(),
                    error = %ErrorChain(&error),
                    "could not store the answer whose writes were discarded; they are rolled back"
                );
                if !self.hold.is_transaction() {
                    // The claim's record still holds the key: give it back for the retry.
                    spawn_release(Arc::clone(shared), self.claim.clone(), "discard not stored");
                }
                protocol::after_failed_commit(&error)
            }
        }
    }

    /// Stores the answer of a request whose transaction rolled back (its writes discarded):
    /// with the lease mode's claim, which held the key throughout; in the one-transaction
    /// modes the key is claimed first, and if another request took it since the rollback, the
    /// client gets what that request stands for.
    async fn store_after_rollback(&self, response: StoredResponse) -> Completion {
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

    pub(super) async fn rollback(&self, tx: Box<dyn StoreTransaction>) {
        let rolled_back = self.shared.call(StoreOp::Rollback, tx.rollback()).await;
        self.transaction_ended(false);
        if let Err(error) = rolled_back {
            // The transaction cannot commit any more: a failed rollback ends with its
            // connection, and the server rolls it back.
            tracing::warn!(
                backend = self.shared.store.backend(),
                error = %ErrorChain(&error),
                "could not roll back the request's transaction; it ends with its connection"
            );
        }
    }

    pub(super) fn transaction_busy(&self) -> Completion {
        tracing::error!(
            backend = self.shared.store.backend(),
            "the handler still holds its idempotency transaction after returning its response \
             (a Transaction kept in a spawned task or in the response body): nothing was stored \
             and the key stays claimed until its lease runs out"
        );
        Completion::TransactionMisused
    }
}
