//! How a guard stores a response outside a transaction: now, or, when the store fails while
//! the claim still holds the key, in the background until its lease runs out.

use super::{Completion, Guard};
use crate::engine::protocol;
use crate::engine::retry::retry_until;
use crate::error::ErrorChain;
use crate::response::StoredResponse;
use crate::store::FenceOutcome;
use crate::store::IdempotencyStore;
use std::sync::Arc;

impl<S: IdempotencyStore + 'static> Guard<S> {
    /// Stores the response without a transaction; on failure keeps the claim and retries in
    /// the background.
    pub(in crate::engine) async fn store(&self, response: StoredResponse) -> Completion {
        let shared = &self.shared;
        match shared.complete(&self.claim, &response).await {
            Ok(outcome) => {
                let completion = protocol::after_store(Ok(outcome), true);
                if completion == Completion::Stale {
                    self.lost("the response was not stored");
                }
                completion
            }
            Err(error) => {
                let within_lease = tokio::time::Instant::now() < self.claim.deadline();
                let completion = protocol::after_store(Err(&error), within_lease);
                if completion == Completion::Deferred {
                    tracing::warn!(
                        backend = shared.store.backend(),
                        error = %ErrorChain(&error),
                        "could not store the response; the key stays claimed and storing is \
                         retried in the background until its lease runs out"
                    );
                    self.spawn_deferred_store(response);
                    return completion;
                }
                tracing::warn!(
                    backend = shared.store.backend(),
                    error = %ErrorChain(&error),
                    "could not store the response, and the lease has run out by this process's \
                     clock: another request may hold the key, so the client is told to retry"
                );
                self.lost("the response was not stored")
            }
        }
    }

    /// Retries storing the response in the background while the claim holds the key.
    fn spawn_deferred_store(&self, response: StoredResponse) {
        let shared = Arc::clone(&self.shared);
        let claim = self.claim.clone();
        let until = claim.deadline();
        let tasks = shared.tasks.clone();
        tasks.spawn(async move {
            let stored = retry_until(until, || shared.complete(&claim, &response)).await;
            let backend = shared.store.backend();
            let label = match stored {
                Ok(FenceOutcome::Applied) => {
                    tracing::info!(backend, "stored the response after the store recovered");
                    shared.waiters.wake(claim.scope(), claim.key());
                    "deferred_stored"
                }
                Ok(FenceOutcome::Stale) => {
                    tracing::warn!(
                        backend,
                        "the lease ran out before the response could be stored"
                    );
                    "deferred_stale"
                }
                Err(error) => {
                    tracing::error!(
                        backend,
                        error = %ErrorChain(&error),
                        "could not store the response before the lease ran out: a retry of this \
                         request will run it again"
                    );
                    "deferred_failed"
                }
            };
            metrics::counter!("idempotency_completions_total", "result" => label).increment(1);
        });
    }

    /// The lease was lost before the request finished: the client is told so.
    pub(in crate::engine) fn lost(&self, what: &'static str) -> Completion {
        self.claim.mark_lost();
        tracing::warn!(
            backend = self.shared.store.backend(),
            what,
            "the lease was lost before the request finished; another request may run it"
        );
        Completion::Stale
    }
}
