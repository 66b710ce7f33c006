//! The one-transaction modes after their transaction is gone without the response: the key's
//! only hold went with it, so it is claimed with the request's token before the response is
//! stored, and a request that took the key in between is what the client is answered with.

use super::{Completion, Guard, RollbackCause};
use crate::engine::retry::spawn_release;
use crate::error::{ErrorChain, StoreError};
use crate::response::StoredResponse;
use crate::store::IdempotencyStore;
use crate::store::{ClaimOutcome, StoreOp};
use std::sync::Arc;

impl<S: IdempotencyStore + 'static> Guard<S> {
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
