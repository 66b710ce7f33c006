//! A store wrapper that injects faults, for tests of what the engine and the layer do when a
//! store fails at a chosen step.
//!
//! ```
//! use idempotency_conformance::faults::{Fault, FaultyStore, Op};
//! use idempotency_memory::MemoryStore;
//!
//! let store = FaultyStore::new(MemoryStore::default());
//! store.set(Op::Complete, Fault::Fail);   // every `complete` fails until cleared
//! store.clear(Op::Complete);
//! ```

use async_trait::async_trait;
use idempotency_core::{
    ClaimOutcome, FenceOutcome, Fingerprint, IdempotencyKey, IdempotencyStore, LeaseToken, Record,
    Scope, StoreError, StoredResponse, TransactionalStore,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A store primitive.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Op {
    /// [`IdempotencyStore::claim`]
    Claim,
    /// [`IdempotencyStore::complete`]
    Complete,
    /// [`IdempotencyStore::extend`]
    Extend,
    /// [`IdempotencyStore::release`]
    Release,
    /// [`IdempotencyStore::get`]
    Get,
    /// [`IdempotencyStore::purge_expired`]
    Purge,
}

const OPS: usize = 6;

impl Op {
    fn index(self) -> usize {
        match self {
            Op::Claim => 0,
            Op::Complete => 1,
            Op::Extend => 2,
            Op::Release => 3,
            Op::Get => 4,
            Op::Purge => 5,
        }
    }
}

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

/// Wraps a store and applies the faults set per [`Op`]; counts every call per op.
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
    pub fn set(&self, op: Op, fault: Fault) {
        self.faults()[op.index()] = Some(fault);
    }

    /// Lets `op` reach the store normally again.
    pub fn clear(&self, op: Op) {
        self.faults()[op.index()] = None;
    }

    /// How many times `op` was called (faulty or not).
    pub fn calls(&self, op: Op) -> u64 {
        self.state.calls[op.index()].load(Ordering::SeqCst)
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
        op: Op,
        call: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        self.state.calls[op.index()].fetch_add(1, Ordering::SeqCst);
        let fault = self.faults()[op.index()];
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
                    source: idempotency_core::CorruptRecord::Field("injected fault: corrupt"),
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
            Op::Claim,
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
            Op::Complete,
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
        self.run(Op::Extend, self.inner.extend(scope, key, token, lease))
            .await
    }

    async fn release(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        token: LeaseToken,
    ) -> Result<FenceOutcome, StoreError> {
        self.run(Op::Release, self.inner.release(scope, key, token))
            .await
    }

    async fn get(&self, scope: &Scope, key: &IdempotencyKey) -> Result<Option<Record>, StoreError> {
        self.run(Op::Get, self.inner.get(scope, key)).await
    }

    async fn purge_expired(&self, limit: usize) -> Result<u64, StoreError> {
        self.run(Op::Purge, self.inner.purge_expired(limit)).await
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
}
