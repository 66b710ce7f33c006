//! Opening a request's transaction, on first use.

use super::admission::Place;
use super::key_claim::KeyClaim;
use super::shared::Shared;
use crate::error::StoreError;
use crate::store::IdempotencyStore;
use crate::store::StoreOp;
use crate::transaction::{OpenFuture, Opener, TransactionError};
use std::sync::Arc;

/// Opens a claim's transaction on first use.
pub(crate) struct TxOpener<S> {
    pub(crate) shared: Arc<Shared<S>>,
    pub(crate) claim: KeyClaim,
    /// Where the transaction's place among those admitted at once goes: the guard's, which
    /// gives it back when the transaction ends; `None` on a store without admission.
    pub(crate) admitted: Option<Place>,
}

impl<S: IdempotencyStore + 'static> Opener for TxOpener<S> {
    fn open(&self) -> OpenFuture<'_> {
        Box::pin(async move {
            let Some(store) = self.shared.store.transactional() else {
                return Err(TransactionError::Unavailable);
            };
            if !self.claim.is_held() {
                return Err(TransactionError::LeaseLost);
            }
            if let (Some(admission), Some(admitted)) = (&self.shared.admission, &self.admitted) {
                let place = match admission.try_admit() {
                    Some(place) => place,
                    None => {
                        let waited = self.shared.config.store_timeout;
                        admission.admit(waited).await.ok_or_else(|| {
                            TransactionError::Store(StoreError::Busy {
                                backend: self.shared.store.backend(),
                                limit: admission.limit(),
                                waited,
                            })
                        })?
                    }
                };
                if let Ok(mut admitted) = admitted.lock() {
                    *admitted = Some(place);
                }
            }
            let claim = &self.claim;
            let begun = self
                .shared
                .call(
                    StoreOp::BeginTransaction,
                    store.begin_transaction(
                        claim.scope(),
                        claim.key(),
                        claim.token(),
                        self.shared.config.lease,
                    ),
                )
                .await;
            match begun {
                Ok(Some(tx)) => Ok(tx),
                Ok(None) => {
                    claim.mark_lost();
                    Err(TransactionError::LeaseLost)
                }
                Err(error) => Err(TransactionError::Store(error)),
            }
        })
    }
}
