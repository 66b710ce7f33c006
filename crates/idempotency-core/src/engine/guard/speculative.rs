//! What only the speculative one-transaction mode does: its handler starts before the key's
//! lookup is answered, so the transaction is settled before anything of it counts, and a
//! lookup that does not come back in time is said to the caller.

use super::hold::Hold;
use super::{Completion, Guard, RollbackCause, Superseded};
use crate::engine::protocol::TRANSACTION_RETRY_AFTER;
use crate::error::ErrorChain;
use crate::store::IdempotencyStore;
use crate::store::{Settled, StoreOp, StoreTransaction};

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
