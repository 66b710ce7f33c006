//! What every guard and background task of one engine shares (its settings, store, gauges,
//! heartbeat schedule and admission), and the one way it calls the store: bounded by the store
//! timeout, timed and counted per operation.

use super::admission::Admission;
use super::config::EngineConfig;
use super::heartbeat_schedule::Schedule;
use super::in_flight::InFlightGauges;
use super::key_claim::KeyClaim;
use super::limit::ScopeLimiter;
use super::store_metrics::StoreMetrics;
use crate::error::StoreError;
use crate::response::StoredResponse;
use crate::store::{FenceOutcome, IdempotencyStore, StoreOp};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::task::TaskTracker;

/// What every guard and background task of one engine shares.
pub(crate) struct Shared<S> {
    pub(crate) config: EngineConfig,
    pub(crate) store: S,
    /// Background work (heartbeats, deferred completions and releases).
    pub(crate) tasks: TaskTracker,
    /// Requests waiting for their first heartbeat.
    pub(crate) heartbeats: Arc<Schedule>,
    /// The keys of the store-call metrics.
    pub(super) metrics: StoreMetrics,
    /// The gauges of the keys this process holds in flight.
    pub(crate) in_flight: InFlightGauges,
    /// [`EngineConfig::new_keys_per_scope`](crate::EngineConfig#structfield.new_keys_per_scope), when set.
    pub(super) limiter: Option<ScopeLimiter>,
    /// The admission of request transactions, on a store whose transactions hold pooled
    /// connections ([`TransactionAdmission::Adaptive`](crate::TransactionAdmission::Adaptive)).
    pub(crate) admission: Option<Arc<Admission>>,
    /// Duplicates waiting on this process for a running request's answer.
    pub(crate) waiters: Arc<super::waiters::Waiters>,
    /// What the store's [`SettledKeys`](crate::store::SettledKeys) tells of keys settled by
    /// other processes (it holds it weakly: kept alive here, for as long as the engine).
    #[expect(
        dead_code,
        reason = "held, never read: the store's SettledKeys holds it weakly"
    )]
    pub(crate) on_settled: Option<Arc<crate::store::OnSettled>>,
}

impl<S> Drop for Shared<S> {
    fn drop(&mut self) {
        self.heartbeats.close();
    }
}

impl<S: IdempotencyStore> Shared<S> {
    /// A duplicate of the running request of `(scope, key)` waits on this process: on a store
    /// that hears of other processes' settles, it asks to hear of this key's (one bounded store
    /// call). A failure costs only the wake, so it is logged and the duplicate polls.
    pub(crate) async fn watch_settle(
        &self,
        scope: &crate::scope::Scope,
        key: &crate::key::IdempotencyKey,
    ) {
        if self.store.settled_keys().is_none() {
            return;
        }
        if let Err(error) = self
            .call(StoreOp::Watch, self.store.watch_settle(scope, key))
            .await
        {
            tracing::debug!(
                error = %crate::error::ErrorChain(&error),
                "could not ask to hear of a running key's settle; its waiting duplicate polls"
            );
        }
    }

    /// A duplicate of the one-transaction request that holds `(scope, key)` waits on this
    /// process: on a store that hears of other processes' settles, it sends the key's watch
    /// ([`TransactionalStore::watch_transaction`](crate::store::TransactionalStore::watch_transaction),
    /// one bounded store call). A failure costs only the wake, so it is logged and the
    /// duplicate polls.
    pub(crate) async fn watch_transaction(
        &self,
        store: &dyn crate::store::TransactionalStore,
        scope: &crate::scope::Scope,
        key: &crate::key::IdempotencyKey,
    ) {
        if self.store.settled_keys().is_none() {
            return;
        }
        if let Err(error) = self
            .call(StoreOp::Watch, store.watch_transaction(scope, key))
            .await
        {
            tracing::debug!(
                error = %crate::error::ErrorChain(&error),
                "could not send a running key's watch; its waiting duplicate polls"
            );
        }
    }

    /// Stores `response` for `claim` (one bounded store call).
    pub(crate) async fn complete(
        &self,
        claim: &KeyClaim,
        response: &StoredResponse,
    ) -> Result<FenceOutcome, StoreError> {
        let store = &self.store;
        let (scope, key, token) = (claim.scope(), claim.key(), claim.token());
        let retention = self.config.retention;
        self.call(
            StoreOp::Complete,
            store.complete(scope, key, token, response, retention),
        )
        .await
    }

    /// Extends `claim` by one lease (one bounded store call).
    pub(crate) async fn extend(&self, claim: &KeyClaim) -> Result<FenceOutcome, StoreError> {
        let (scope, key, token) = (claim.scope(), claim.key(), claim.token());
        self.call(
            StoreOp::Extend,
            self.store.extend(scope, key, token, claim.length()),
        )
        .await
    }

    /// Releases `claim` (one bounded store call).
    pub(crate) async fn release(&self, claim: &KeyClaim) -> Result<FenceOutcome, StoreError> {
        let (scope, key, token) = (claim.scope(), claim.key(), claim.token());
        self.call(StoreOp::Release, self.store.release(scope, key, token))
            .await
    }

    /// One store call, bounded by the store timeout, timed and counted per operation.
    pub(crate) async fn call<T>(
        &self,
        op: StoreOp,
        call: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let backend = self.store.backend();
        let started = std::time::Instant::now();
        let (result, took) = match bounded(self.config.store_timeout, call).await {
            Some(result) => (result, started.elapsed()),
            // Recorded as the timeout itself: the timer fires a little after it, and a
            // histogram whose bucket ends at the timeout would put every timed-out call in the
            // next one (a p99 of 9.85 s read for calls that cannot last past 5 s).
            None => (
                Err(StoreError::Timeout {
                    backend,
                    timeout: self.config.store_timeout,
                }),
                self.config.store_timeout,
            ),
        };
        self.metrics.duration(op, took.as_secs_f64());
        if result.is_err() {
            self.metrics.error(op);
        }
        result
    }
}

/// `call`, or `None` if it takes longer than `timeout`. A call that finishes on its first poll
/// (an in-process store's always do) never arms a timer: the profile of fresh keys showed the
/// timer's setup (reading the clock, finding the runtime) on every store call.
async fn bounded<T>(timeout: Duration, call: impl std::future::Future<Output = T>) -> Option<T> {
    use std::task::Poll;
    let mut call = std::pin::pin!(call);
    let first = std::future::poll_fn(|cx| Poll::Ready(call.as_mut().poll(cx))).await;
    match first {
        Poll::Ready(result) => Some(result),
        Poll::Pending => tokio::time::timeout(timeout, call).await.ok(),
    }
}
