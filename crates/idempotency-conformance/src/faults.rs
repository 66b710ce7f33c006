//! A store wrapper that injects faults, for tests of what the engine and the layer do when a
//! store fails at a chosen step.
//!
//! ```
//! use idempotency_conformance::faults::{Fault, FaultyStore, StoreOp};
//! use idempotency_memory::MemoryStore;
//!
//! let store = FaultyStore::new(MemoryStore::default());
//! store.set(StoreOp::Complete, Fault::Fail);   // every `complete` fails until cleared
//! store.clear(StoreOp::Complete);
//! ```

use async_trait::async_trait;
use idempotency_core::store::{ClaimOutcome, FenceOutcome, Footprint, Record, TransactionalStore};
use idempotency_core::{
    Fingerprint, IdempotencyKey, IdempotencyStore, LeaseToken, Scope, StoreError, StoredResponse,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The calls a [`FaultyStore`] counts and can fail: the six primitives. The steps of a request's
/// transaction (`BeginTransaction`, `Commit`, `Rollback`) go to the wrapped store untouched.
pub use idempotency_core::store::StoreOp;

const OPS: usize = StoreOp::ALL.len();

/// What happens to a call of a faulty primitive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// Fails at once with a retryable [`StoreError::Unavailable`], without reaching the store.
    Fail,
    /// Never answers (a frozen server); only a timeout ends the call.
    Hang,
    /// Reaches the store (the change is made), then waits this long before answering: a reply
    /// lost or delayed on the way back.
    DelayAfter(Duration),
    /// Reaches the store (the change is made), then answers that a record is corrupt: a store
    /// that answered, with an error no retry fixes.
    Corrupt,
}

/// Wraps a store and applies the faults set per [`StoreOp`]; counts every call per op.
#[derive(Debug, Clone)]
pub struct FaultyStore<S> {
    inner: S,
    state: Arc<State>,
}

#[derive(Debug, Default)]
struct State {
    faults: Mutex<[Option<Fault>; OPS]>,
    calls: [AtomicU64; OPS],
}

impl<S> FaultyStore<S> {
    /// `inner`, with no fault set.
    pub fn new(inner: S) -> Self {
        FaultyStore {
            inner,
            state: Arc::default(),
        }
    }

    /// Makes every later call of `op` behave as `fault`, until cleared.
    ///
    /// # Panics
    /// When `op` is not one of the six primitives: the wrapper passes a request's transaction
    /// through untouched, so the fault would never apply.
    pub fn set(&self, op: StoreOp, fault: Fault) {
        assert!(
            op.is_primitive(),
            "FaultyStore injects faults into the six primitives; {op:?} goes to the wrapped store untouched"
        );
        self.faults()[op as usize] = Some(fault);
    }

    /// Lets `op` reach the store normally again.
    pub fn clear(&self, op: StoreOp) {
        self.faults()[op as usize] = None;
    }

    /// How many times `op` was called (faulty or not).
    pub fn calls(&self, op: StoreOp) -> u64 {
        self.state.calls[op as usize].load(Ordering::SeqCst)
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    fn faults(&self) -> std::sync::MutexGuard<'_, [Option<Fault>; OPS]> {
        self.state
            .faults
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    async fn run<T>(
        &self,
        op: StoreOp,
        call: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        self.state.calls[op as usize].fetch_add(1, Ordering::SeqCst);
        let fault = self.faults()[op as usize];
        match fault {
            None => call.await,
            Some(Fault::Fail) => Err(StoreError::Unavailable {
                backend: "faulty",
                source: format!("injected fault: {op:?} fails").into(),
            }),
            Some(Fault::Hang) => std::future::pending().await,
            Some(Fault::DelayAfter(delay)) => {
                let result = call.await;
                tokio::time::sleep(delay).await;
                result
            }
            Some(Fault::Corrupt) => {
                let _ = call.await;
                Err(StoreError::Corrupt {
                    backend: "faulty",
                    source: idempotency_core::store::CorruptRecord::Field(
                        "injected fault: corrupt",
                    ),
                })
            }
        }
    }
}

#[async_trait]
impl<S: IdempotencyStore> IdempotencyStore for FaultyStore<S> {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }

    async fn claim(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        token: LeaseToken,
        lease: Duration,
    ) -> Result<ClaimOutcome, StoreError> {
        self.run(
            StoreOp::Claim,
            self.inner.claim(scope, key, fingerprint, token, lease),
        )
        .await
    }

    async fn complete(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        token: LeaseToken,
        response: &StoredResponse,
        retention: Duration,
    ) -> Result<FenceOutcome, StoreError> {
        self.run(
            StoreOp::Complete,
            self.inner.complete(scope, key, token, response, retention),
        )
        .await
    }

    async fn extend(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        token: LeaseToken,
        lease: Duration,
    ) -> Result<FenceOutcome, StoreError> {
        self.run(StoreOp::Extend, self.inner.extend(scope, key, token, lease))
            .await
    }

    async fn release(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        token: LeaseToken,
    ) -> Result<FenceOutcome, StoreError> {
        self.run(StoreOp::Release, self.inner.release(scope, key, token))
            .await
    }

    async fn get(&self, scope: &Scope, key: &IdempotencyKey) -> Result<Option<Record>, StoreError> {
        self.run(StoreOp::Get, self.inner.get(scope, key)).await
    }

    async fn purge_expired(&self, limit: usize) -> Result<u64, StoreError> {
        self.run(StoreOp::Purge, self.inner.purge_expired(limit))
            .await
    }

    fn transactional(&self) -> Option<&dyn TransactionalStore> {
        self.inner.transactional()
    }

    fn state_losses(&self) -> u64 {
        self.inner.state_losses()
    }

    async fn check_state(&self) -> Result<bool, StoreError> {
        self.inner.check_state().await
    }

    async fn footprint(&self) -> Result<Option<Footprint>, StoreError> {
        self.inner.footprint().await
    }

    fn settled_keys(&self) -> Option<&idempotency_core::store::SettledKeys> {
        self.inner.settled_keys()
    }

    async fn watch_settle(&self, scope: &Scope, key: &IdempotencyKey) -> Result<(), StoreError> {
        self.run(StoreOp::Watch, self.inner.watch_settle(scope, key))
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::{Fault, FaultyStore, StoreOp};

    /// A fault on a step the wrapper passes through would never apply: it is refused.
    #[test]
    #[should_panic(expected = "goes to the wrapped store untouched")]
    fn a_fault_on_a_transaction_step_is_refused() {
        FaultyStore::new(()).set(StoreOp::Commit, Fault::Fail);
    }

    /// Faults and counts are per primitive.
    #[test]
    fn faults_are_kept_per_primitive() {
        let store = FaultyStore::new(());
        store.set(StoreOp::Complete, Fault::Fail);
        assert_eq!(
            store.faults()[StoreOp::Complete as usize],
            Some(Fault::Fail)
        );
        assert_eq!(store.faults()[StoreOp::Claim as usize], None);
        store.clear(StoreOp::Complete);
        assert_eq!(store.faults()[StoreOp::Complete as usize], None);
    }
}
