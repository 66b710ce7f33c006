//! The keys this process holds in flight, for the person on call: how many, and since when the
//! oldest one (a key held far longer than requests take is a handler stuck while holding it).
//!
//! One registry per process, not per engine: the two gauges have no labels, and every engine
//! of the process updates the same two series. A request enters when it takes its key (a claim
//! in the lease mode, its transaction in the one-transaction modes) and leaves when its outcome
//! is settled or its guard is dropped: an uncontended lock and a map insert or removal, and a
//! gauge update, per request; the oldest one's start is written only when it changes.

use metrics::Gauge;
use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

/// Gauge: the keys this process's requests hold now.
pub const KEYS_IN_FLIGHT_METRIC: &str = "idempotency_keys_in_flight";

/// Gauge: when the oldest of the keys this process holds now was taken (Unix time, seconds);
/// 0 while it holds none. Its age is `time() - idempotency_oldest_key_in_flight_start_timestamp_seconds`
/// where the gauge is above 0.
pub const OLDEST_KEY_IN_FLIGHT_METRIC: &str =
    "idempotency_oldest_key_in_flight_start_timestamp_seconds";

pub(crate) struct Registry {
    next: u64,
    /// Entry number (taken in order, so the first is the oldest) to its start, Unix seconds.
    started: BTreeMap<u64, f64>,
}

impl Registry {
    const fn new() -> Mutex<Self> {
        Mutex::new(Registry {
            next: 0,
            started: BTreeMap::new(),
        })
    }

    fn oldest(&self) -> f64 {
        self.started.values().next().copied().unwrap_or(0.0)
    }
}

/// The process's registry.
static PROCESS: Mutex<Registry> = Registry::new();

fn lock(registry: &Mutex<Registry>) -> MutexGuard<'_, Registry> {
    // The registry is consistent between statements: a panic elsewhere cannot leave it half
    // written, so a poisoned lock is still good to use.
    registry.lock().unwrap_or_else(PoisonError::into_inner)
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |since| since.as_secs_f64())
}

/// One request's place in the registry; handed back with [`InFlightGauges::leave`].
#[derive(Debug)]
pub(crate) struct InFlight(u64);

/// An engine's handles on the two gauges (resolved once, when the engine is built, so a request
/// does not look them up).
pub(crate) struct InFlightGauges {
    registry: &'static Mutex<Registry>,
    count: Gauge,
    oldest: Gauge,
}

impl InFlightGauges {
    /// The handles, and both series exported now (at what the registry holds), so that an alert
    /// on them has a series to watch before the first request.
    pub(crate) fn announce() -> Self {
        Self::over(&PROCESS)
    }

    fn over(registry: &'static Mutex<Registry>) -> Self {
        let gauges = InFlightGauges {
            registry,
            count: metrics::gauge!(KEYS_IN_FLIGHT_METRIC),
            oldest: metrics::gauge!(OLDEST_KEY_IN_FLIGHT_METRIC),
        };
        let registry = lock(registry);
        gauges.count.set(registry.started.len() as f64);
        gauges.oldest.set(registry.oldest());
        drop(registry);
        gauges
    }

    /// A request took its key now.
    pub(crate) fn enter(&self) -> InFlight {
        let now = unix_now();
        let mut registry = lock(self.registry);
        let id = registry.next;
        registry.next += 1;
        let first = registry.started.is_empty();
        registry.started.insert(id, now);
        self.count.increment(1.0);
        if first {
            self.oldest.set(now);
        }
        InFlight(id)
    }

    /// The request of `entry` no longer holds its key.
    pub(crate) fn leave(&self, entry: InFlight) {
        let mut registry = lock(self.registry);
        let was_oldest = registry.started.keys().next() == Some(&entry.0);
        if registry.started.remove(&entry.0).is_none() {
            return;
        }
        self.count.decrement(1.0);
        if was_oldest {
            self.oldest.set(registry.oldest());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_store::metrics_by_series;
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    fn gauge(seen: &BTreeMap<String, DebugValue>, name: &str) -> f64 {
        match seen.get(&format!("{name}{{}}")) {
            Some(DebugValue::Gauge(value)) => value.into_inner(),
            other => panic!("{name}: {other:?} in {seen:?}"),
        }
    }

    /// Three requests in flight, then they leave, the oldest second: the count follows, and
    /// the oldest start moves only when the oldest leaves, to the next one's, then to 0.
    /// (Reading the debugging recorder swaps its gauges to 0: each read shows the count's
    /// change since the last read, and the start set since then, 0 when none was.)
    #[test]
    fn the_gauges_follow_the_keys_in_flight_and_the_oldest_start() {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let _local = metrics::set_default_local_recorder(&recorder);
        let registry: &'static Mutex<Registry> = Box::leak(Box::new(Registry::new()));
        let gauges = InFlightGauges::over(registry);
        let read = || {
            let seen = metrics_by_series(&snapshotter);
            (
                gauge(&seen, KEYS_IN_FLIGHT_METRIC),
                gauge(&seen, OLDEST_KEY_IN_FLIGHT_METRIC),
            )
        };
        assert_eq!(read(), (0.0, 0.0), "exported at zero before any request");

        let before = unix_now();
        let first = gauges.enter();
        let (count, first_start) = read();
        assert_eq!(count, 1.0);
        assert!(first_start >= before && first_start <= unix_now());

        std::thread::sleep(std::time::Duration::from_millis(20));
        let second = gauges.enter();
        let third = gauges.enter();
        assert_eq!(
            read(),
            (2.0, 0.0),
            "newer keys leave the oldest start alone"
        );
        assert_eq!(lock(registry).oldest(), first_start);

        gauges.leave(third);
        assert_eq!(read(), (-1.0, 0.0), "neither is the oldest's");
        gauges.leave(first);
        let (count, second_start) = read();
        assert_eq!(count, -1.0);
        assert!(
            second_start >= first_start + 0.015,
            "the second request's start: {second_start} after {first_start}"
        );
        gauges.leave(second);
        assert_eq!(read(), (-1.0, 0.0));
        assert_eq!(lock(registry).oldest(), 0.0);
        assert!(lock(registry).started.is_empty());
    }
}
