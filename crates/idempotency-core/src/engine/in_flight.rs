//! The keys an engine's requests hold in flight, for the person on call: how many, and since
//! when the oldest one (a key held far longer than requests take is a handler stuck while
//! holding it).
//!
//! One registry per engine, so that engines never wait on each other: both gauges carry an
//! `engine` label (`<backend>-<n>`, `n` counting the engines this process built), and a scrape
//! aggregates them (`sum by (instance)` for the count, `min by (instance)` over the starts above 0
//! for the oldest). A request enters when it takes its key (a claim in the lease mode, its
//! transaction in the one-transaction modes) and leaves when its outcome is settled or its guard
//! is dropped: the engine's own lock (uncontended unless two of its requests enter or leave at
//! the same instant), a queue push or removal and a gauge update per request; the oldest one's
//! start is written only when it changes. When the engine is dropped (every request of it has
//! left by then) both gauges are set to 0.

use crate::sync::{Mutex, MutexGuard};
use metrics::Gauge;
use std::collections::VecDeque;
use std::sync::PoisonError;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Gauge, by `engine`: the keys the engine's requests hold now.
pub const KEYS_IN_FLIGHT_METRIC: &str = "idempotency_keys_in_flight";

/// Gauge, by `engine`: when the oldest of the keys the engine's requests hold now was taken
/// (Unix time, seconds); 0 while it holds none. The process's oldest key's age is
/// `time() - min by (instance) (idempotency_oldest_key_in_flight_start_timestamp_seconds > 0)`.
pub const OLDEST_KEY_IN_FLIGHT_METRIC: &str =
    "idempotency_oldest_key_in_flight_start_timestamp_seconds";

/// The label that tells one engine's in-flight gauges from another's in the same process.
pub const ENGINE_LABEL: &str = "engine";

/// How many engines this process has built: the `n` of each one's `engine` label.
static ENGINES_BUILT: AtomicU64 = AtomicU64::new(0);

#[derive(Default)]
struct Registry {
    next: u64,
    /// Entry numbers and their starts (Unix seconds), in the order they were taken, so sorted
    /// by number and the first the oldest. A queue, not a map: it keeps its buffer when it
    /// empties, so a request allocates nothing here (a `BTreeMap` allocated a node and freed
    /// it for each request whenever it held no other).
    started: VecDeque<(u64, f64)>,
}

impl Registry {
    fn oldest(&self) -> f64 {
        self.started.front().map_or(0.0, |&(_, start)| start)
    }
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |since| since.as_secs_f64())
}

/// One request's place in its engine's registry; handed back with [`InFlightGauges::leave`].
#[derive(Debug)]
pub(crate) struct InFlight(u64);

/// One engine's registry of the keys its requests hold, and its handles on the two gauges
/// (resolved once, when the engine is built, so a request does not look them up).
pub(crate) struct InFlightGauges {
    /// The `engine` label's value.
    engine: String,
    registry: Mutex<Registry>,
    count: Gauge,
    oldest: Gauge,
    /// Under the schedule checker, the oldest start last written, as the gauge would hold it
    /// (the gauge itself is invisible to the checker).
    #[cfg(idempotency_loom)]
    oldest_written: crate::sync::AtomicU64,
}

impl InFlightGauges {
    /// The registry of a new engine over a store named `backend`, with both series exported
    /// now at 0, so that an alert on them has a series to watch before the first request.
    pub(crate) fn announce(backend: &'static str) -> Self {
        let n = ENGINES_BUILT.fetch_add(1, Ordering::Relaxed) + 1;
        let engine = format!("{backend}-{n}");
        let gauges = InFlightGauges {
            registry: Mutex::new(Registry::default()),
            count: metrics::gauge!(KEYS_IN_FLIGHT_METRIC, ENGINE_LABEL => engine.clone()),
            oldest: metrics::gauge!(OLDEST_KEY_IN_FLIGHT_METRIC, ENGINE_LABEL => engine.clone()),
            engine,
            #[cfg(idempotency_loom)]
            oldest_written: crate::sync::AtomicU64::new(0),
        };
        gauges.count.set(0.0);
        gauges.oldest.set(0.0);
        gauges
    }

    /// The `engine` label's value on this engine's gauges.
    pub(crate) fn engine_label(&self) -> &str {
        &self.engine
    }

    fn lock(&self) -> MutexGuard<'_, Registry> {
        // The registry is consistent between statements: a panic elsewhere cannot leave it half
        // written, so a poisoned lock is still good to use.
        self.registry.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A request took its key now.
    pub(crate) fn enter(&self) -> InFlight {
        let now = unix_now();
        let mut registry = self.lock();
        let id = registry.next;
        registry.next += 1;
        let first = registry.started.is_empty();
        registry.started.push_back((id, now));
        if first {
            // Under the lock: two requests' writes of the oldest start land in the order of
            // their changes to the registry.
            self.set_oldest(now);
        }
        drop(registry);
        self.count.increment(1.0);
        InFlight(id)
    }

