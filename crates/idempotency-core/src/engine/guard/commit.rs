//! How a guard that holds a transaction ends it: the response stored and committed with the
//! handler's writes, or stored without them, and the claim released after a rollback.
//! (`speculative.rs` settles a speculative transaction first; `one_transaction.rs` claims the
//! key again in the one-transaction modes once their transaction is gone, and `lease.rs`
//! releases a lease-mode claim.)

use super::{Completion, Guard, RollbackCause, Superseded};
use crate::engine::protocol::{self, Judged, judge};
use crate::error::ErrorChain;
use crate::response::StoredResponse;
use crate::store::IdempotencyStore;
use crate::store::{CommitOutcome, DiscardOutcome, Record, StoreOp, StoreTransaction};

impl<S: IdempotencyStore + 'static> Guard<S> {
    /// What the request answers when `record` stands for its key instead of its own.
    pub(in crate::engine) fn superseded_by(&self, record: Record) -> Superseded {
        let judged = match self.hold.fingerprint() {
            Some(fingerprint) => judge(record, &fingerprint, self.shared.config.retention),
            // Only the one-transaction modes insert records at commit time.
            None => Judged::Mismatch,
        };
        protocol::superseded(judged)
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
                if self.hold.has_claim_record() {
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
                // Fenced by the token: if the commit did happen after all, the record is
                // completed and no longer carries the token, so nothing is released and the
                // retry replays; otherwise the retry runs.
                self.release_in_background("transaction not committed");
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
                self.release_in_background("discard not stored");
                protocol::after_failed_commit(&error)
            }
        }
    }

    pub(in crate::engine) async fn rollback(&self, tx: Box<dyn StoreTransaction>) {
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
