//! How many request transactions run at once on a store whose transactions hold pooled
//! connections: at most the pool, and fewer when fewer get more done.
//!
//! On hot rows, every transaction past a few only waits on the rows' locks (and deadlocks
//! more often), holding a connection while it waits: under the contention bench of issue 45
//! (`idempotency-bench contention`, `docs/benchmarks.md` "Under contention"), two instances
//! ran 1,100-1,500 orders/s on pools of 1-2 and 2-40 on pools of 16, while without hot rows
//! pools of 16 ran the most requests and pools of 2 less than half as many. No fixed pool size does well at both, and the transactions' times
//! cannot tell them apart: a CPU-bound server stretches them as much as a lock queue does (a
//! gradient limiter on them, tried first, held the uncontended HTTP bench at half its
//! throughput). What tells them apart is what the transactions get done: past a few
//! transactions at once, hot rows commit fewer, a busy server about as many. So the limit
//! climbs the committed transactions per second (`admission/climb.rs`): it starts at the pool
//! less the connections kept for lookups, tries a limit down and keeps it only when clearly
//! more commit, in two windows unless far more (looking further down when fewer commit as
//! much: hot rows past their collapse),
//! tries one up and keeps it only when more commit and each place commits nearly as much as
//! before (an instance that takes more places takes a larger share of a total that may fall),
//! and probes less often, at jittered times, while neither moves it. A request that finds the limit reached waits for a place up to the store
//! timeout (`503 store-busy` after), and a replay never takes one.

use climb::Climb;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

mod climb;

/// Gauge, by `backend`: how many request transactions the engine admits at once on a store
/// whose transactions hold pooled connections
/// ([`TransactionAdmission::Adaptive`](crate::TransactionAdmission::Adaptive)); at the pool
/// without contention, toward 1 on hot rows. Set when it moves.
pub const TRANSACTIONS_ADMITTED_METRIC: &str = "idempotency_transactions_admitted_limit";

/// Counter, by `backend`: requests that waited the store timeout for a place among the
/// admitted transactions and got none (answered `503 store-busy`).
pub const ADMISSION_TIMEOUTS_METRIC: &str = "idempotency_transaction_admission_timeouts_total";

/// The fewest transactions admitted at once.
pub(crate) const MIN_LIMIT: usize = 1;

/// Connections of the pool kept out of the limit, one for each this many (at least one on a
/// pool of two or more): the lookups that answer replays and in-flight duplicates without a
/// place, and the lease mode's claims and completions, find a connection while the admitted
/// transactions wait on hot rows.
const RESERVED_ONE_PER: usize = 8;

/// The most transactions admitted at once on a pool of `pool` connections, and where the
/// limit starts: a process starts at it, so a workload whose transactions are slow but do
/// not wait on each other (a call to another service, a long insert) runs as many at once as
/// the pool allows from the first request; hot rows bring it down in a few windows.
pub(crate) fn most_admitted(pool: usize) -> usize {
    if pool < 2 {
        return pool.max(MIN_LIMIT);
    }
    pool - (pool / RESERVED_ONE_PER).max(1)
}

/// The admission of request transactions: a semaphore whose permits follow the climbing
/// limit (`admission/climb.rs`).
#[derive(Debug)]
pub(crate) struct Admission {
    permits: Arc<Semaphore>,
    state: Mutex<AdmissionState>,
    /// The store's name, the metrics' `backend` label.
    backend: &'static str,
}

#[derive(Debug)]
struct AdmissionState {
    climb: Climb,
    /// Permits handed out by the semaphore, counted against the limit: admitted transactions,
    /// plus permits to retire (the limit fell below what was out).
    issued: usize,
}

impl Admission {
    /// At most [`most_admitted`] of a pool of `max` (the store named `backend`'s) at once.
    pub(crate) fn new(max: usize, backend: &'static str) -> Arc<Self> {
        let climb = Climb::new(most_admitted(max));
        let issued = climb.limit;
        metrics::gauge!(TRANSACTIONS_ADMITTED_METRIC, "backend" => backend).set(issued as f64);
        metrics::counter!(ADMISSION_TIMEOUTS_METRIC, "backend" => backend).increment(0);
        Arc::new(Admission {
            permits: Arc::new(Semaphore::new(issued)),
            state: Mutex::new(AdmissionState { climb, issued }),
            backend,
        })
    }

    /// The current limit.
    pub(crate) fn limit(&self) -> usize {
        self.state
            .lock()
            .map(|s| s.climb.limit)
            .unwrap_or(MIN_LIMIT)
    }

