//! A claim sent to the store whose answer the request has not taken yet, released in the
//! background if `begin` ends without one.

use super::guard::Guard;
use super::key_claim::KeyClaim;
use super::retry::spawn_release;
use super::shared::Shared;
use crate::key::IdempotencyKey;
use crate::record::LeaseToken;
use crate::scope::Scope;
use crate::store::IdempotencyStore;
use std::sync::Arc;
use tokio::time::Instant;

/// A claim sent to the store whose outcome this request has not taken yet. If `begin` ends
/// without a definite answer (an error, a timeout, or its future dropped), the claim may exist
/// in the store with this request's token, so it is released in the background: the release is
/// fenced by the token, so it never touches anyone else's claim.
pub(super) struct PendingClaim<'a, S: IdempotencyStore + 'static> {
    pub(super) shared: &'a Arc<Shared<S>>,
    pub(super) claim: Option<(Scope, IdempotencyKey, LeaseToken)>,
    pub(super) sent_at: Instant,
    /// A claim call was sent and its answer not taken: the store may hold our claim.
    pub(super) in_doubt: bool,
}

impl<S: IdempotencyStore + 'static> PendingClaim<'_, S> {
    /// The store answered without giving us the key: nothing to release.
    pub(super) fn disarm(&mut self) {
        self.claim = None;
    }

    /// The lease of the claim last sent.
    fn lease(&mut self) -> Option<KeyClaim> {
        let (scope, key, token) = self.claim.take()?;
        let length = self.shared.config.lease;
        Some(KeyClaim::new(scope, key, token, length, self.sent_at))
    }

    /// The store gave us the key: the guard takes over the claim.
    pub(super) fn into_guard(mut self) -> Guard<S> {
        let Some(lease) = self.lease() else {
            unreachable!("a pending claim is turned into a guard once")
        };
        Guard::with_lease(Arc::clone(self.shared), lease)
    }
}

impl<S: IdempotencyStore + 'static> Drop for PendingClaim<'_, S> {
    fn drop(&mut self) {
        if !self.in_doubt {
            return;
        }
        if let Some(lease) = self.lease() {
            spawn_release(Arc::clone(self.shared), lease, "unanswered claim");
        }
    }
}
