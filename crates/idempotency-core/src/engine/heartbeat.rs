//! The heartbeat: keeps a running request's lease from running out.

use super::Shared;
use super::lease::Lease;
use crate::{ErrorChain, FenceOutcome, IdempotencyStore};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// Extends the lease every third of its length until aborted. A failed extension is retried
/// sooner; once the lease has run out by this process's clock, or the store says the token no
/// longer holds the claim, the lease is marked lost and the heartbeat stops.
pub(crate) async fn run<S: IdempotencyStore + 'static>(shared: Arc<Shared<S>>, lease: Lease) {
    let beat = (lease.length() / 3).max(Duration::from_millis(10));
    let mut next = beat;
    loop {
        tokio::time::sleep(next).await;
        let sent = Instant::now();
        match shared.extend(&lease).await {
            Ok(FenceOutcome::Applied) => {
                lease.renewed(sent);
                next = beat;
            }
            Ok(FenceOutcome::Stale) => {
                lease.mark_lost();
                tracing::warn!(
                    backend = shared.store.backend(),
                    "the lease ran out while the request was running; another request may run it too"
                );
                return;
            }
            Err(error) => {
                if Instant::now() >= lease.deadline() {
                    lease.mark_lost();
                    tracing::warn!(
                        backend = shared.store.backend(),
                        error = %ErrorChain(&error),
                        "could not extend the lease before it ran out; another request may run it too"
                    );
                    return;
                }
                tracing::warn!(
                    backend = shared.store.backend(),
                    error = %ErrorChain(&error),
                    "could not extend the lease; trying again"
                );
                next = beat.min(Duration::from_millis(250));
            }
        }
    }
}