    /// The request of `entry` no longer holds its key.
    pub(crate) fn leave(&self, entry: InFlight) {
        let mut registry = self.lock();
        let Ok(at) = registry
            .started
            .binary_search_by_key(&entry.0, |&(id, _)| id)
        else {
            return;
        };
        registry.started.remove(at);
        let was_oldest = at == 0;
        if was_oldest {
            let oldest = registry.oldest();
            #[cfg(idempotency_loom)]
            if crate::sync::SEEDED_RACE.load(std::sync::atomic::Ordering::Relaxed) {
                // The seeded race: the new oldest start written after the lock is let go, so
                // another request's write can land before it and be overwritten.
                drop(registry);
                self.set_oldest(oldest);
                self.count.decrement(1.0);
                return;
            }
            self.set_oldest(oldest);
        }
        drop(registry);
        self.count.decrement(1.0);
    }

    fn set_oldest(&self, start: f64) {
        self.oldest.set(start);
        #[cfg(idempotency_loom)]
        self.oldest_written
            .store(start.to_bits(), crate::sync::Ordering::SeqCst);
    }
}

impl Drop for InFlightGauges {
    fn drop(&mut self) {
        // Every guard holds the engine, so none is left: the engine's series read "nothing
        // held" rather than what they last said.
        self.count.set(0.0);
        self.oldest.set(0.0);
    }
}

#[cfg(all(test, idempotency_loom))]
mod loom_tests;

#[cfg(all(test, not(idempotency_loom)))]
mod tests {
    use super::*;
    use crate::test_store::metrics_by_series;
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    use std::collections::BTreeMap;

    /// The value of `name{engine}` in `seen`, if exported.
    fn series(seen: &BTreeMap<String, DebugValue>, name: &str, engine: &str) -> Option<f64> {
        match seen.get(&format!("{name}{{{ENGINE_LABEL}={engine}}}")) {
            Some(DebugValue::Gauge(value)) => Some(value.into_inner()),
            None => None,
            other => panic!("{name}: {other:?} in {seen:?}"),
        }
    }

    /// Three requests in flight, then they leave, the oldest second: the count follows, and
    /// the oldest start moves only when the oldest leaves, to the next one's, then to 0. A second
    /// engine's requests change only its own series, and a dropped engine's series read 0.
    /// (Reading the debugging recorder swaps its gauges to 0: each read shows the count's
    /// change since the last read, and the start set since then, 0 when none was.)
    #[test]
    fn each_engine_has_gauges_of_its_own_that_follow_its_keys_and_its_oldest_start() {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let _local = metrics::set_default_local_recorder(&recorder);
        let gauges = InFlightGauges::announce("memory");
        let engine = gauges.engine_label().to_owned();
        let other = InFlightGauges::announce("memory");
        let other_engine = other.engine_label().to_owned();
        assert!(engine.starts_with("memory-"), "{engine}");
        assert_ne!(engine, other_engine, "two engines, two labels");
        let read = |engine: &str| {
            let seen = metrics_by_series(&snapshotter);
            (
                series(&seen, KEYS_IN_FLIGHT_METRIC, engine).unwrap_or(0.0),
                series(&seen, OLDEST_KEY_IN_FLIGHT_METRIC, engine).unwrap_or(0.0),
            )
        };
        let seen = metrics_by_series(&snapshotter);
        for name in [KEYS_IN_FLIGHT_METRIC, OLDEST_KEY_IN_FLIGHT_METRIC] {
            for engine in [&engine, &other_engine] {
                assert_eq!(
                    series(&seen, name, engine),
                    Some(0.0),
                    "{name} of {engine} exported at zero before any request: {seen:?}"
                );
            }
        }

        let before = unix_now();
        let first = gauges.enter();
        let (count, first_start) = read(&engine);
        assert_eq!(count, 1.0);
        assert!(first_start >= before && first_start <= unix_now());

        std::thread::sleep(std::time::Duration::from_millis(20));
        let second = gauges.enter();
        let third = gauges.enter();
        assert_eq!(
            read(&engine),
            (2.0, 0.0),
            "newer keys leave the oldest start alone"
        );
        assert_eq!(gauges.lock().oldest(), first_start);

        let elsewhere = other.enter();
        let seen = metrics_by_series(&snapshotter);
        assert_eq!(series(&seen, KEYS_IN_FLIGHT_METRIC, &engine), Some(0.0));
        assert_eq!(
            series(&seen, KEYS_IN_FLIGHT_METRIC, &other_engine),
            Some(1.0)
        );
        assert!(
            series(&seen, OLDEST_KEY_IN_FLIGHT_METRIC, &other_engine).unwrap_or(0.0) > first_start,
            "the other engine's oldest is its own request's: {seen:?}"
        );
        other.leave(elsewhere);
        assert!(other.lock().started.is_empty());
        assert_eq!(
            gauges.lock().started.len(),
            3,
            "the first engine's keep theirs"
        );

        gauges.leave(third);
        assert_eq!(read(&engine), (-1.0, 0.0), "neither is the oldest's");
        gauges.leave(first);
        let (count, second_start) = read(&engine);
        assert_eq!(count, -1.0);
        assert!(
            second_start >= first_start + 0.015,
            "the second request's start: {second_start} after {first_start}"
        );
        gauges.leave(second);
        assert_eq!(read(&engine), (-1.0, 0.0));
        assert_eq!(gauges.lock().oldest(), 0.0);
        assert!(gauges.lock().started.is_empty());

        // Dropped while its registry says a key is held (it cannot be, with guards holding the
        // engine; the registry is made to say so here): both series are set to 0 on the way
        // out, not left at the last request's.
        let _held = gauges.enter();
        drop(gauges);
        assert_eq!(
            read(&engine),
            (0.0, 0.0),
            "a dropped engine's series read 0"
        );
    }
}
