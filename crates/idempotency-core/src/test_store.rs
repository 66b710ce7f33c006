//! A store, and a reader of recorded metrics, for the crate's unit tests.

use crate::error::StoreError;
use crate::key::IdempotencyKey;
use crate::response::StoredResponse;
use crate::scope::Scope;
use crate::store::IdempotencyStore;
use crate::store::{ClaimOutcome, FenceOutcome, Fingerprint, Footprint, LeaseToken, Record};
use std::time::Duration;

/// A store that keeps nothing, whose `check_state` answers what it is told after `delay`, and
/// whose `purge_expired` answers from `purges` in turn (then `Ok(0)`), and whose footprint is
/// `footprint`.
pub(crate) struct Probe {
    pub(crate) answer: fn() -> Result<bool, StoreError>,
    pub(crate) delay: Duration,
    pub(crate) purges: std::sync::Mutex<Vec<Result<u64, StoreError>>>,
    pub(crate) footprint: Option<Footprint>,
}

impl Default for Probe {
    fn default() -> Self {
        Probe {
            answer: || Ok(false),
            delay: Duration::ZERO,
            purges: std::sync::Mutex::default(),
            footprint: None,
        }
    }
}

#[async_trait::async_trait]
impl IdempotencyStore for Probe {
    fn backend(&self) -> &'static str {
        "probe"
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
        let mut purges = self
            .purges
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if purges.is_empty() {
            Ok(0)
        } else {
            purges.remove(0)
        }
    }
    async fn check_state(&self) -> Result<bool, StoreError> {
        tokio::time::sleep(self.delay).await;
        (self.answer)()
    }
    async fn footprint(&self) -> Result<Option<Footprint>, StoreError> {
        Ok(self.footprint)
    }
}

/// What `snapshotter` holds, by `name{label=value,...}`.
pub(crate) fn metrics_by_series(
    snapshotter: &metrics_util::debugging::Snapshotter,
) -> std::collections::BTreeMap<String, metrics_util::debugging::DebugValue> {
    let mut seen = std::collections::BTreeMap::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let key = key.key();
        let labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        seen.insert(format!("{}{{{}}}", key.name(), labels.join(",")), value);
    }
    seen
}

/// Scope `s` and key `k`, for the tests of the waiters and the wait.
pub(crate) fn scope_and_key(k: &str) -> (Scope, IdempotencyKey) {
    (
        Scope::new("s").expect("a valid scope"),
        IdempotencyKey::parse(k.as_bytes(), Default::default()).expect("a valid key"),
    )
}
