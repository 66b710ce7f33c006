//! The suite must be able to fail: a store that checks, then inserts (the ADR's original
//! steps 2-4) is caught by the concurrency case.

use async_trait::async_trait;
use idempotency_conformance::cases;
// The one path a store author needs (docs/writing-a-store.md).
use idempotency_core::store::{
    ClaimOutcome, FenceOutcome, Fingerprint, IdempotencyKey, IdempotencyStore, LeaseToken, Record,
    Scope, StoreError, StoredResponse,
};
use idempotency_memory::MemoryStore;
use std::sync::Arc;
use std::time::Duration;

/// Wraps a correct store but claims with a separate read and write, yielding in between.
struct CheckThenInsertStore {
    inner: MemoryStore,
}

#[async_trait]
impl IdempotencyStore for CheckThenInsertStore {
    fn backend(&self) -> &'static str {
        "racy"
    }
    async fn claim(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        token: LeaseToken,
        lease: Duration,
    ) -> Result<ClaimOutcome, StoreError> {
        if let Some(record) = self.inner.get(scope, key).await? {
            return Ok(ClaimOutcome::Existing(record));
        }
        // The race window: another request runs here.
        tokio::time::sleep(Duration::from_millis(1)).await;
        // Insert unconditionally, as a plain INSERT after a SELECT would.
        let _ = self
            .inner
            .claim(scope, key, fingerprint, token, lease)
            .await?;
        Ok(ClaimOutcome::Claimed)
    }
    async fn complete(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        token: LeaseToken,
        response: &StoredResponse,
        retention: Duration,
    ) -> Result<FenceOutcome, StoreError> {
        self.inner
            .complete(scope, key, token, response, retention)
            .await
    }
    async fn extend(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        token: LeaseToken,
        lease: Duration,
    ) -> Result<FenceOutcome, StoreError> {
        self.inner.extend(scope, key, token, lease).await
    }
    async fn release(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        token: LeaseToken,
    ) -> Result<FenceOutcome, StoreError> {
        self.inner.release(scope, key, token).await
    }
    async fn get(&self, scope: &Scope, key: &IdempotencyKey) -> Result<Option<Record>, StoreError> {
        self.inner.get(scope, key).await
    }
    async fn purge_expired(&self, limit: usize) -> Result<u64, StoreError> {
        self.inner.purge_expired(limit).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_concurrency_case_fails_on_a_check_then_insert_store() {
    let racy = Arc::new(CheckThenInsertStore {
        inner: MemoryStore::default(),
    });
    let run = tokio::spawn(cases::concurrent_claims_have_exactly_one_winner(racy));
    let err = run
        .await
        .expect_err("the suite must reject a check-then-insert store");
    assert!(err.is_panic());
    let message = err
        .into_panic()
        .downcast::<String>()
        .map(|s| *s)
        .unwrap_or_default();
    assert!(
        message.contains("invariant 1"),
        "the failure must name invariant 1, got: {message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_same_case_passes_on_the_correct_store() {
    cases::concurrent_claims_have_exactly_one_winner(Arc::new(MemoryStore::default())).await;
}
