//! Duplicates waiting on this process for a running request's answer
//! ([`EngineConfig::in_flight_wait`](crate::EngineConfig#structfield.in_flight_wait)): woken
//! when a request of the same engine settles the key, instead of at their next poll of the
//! store. Polling stays, as the way to learn of a request settled by another process (or of a
//! wake that raced the wait): a wake only makes the answer come sooner, never changes it.
//!
//! Bounded: at most [`EngineConfig::max_waiters_per_key`] duplicates of one key and
//! [`EngineConfig::max_waiters`] in all wait at once; one past either bound is answered in
//! flight at once, so a flood of duplicates cannot hold the server's requests.
//!
//! [`EngineConfig::max_waiters_per_key`]: crate::EngineConfig#structfield.max_waiters_per_key
//! [`EngineConfig::max_waiters`]: crate::EngineConfig#structfield.max_waiters

use crate::key::IdempotencyKey;
use crate::scope::Scope;
use crate::store::wake_id;
use crate::sync::{AtomicUsize, Mutex, MutexGuard, Ordering};
use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::{Arc, PoisonError};
use tokio::sync::Notify;

/// Gauge: duplicates of running requests waiting on this process for their answer.
pub const WAITING_DUPLICATES_METRIC: &str = "idempotency_waiting_duplicates";

/// Counter: duplicates answered in flight at once because as many as the bounds allow were
/// already waiting (for their key, or in all).
pub const WAITERS_REFUSED_METRIC: &str = "idempotency_waiting_duplicates_refused_total";

struct Waited {
    notify: Arc<Notify>,
    waiters: usize,
}

/// The duplicates an engine's requests have waiting, per key.
pub(crate) struct Waiters {
    /// How many wait now, in all: read without the lock by every settled request, so one that
    /// no duplicate waits for pays an atomic load and nothing else.
    waiting: AtomicUsize,
    /// By the key's [`wake_id`], which another process's settle names too.
    keys: Mutex<HashMap<u64, Waited>>,
    per_key: usize,
    total: usize,
    gauge: metrics::Gauge,
}

/// One duplicate's place among the waiters of its key, given back when dropped.
pub(crate) struct Waiting<'a> {
    waiters: &'a Waiters,
    id: u64,
    notify: Arc<Notify>,
}

impl Waiters {
    pub(crate) fn new(per_key: usize, total: usize) -> Self {
        // Both series exist from the first engine on (an increment by zero: other engines'
        // waiters may be counted already).
        let gauge = metrics::gauge!(WAITING_DUPLICATES_METRIC);
        gauge.increment(0.0);
        metrics::counter!(WAITERS_REFUSED_METRIC).increment(0);
        Waiters {
            waiting: AtomicUsize::new(0),
            keys: Mutex::new(HashMap::new()),
            per_key,
            total,
            gauge,
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<u64, Waited>> {
        // Every change is whole between statements: a poisoned map is still consistent.
        self.keys.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A place among the waiters of `(scope, key)`, or `None` when as many as the bounds allow
    /// already wait (the caller answers in flight at once).
    pub(crate) fn join(&self, scope: &Scope, key: &IdempotencyKey) -> Option<Waiting<'_>> {
        // Keys are told apart by their wake id: two that share one wake each other's waiters,
        // which then find their own key still running and wait on.
        let id = wake_id(scope, key);
        let mut keys = self.lock();
        if self.waiting.load(Ordering::Relaxed) >= self.total || self.per_key == 0 {
            drop(keys);
            metrics::counter!(WAITERS_REFUSED_METRIC).increment(1);
            return None;
        }
        let notify = match keys.entry(id) {
            Entry::Occupied(mut waited) => {
                let waited = waited.get_mut();
                if waited.waiters >= self.per_key {
                    drop(keys);
                    metrics::counter!(WAITERS_REFUSED_METRIC).increment(1);
                    return None;
                }
                waited.waiters += 1;
                Arc::clone(&waited.notify)
            }
            Entry::Vacant(vacant) => {
                let notify = Arc::new(Notify::new());
                vacant.insert(Waited {
                    notify: Arc::clone(&notify),
                    waiters: 1,
                });
                notify
            }
        };
        self.waiting.fetch_add(1, Ordering::SeqCst);
        drop(keys);
        self.gauge.increment(1.0);
        Some(Waiting {
            waiters: self,
            id,
            notify,
        })
    }

    /// A request of this engine settled `(scope, key)` (stored its answer, or gave the key
    /// back): its waiting duplicates ask the store again now.
    pub(crate) fn wake(&self, scope: &Scope, key: &IdempotencyKey) {
        if self.waiting.load(Ordering::SeqCst) == 0 {
            return;
        }
        self.wake_id(wake_id(scope, key));
    }

    /// Another process settled the key of `id` ([`wake_id`], heard through the store's
    /// [`SettledKeys`](crate::store::SettledKeys)): its waiting duplicates ask the store now.
    pub(crate) fn wake_id(&self, id: u64) {
        if self.waiting.load(Ordering::SeqCst) == 0 {
            return;
        }
        if let Some(waited) = self.lock().get(&id) {
            waited.notify.notify_waiters();
        }
    }

    /// How many duplicates wait now.
    #[cfg(all(test, not(idempotency_loom)))]
    pub(crate) fn waiting(&self) -> usize {
        self.waiting.load(Ordering::SeqCst)
    }
}

impl Waiting<'_> {
    /// A future that resolves at the next wake of this key. Made before the store is asked
    /// again: a wake between that answer and the wait is then not missed. Boxed and owned, so
    /// that the claim's future, which every request carries, holds a pointer for it rather
    /// than the future itself (with the place boxed too: 1,160 bytes, against 1,120 before waiting
    /// was woken and 1,232 with both inline, measured on the memory store).
    pub(crate) fn notified(&self) -> std::pin::Pin<Box<tokio::sync::futures::OwnedNotified>> {
        // Under the schedule checker: tokio's `Notify` is invisible to it, so arming is made an
        // access that conflicts with `wake`'s read of the count (an addition of zero, which
        // changes nothing), and the checker tries both orders of the two.
        #[cfg(idempotency_loom)]
        self.waiters.waiting.fetch_add(0, Ordering::SeqCst);
        Box::pin(Arc::clone(&self.notify).notified_owned())
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let mut keys = self.waiters.lock();
        if let Entry::Occupied(mut waited) = keys.entry(self.id) {
            waited.get_mut().waiters -= 1;
            if waited.get().waiters == 0 {
                waited.remove();
            }
        }
        self.waiters.waiting.fetch_sub(1, Ordering::SeqCst);
        drop(keys);
        self.waiters.gauge.decrement(1.0);
    }
}

#[cfg(all(test, idempotency_loom))]
mod loom_tests;

#[cfg(test)]
#[cfg(not(idempotency_loom))]
mod tests {
    use super::*;
    use std::time::Duration;

