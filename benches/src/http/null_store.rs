//! `NullStore`: a store that keeps nothing, for the layer's own cost with no store behind it.

use idempotency::store::{
    ClaimOutcome, FenceOutcome, Fingerprint, IdempotencyKey, IdempotencyStore, LeaseToken, Record,
    Scope, StoreError, StoredResponse,
};
use std::time::Duration;

/// A store that keeps nothing: every claim is granted, every completion, extension and
/// release accepted, no record is ever found. Not idempotent at all; it exists to measure what
/// the layer and the engine cost by themselves.
#[derive(Clone, Copy, Debug, Default)]
pub struct NullStore;

#[async_trait::async_trait]
impl IdempotencyStore for NullStore {
    fn backend(&self) -> &'static str {
        "null"
    }

    async fn claim(
        &self,
        _: &Scope,
        _: &IdempotencyKey,
        _: &Fingerprint,
        _: LeaseToken,
        _: Duration,
    ) -> Result<ClaimOutcome, StoreError> {
        Ok(ClaimOutcome::Claimed)
    }

    async fn complete(
        &self,
        _: &Scope,
        _: &IdempotencyKey,
        _: LeaseToken,
        _: &StoredResponse,
        _: Duration,
    ) -> Result<FenceOutcome, StoreError> {
        Ok(FenceOutcome::Applied)
    }

    async fn extend(
        &self,
        _: &Scope,
        _: &IdempotencyKey,
        _: LeaseToken,
        _: Duration,
    ) -> Result<FenceOutcome, StoreError> {
        Ok(FenceOutcome::Applied)
    }

    async fn release(
        &self,
        _: &Scope,
        _: &IdempotencyKey,
        _: LeaseToken,
    ) -> Result<FenceOutcome, StoreError> {
        Ok(FenceOutcome::Applied)
    }

    async fn get(&self, _: &Scope, _: &IdempotencyKey) -> Result<Option<Record>, StoreError> {
        Ok(None)
    }

    async fn purge_expired(&self, _: usize) -> Result<u64, StoreError> {
        Ok(0)
    }
}
