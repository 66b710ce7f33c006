//! How many request transactions run at once on a store whose transactions hold pooled
//! connections: at most the pool, and fewer when the database is contended.
//!
//! On hot rows, every transaction past a few only waits on the rows' locks (and deadlocks
//! more often), holding a connection while it waits: under the contention bench of issue 45
//! (`idempotency-bench contention`), two instances ran 350-590 orders/s on pools of 2 and 7-48
//! on pools of 16, while without hot rows pools of 16 ran the most requests and pools of 2
//! less than half as many. No fixed pool size does well at both, so the engine admits a number
//! of transactions that follows the transactions' own times, as Netflix's gradient limiter
//! does: the limit shrinks by the ratio of the shortest recent transaction (the time without
//! waiting) to the average one, plus a small queue allowance. Without contention the times stay
//! near the shortest and the limit grows to the pool; on hot rows, lock waits stretch the
//! average and the limit falls toward two. A request that finds the limit reached waits for a
//! place up to the store timeout (`503 store-busy` after), and a replay never takes one.

use crate::monitoring::{ADMISSION_TIMEOUTS_METRIC, TRANSACTIONS_ADMITTED_METRIC};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The fewest transactions admitted at once.
pub(crate) const MIN_LIMIT: usize = 1;

/// The limit a process starts with (at most the pool): without contention it reaches the pool
/// within a few hundred transactions; started at the pool, hot rows cost seconds of deadlocks
/// before it came down.
const INITIAL_LIMIT: usize = 4;

/// How much longer than the quickest recent transaction the average may take before the
/// difference counts as waiting.
const TOLERANCE: f64 = 1.5;

/// How often the time without waiting is measured afresh (in limit updates), so it follows a
/// database that became slower for good.
const NOLOAD_REFRESH: u32 = 64;

/// The limit's state: samples of the current window and the estimate of the time without
/// waiting.
#[derive(Debug)]
struct Gradient {
    limit: f64,
    max: usize,
    /// The shortest transaction seen since the last refresh: the time without waiting.
    noload: Option<Duration>,
    /// The shortest of the current window (the next refresh's value).
    window_min: Option<Duration>,
    window_sum: Duration,
    window_len: u32,
    updates: u32,
}

impl Gradient {
    fn new(max: usize) -> Self {
        Gradient {
            limit: INITIAL_LIMIT.min(max) as f64,
            max,
            noload: None,
            window_min: None,
            window_sum: Duration::ZERO,
            window_len: 0,
            updates: 0,
        }
    }

    /// Takes one transaction's time; once per window (about a limit's worth of samples),
    /// moves the limit. The new limit, rounded, when it moved.
    fn sample(&mut self, took: Duration) -> Option<usize> {
        let took = took.max(Duration::from_micros(1));
        self.window_min = Some(self.window_min.map_or(took, |m| m.min(took)));
        self.noload = Some(self.noload.map_or(took, |m| m.min(took)));
        self.window_sum += took;
        self.window_len += 1;
        // A window of about half a limit's transactions: on hot rows few end per second, and
        // the limit must come down within seconds.
        if (self.window_len as f64) < (self.limit / 2.0).max(4.0) {
            return None;
        }
        let average = self.window_sum / self.window_len;
        let noload = self.noload.unwrap_or(average);
        // How much of the average is waiting: 1 when none, toward 0 on hot rows. An average
        // up to twice the quickest is taken for no waiting (transactions vary that much
        // without any contention, and a limit that read it as queueing fell to half the pool).
        let gradient = (TOLERANCE * noload.as_secs_f64() / average.as_secs_f64()).clamp(0.05, 1.0);
        // What may queue beyond the transactions that do not wait: half the square root of the
        // limit (one transaction of queue at a limit of four). A whole square root kept two
        // transactions per process on hot rows, where one ran 1.5-2x the orders.
        let queue = self.limit.sqrt() / 2.0;
        let target = self.limit * gradient + queue;
        // Smoothed: one window of noise moves the limit a fifth of the way up, and half of the
        // way down (waiting transactions cost more than idle connections).
        let before = self.permits();
        let step = if target < self.limit { 0.5 } else { 0.2 };
        self.limit =
            ((1.0 - step) * self.limit + step * target).clamp(MIN_LIMIT as f64, self.max as f64);
        self.updates += 1;
        if self.updates.is_multiple_of(NOLOAD_REFRESH) {
            self.noload = self.window_min;
        }
        self.window_min = None;
        self.window_sum = Duration::ZERO;
        self.window_len = 0;
        let after = self.permits();
        (after != before).then_some(after)
    }

    /// The transactions admitted at once: the limit rounded down, so a limit that hovers
    /// between one and two (hot rows) admits one rather than flapping between them.
    fn permits(&self) -> usize {
        self.limit.floor() as usize
    }
}

/// The admission of request transactions: a semaphore whose permits follow the gradient
/// limit.
#[derive(Debug)]
pub(crate) struct Admission {
    permits: Arc<Semaphore>,
    state: Mutex<AdmissionState>,
    /// The store's name, the metrics' `backend` label.
    backend: &'static str,
}