    use crate::test_store::scope_and_key as key;

    #[tokio::test]
    async fn a_wake_reaches_the_waiters_of_its_key_only() {
        let waiters = Waiters::new(4, 16);
        let (s, a) = key("a");
        let (_, b) = key("b");
        let on_a = waiters.join(&s, &a).unwrap();
        let on_b = waiters.join(&s, &b).unwrap();
        {
            let (woken_a, woken_b) = (on_a.notified(), on_b.notified());
            waiters.wake(&s, &a);
            tokio::time::timeout(Duration::from_secs(5), woken_a)
                .await
                .expect("the waiter of the settled key is woken");
            let mut woken_b = std::pin::pin!(woken_b);
            assert!(
                futures_util::poll!(woken_b.as_mut()).is_pending(),
                "another key's waiter sleeps on"
            );
            assert_eq!(waiters.waiting(), 2);
        }
        drop((on_a, on_b));
        assert_eq!(waiters.waiting(), 0);
        assert!(waiters.lock().is_empty(), "no entry outlives its waiters");
    }

    #[tokio::test]
    async fn a_wake_before_the_wait_is_not_missed() {
        let waiters = Waiters::new(4, 16);
        let (s, a) = key("a");
        let on_a = waiters.join(&s, &a).unwrap();
        // Made before the store is asked; the wake lands before it is awaited.
        let woken = on_a.notified();
        waiters.wake(&s, &a);
        tokio::time::timeout(Duration::from_secs(5), woken)
            .await
            .expect("a wake between the store's answer and the wait still wakes");
    }

    #[test]
    fn waiters_past_either_bound_are_refused() {
        let waiters = Waiters::new(2, 3);
        let (s, a) = key("a");
        let (_, b) = key("b");
        let first = waiters.join(&s, &a).unwrap();
        let _second = waiters.join(&s, &a).unwrap();
        assert!(waiters.join(&s, &a).is_none(), "a third waiter of one key");
        let _on_b = waiters.join(&s, &b).unwrap();
        let (_, c) = key("c");
        assert!(waiters.join(&s, &c).is_none(), "a fourth waiter in all");
        drop(first);
        assert!(
            waiters.join(&s, &c).is_some(),
            "a place given back is taken"
        );
        assert!(
            Waiters::new(0, 16).join(&s, &a).is_none(),
            "no waiter per key: none waits"
        );
        assert!(
            Waiters::new(4, 0).join(&s, &a).is_none(),
            "no waiter in all: none waits"
        );
    }
}
