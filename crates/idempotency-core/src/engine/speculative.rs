//! [`ClaimMode::OneTransactionSpeculative`](crate::ClaimMode::OneTransactionSpeculative), what
//! only it does: the key's lookup is queued with the handler's first statement
//! ([`SpeculativeMode`]), so the handler starts before the lookup is answered, the transaction
//! is settled before anything of it counts, and a lookup that does not come back in time is
//! said to the caller. Its begin loop and the rest of its guard's life are the one-transaction
//! modes' (`one_transaction.rs`).

use super::completion::{Completion, RollbackCause, Superseded};
use super::guard::Guard;
use super::guard::hold::Hold;
use super::one_transaction::TransactionMode;
use super::protocol::TRANSACTION_RETRY_AFTER;
use super::{Begin, Engine};
use crate::error::{ErrorChain, StoreError};
use crate::fingerprint::Fingerprint;
use crate::key::IdempotencyKey;
use crate::record::LeaseToken;
use crate::scope::Scope;
use crate::store::{IdempotencyStore, OneTransactionBegin, TransactionalStore};
use crate::store::{Settled, StoreOp, StoreTransaction};
use futures_util::future::BoxFuture;
use std::time::Duration;

/// The speculative mode's begin: the lookup rides with the handler's first statement
/// ([`TransactionalStore::begin_one_transaction_speculative`]), and the guard holds its
/// [`LookupSignal`](crate::store::LookupSignal).
struct SpeculativeMode;

impl TransactionMode for SpeculativeMode {
    fn open<'a>(
        &self,
        store: &'a dyn TransactionalStore,
        scope: &'a Scope,
        key: &'a IdempotencyKey,
        fingerprint: &'a Fingerprint,
        token: LeaseToken,
        hold: Duration,
    ) -> BoxFuture<'a, Result<OneTransactionBegin, StoreError>> {
        // `Engine::new` refused the mode with a wait, or on a store that cannot queue the
        // lookup.
        store.begin_one_transaction_speculative(scope, key, fingerprint, token, hold)
    }

    fn hold(&self, fingerprint: Fingerprint, tx: &dyn StoreTransaction) -> Hold {
        Hold::Speculative {
            fingerprint,
            lookup: tx.lookup_signal(),
        }
    }
}

impl<S: IdempotencyStore + 'static> Engine<S> {
    /// [`Engine::begin`] in the speculative mode: the one-transaction modes' loop, opening
    /// with [`SpeculativeMode`] (its own future, with no other around it).
    pub(super) fn begin_speculative(
        &self,
        scope: Scope,
        key: IdempotencyKey,
        fingerprint: Fingerprint,
    ) -> impl Future<Output = Result<Begin<S>, StoreError>> + Send + '_ {
        self.begin_with_transaction(&SpeculativeMode, scope, key, fingerprint)
    }
}

impl<S: IdempotencyStore + 'static> Guard<S> {
    /// In the speculative one-transaction mode, while the key's lookup is on its way: a future
    /// that resolves if the store timeout passes without its answer (a frozen database, a
    /// locked key table). The handler's statements wait behind the lookup and nothing else
    /// bounds them, so a caller that must answer in time (the HTTP layer) answers then that the
    /// outcome is not known yet, and lets the request run on: it commits only if its lookup
    /// finds the key free, so the client's retry with the same key learns the truth. `None` in
    /// the other modes, or when the lookup was already answered.
    pub fn lookup_overdue(&self) -> Option<impl Future<Output = ()> + Send + 'static> {
        let Hold::Speculative {
            lookup: Some(lookup),
            ..
        } = &self.hold
        else {
            return None;
        };
        if lookup.is_answered() {
            return None;
        }
        let (lookup, timeout) = (lookup.clone(), self.shared.config.store_timeout);
        Some(async move {
            if tokio::time::timeout(timeout, lookup.answered())
                .await
                .is_ok()
            {
                std::future::pending::<()>().await;
            }
        })
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
}