#[derive(Debug)]
struct AdmissionState {
    gradient: Gradient,
    /// Permits handed out by the semaphore, counted against the limit: admitted transactions,
    /// plus permits to retire (the limit fell below what was out).
    issued: usize,
}

impl Admission {
    /// At most `max` transactions at once (the pool of the store named `backend`).
    pub(crate) fn new(max: usize, backend: &'static str) -> Arc<Self> {
        let gradient = Gradient::new(max.max(MIN_LIMIT));
        let issued = gradient.permits();
        metrics::gauge!(TRANSACTIONS_ADMITTED_METRIC, "backend" => backend).set(issued as f64);
        metrics::counter!(ADMISSION_TIMEOUTS_METRIC, "backend" => backend).increment(0);
        Arc::new(Admission {
            permits: Arc::new(Semaphore::new(issued)),
            state: Mutex::new(AdmissionState { gradient, issued }),
            backend,
        })
    }

    /// The current limit.
    pub(crate) fn limit(&self) -> usize {
        self.state
            .lock()
            .map(|s| s.gradient.permits())
            .unwrap_or(MIN_LIMIT)
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

    fn admitted(self: &Arc<Self>, permit: OwnedSemaphorePermit) -> Admitted {
        Admitted {
            admission: Arc::clone(self),
            permit: Some(permit),
            since: Instant::now(),
        }
    }

    /// A transaction ended after `took`: the limit follows, and its permit goes back (or is
    /// retired when the limit fell).
    fn release(&self, permit: OwnedSemaphorePermit, took: Duration) {
        let Ok(mut state) = self.state.lock() else {
            return;
        };
        if let Some(limit) = state.gradient.sample(took) {
            tracing::debug!(limit, "request transactions admitted at once");
            metrics::gauge!(TRANSACTIONS_ADMITTED_METRIC, "backend" => self.backend)
                .set(limit as f64);
            // Raise: new permits at once. Lower: retire permits as they come back.
            if limit > state.issued {
                self.permits.add_permits(limit - state.issued);
                state.issued = limit;
            }
        }
        let limit = state.gradient.permits();
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

/// A transaction's place among those admitted at once; given back when dropped, with the
/// transaction's time.
#[derive(Debug)]
pub(crate) struct Admitted {
    admission: Arc<Admission>,
    permit: Option<OwnedSemaphorePermit>,
    since: Instant,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        if let Some(permit) = self.permit.take() {
            self.admission.release(permit, self.since.elapsed());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The limit after many transactions whose times `took(limit, i)` gives.
    fn settle(gradient: &mut Gradient, took: impl Fn(usize, usize) -> Duration) -> usize {
        for i in 0..20_000 {
            let limit = gradient.permits();
            gradient.sample(took(limit, i));
        }
        gradient.permits()
    }

    #[test]
    fn without_waiting_the_limit_stays_at_the_pool() {
        let mut gradient = Gradient::new(16);
        let limit = settle(&mut gradient, |_, i| {
            Duration::from_micros(1_000 + (i % 7) as u64 * 200)
        });
        assert_eq!(limit, 16);
    }

    #[test]
    fn lock_waits_bring_the_limit_down_to_one_or_two() {
        // A transaction that meets no other on the hot rows takes 2 ms; the others wait 20 ms
        // for each one beside them.
        let mut gradient = Gradient::new(16);
        let limit = settle(&mut gradient, |limit, i| {
            let waits = if i % limit == 0 { 0 } else { limit as u64 - 1 };
            Duration::from_millis(2 + 20 * waits)
        });
        assert!(limit <= 2, "{limit}");
    }

    #[test]
    fn a_saturated_server_keeps_more_than_its_cores() {
        // Four cores: past four at once, the average time grows with the queue; the quickest
        // transactions still take the time without waiting.
        let mut gradient = Gradient::new(16);
        let limit = settle(&mut gradient, |limit, i| {
            if i % 8 == 0 {
                Duration::from_millis(2)
            } else {
                Duration::from_micros(2_000 * (limit.max(4) as u64) / 4)
            }
        });
        assert!((5..=12).contains(&limit), "{limit}");
    }

    #[tokio::test]
    async fn a_lower_limit_retires_permits_as_they_come_back() {
        let admission = Admission::new(4, "test");
        let held: Vec<_> = (0..4).map(|_| admission.try_admit()).collect();
        assert!(held.iter().all(Option::is_some));
        assert!(admission.try_admit().is_none());
        {
            let mut state = admission.state.lock().unwrap_or_else(|e| e.into_inner());
            state.gradient.limit = 2.0;
        }
        drop(held);
        assert_eq!(admission.permits.available_permits(), 2);
        let (a, b) = (admission.try_admit(), admission.try_admit());
        assert!(a.is_some() && b.is_some());
        assert!(admission.try_admit().is_none());
    }
}
