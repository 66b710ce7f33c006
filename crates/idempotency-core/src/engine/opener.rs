//! Opening a request's transaction, on first use.

use super::Shared;
use super::key_claim::KeyClaim;
use crate::IdempotencyStore;
use crate::store::StoreOp;
use crate::transaction::{OpenFuture, Opener, TransactionError};
use std::sync::Arc;

/// Opens a claim's transaction on first use.
pub(crate) struct TxOpener<S> {
    pub(crate) shared: Arc<Shared<S>>,
    pub(crate) lease: KeyClaim,
}

impl<S: IdempotencyStore + 'static> Opener for TxOpener<S> {
    fn open(&self) -> OpenFuture<'_> {
        Box::pin(async move {
            let Some(store) = self.shared.store.transactional() else {
                return Err(TransactionError::Unavailable);
            };
            if !self.lease.is_held() {
                return Err(TransactionError::LeaseLost);
            }
            let lease = &self.lease;
            let begun = self
                .shared
                .call(
                    StoreOp::BeginTransaction,
                    store.begin_transaction(
                        lease.scope(),
                        lease.key(),
                        lease.token(),
                        self.shared.config.lease,
                    ),
                )
                .await;
            match begun {
                Ok(Some(tx)) => Ok(tx),
                Ok(None) => {
                    lease.mark_lost();
                    Err(TransactionError::LeaseLost)
                }
                Err(error) => Err(TransactionError::Store(error)),
            }
        })
    }
}
