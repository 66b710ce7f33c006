//! The background retries that keep a claim's promises when a store call fails: a claim
//! nobody holds is given back, a response whose handler ran is stored.

use super::key_claim::KeyClaim;
use super::shared::Shared;
use crate::error::{ErrorChain, StoreError};
use crate::store::FenceOutcome;
use crate::store::IdempotencyStore;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// Runs `attempt` until it succeeds, backing off between failures, as long as another attempt
/// can start before `until`. Returns the last error otherwise.
pub(crate) async fn retry_until<T, F, Fut>(until: Instant, mut attempt: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    let mut backoff = FIRST_BACKOFF;
    loop {
        match attempt().await {
            Ok(value) => return Ok(value),
            Err(error) if Instant::now() + backoff >= until => return Err(error),
            Err(_) => {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
}

/// Releases `claim` in the background, retrying failures until the lease ends
/// (after which the claim frees itself). Fenced by the token, so it never touches another
/// request's claim. Needs a Tokio runtime; without one the key frees when its lease runs out.
pub(crate) fn spawn_release<S: IdempotencyStore + 'static>(
    shared: Arc<Shared<S>>,
    claim: KeyClaim,
    why: &'static str,
) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        tracing::warn!(
            why,
            "no Tokio runtime to release the key on: it frees when its lease runs out"
        );
        return;
    };
    let tasks = shared.tasks.clone();
    tasks.spawn_on(
        async move {
            let released = retry_until(claim.deadline(), || shared.release(&claim)).await;
            let backend = shared.store.backend();
            match released {
                Ok(FenceOutcome::Applied) => {
                    tracing::debug!(backend, why, "released the key");
                    shared.waiters.wake(claim.scope(), claim.key());
                }
                Ok(FenceOutcome::Stale) => {
                    tracing::debug!(backend, why, "nothing to release: the claim was not ours")
                }
                Err(error) => tracing::warn!(
                    backend,
                    why,
                    error = %ErrorChain(&error),
                    "could not release the key; it frees when its lease runs out"
                ),
            }
        },
        &runtime,
    );
}