    /// The limit is below the most it admits because probing found that fewer transactions at
    /// once commit more (hot rows). Not while a probe down from the pool only tries it: every
    /// server probes so now and then, and a request that finds no free place then (one window
    /// in many, at half the pool) would look its key up, a round trip the bare handler does not
    /// make (`http-pg`, 32 clients on a pool of 32, no hot rows: 12.7% of requests did when a
    /// trial counted).
    pub(crate) fn contended(&self) -> bool {
        self.state
            .lock()
            .map(|s| s.climb.kept() < s.climb.max)
            .unwrap_or(true)
    }

    /// A place at once, if one is free.
    pub(crate) fn try_admit(self: &Arc<Self>) -> Option<Admitted> {
        let permit = Arc::clone(&self.permits).try_acquire_owned().ok()?;
        Some(self.admitted(permit))
    }

    /// A place, waiting up to `bound`; `None` when none came free in time (counted in
    /// [`ADMISSION_TIMEOUTS_METRIC`]).
    pub(crate) async fn admit(self: &Arc<Self>, bound: Duration) -> Option<Admitted> {
        let acquire = Arc::clone(&self.permits).acquire_owned();
        match tokio::time::timeout(bound, acquire).await {
            Ok(Ok(permit)) => Some(self.admitted(permit)),
            _ => {
                metrics::counter!(ADMISSION_TIMEOUTS_METRIC, "backend" => self.backend)
                    .increment(1);
                None
            }
        }
    }

    /// A place, waiting up to `bound`; `None` when none came free in time (not counted: the
    /// caller goes on waiting).
    pub(crate) async fn admit_quietly(self: &Arc<Self>, bound: Duration) -> Option<Admitted> {
        let acquire = Arc::clone(&self.permits).acquire_owned();
        match tokio::time::timeout(bound, acquire).await {
            Ok(Ok(permit)) => Some(self.admitted(permit)),
            _ => None,
        }
    }

    fn admitted(self: &Arc<Self>, permit: OwnedSemaphorePermit) -> Admitted {
        Admitted {
            admission: Arc::clone(self),
            permit: Some(permit),
            committed: false,
        }
    }

    /// A transaction ended (`committed`: with its work done): the limit follows, and its
    /// permit goes back (or is retired when the limit fell).
    fn release(&self, permit: OwnedSemaphorePermit, committed: bool) {
        let Ok(mut state) = self.state.lock() else {
            return;
        };
        if let Some(limit) = state.climb.ended(Instant::now(), committed) {
            tracing::debug!(limit, "request transactions admitted at once");
            metrics::gauge!(TRANSACTIONS_ADMITTED_METRIC, "backend" => self.backend)
                .set(limit as f64);
            // Raise: new permits at once. Lower: retire permits as they come back.
            if limit > state.issued {
                self.permits.add_permits(limit - state.issued);
                state.issued = limit;
            }
        }
        let limit = state.climb.limit;
        if state.issued > limit {
            state.issued -= 1;
            permit.forget();
        }
    }
}

/// Where a request keeps its transaction's place until the transaction ends: shared by the
/// guard and the lease mode's opener, which takes the place when the handler opens the
/// transaction.
pub(crate) type Place = Arc<Mutex<Option<Admitted>>>;

/// A transaction's place among those admitted at once; given back when dropped, counted as
/// work done when marked [`committed`](Admitted::committed) first.
#[derive(Debug)]
pub(crate) struct Admitted {
    admission: Arc<Admission>,
    permit: Option<OwnedSemaphorePermit>,
    committed: bool,
}

impl Admitted {
    /// The transaction committed its work (or stored its refusal).
    pub(crate) fn committed(&mut self) {
        self.committed = true;
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        if let Some(permit) = self.permit.take() {
            self.admission.release(permit, self.committed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookups_keep_a_connection_of_their_own() {
        assert_eq!(most_admitted(0), 1);
        assert_eq!(most_admitted(1), 1);
        assert_eq!(most_admitted(2), 1);
        assert_eq!(most_admitted(4), 3);
        assert_eq!(most_admitted(16), 14);
        assert_eq!(most_admitted(64), 56);
    }

    #[tokio::test]
    async fn a_lower_limit_retires_permits_as_they_come_back() {
        // A pool of 5: 4 admitted, one connection kept for lookups.
        let admission = Admission::new(5, "test");
        let held: Vec<_> = (0..4).map(|_| admission.try_admit()).collect();
        assert!(held.iter().all(Option::is_some));
        assert!(admission.try_admit().is_none());
        {
            let mut state = admission.state.lock().unwrap_or_else(|e| e.into_inner());
            state.climb.limit = 2;
        }
        drop(held);
        assert_eq!(admission.permits.available_permits(), 2);
        let (a, b) = (admission.try_admit(), admission.try_admit());
        assert!(a.is_some() && b.is_some());
        assert!(admission.try_admit().is_none());
    }
}
