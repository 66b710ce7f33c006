//! What the people who run a service on this library watch: the readiness probe of its store,
//! the buckets that suit the store-latency histogram, the keys held in flight and what the store
//! holds.
//!
//! ## Gauges
//!
//! - [`KEYS_IN_FLIGHT_METRIC`] and [`OLDEST_KEY_IN_FLIGHT_METRIC`]: the keys this process's
//!   requests hold now and when the oldest was taken, kept by the engine (every engine of the
//!   process counts in the same two series) from its creation on. A key held far longer than
//!   requests take is a handler stuck while holding it; the shipped alert
//!   `IdempotencyKeyStuckInFlight` fires at five minutes.
//! - [`STORE_RECORDS_METRIC`] and [`STORE_BYTES_METRIC`], by backend: what the store holds, set by
//!   [`record_footprint`] where a scrape is answered.
//!
//! ## Readiness: may this instance take requests now?
//!
//! A liveness probe must not touch the store (a store outage would restart every instance at
//! once, and restarting cures nothing); a readiness probe should, so that a load balancer stops
//! sending covered requests to an instance that would answer them all `503`. [`readiness`] is
//! the probe: one bounded round trip ([`IdempotencyStore::check_state`]), which also notices a
//! store that lost its records (an UNLOGGED table emptied by a crash, Redis restarted without
//! persistence) and counts the loss in `idempotency_store_state_lost_total`.
//!
//! In an axum app (the store an `Arc<dyn IdempotencyStore>` or any clonable store):
//!
//! ```
//! # use std::sync::Arc;
//! # use std::time::Duration;
//! # fn app(store: Arc<dyn idempotency_core::IdempotencyStore>) -> axum::Router {
//! use axum::{Router, http::StatusCode, routing::get};
//!
//! Router::new()
//!     .route("/health/live", get(|| async { "live" }))
//!     .route("/health/ready", get(move || {
//!         let store = store.clone();
//!         async move {
//!             let readiness = idempotency_core::monitoring::readiness(&*store, Duration::from_secs(2)).await;
//!             if !readiness.is_ready() {
//!                 tracing::warn!(%readiness, "readiness probe failed"); // the whole reason
//!             }
//!             let status = if readiness.is_ready() { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
//!             (status, readiness.probe_answer()) // its kind only: no role, schema or table
//!         }
//!     }))
//! # }
//! ```

use crate::error::StoreError;
use crate::store::Footprint;
use crate::store::IdempotencyStore;
pub use crate::store::PoolStatus;

/// Upper bounds (seconds) for `idempotency_store_duration_seconds`: from half a millisecond (a
/// replay on a local Redis) to the default store timeout (5 s) and past it, so both the usual
/// latencies and the calls that time out land in buckets of their own. For
/// `metrics-exporter-prometheus`:
/// `PrometheusBuilder::new().set_buckets_for_metric(Matcher::Full("idempotency_store_duration_seconds".into()), STORE_DURATION_BUCKETS)`.
pub const STORE_DURATION_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

pub use crate::engine::admission::{ADMISSION_TIMEOUTS_METRIC, TRANSACTIONS_ADMITTED_METRIC};
pub use crate::engine::in_flight::{
    ENGINE_LABEL, KEYS_IN_FLIGHT_METRIC, OLDEST_KEY_IN_FLIGHT_METRIC,
};
pub use crate::engine::store_metrics::STORE_DURATION_METRIC;
pub use crate::engine::waiters::{WAITERS_REFUSED_METRIC, WAITING_DUPLICATES_METRIC};

/// Gauge, by `backend`: the records the store holds ([`record_footprint`]).
pub const STORE_RECORDS_METRIC: &str = "idempotency_store_records";

/// Gauge, by `backend`: the bytes the store's records take ([`record_footprint`]).
pub const STORE_BYTES_METRIC: &str = "idempotency_store_bytes";

/// Gauge, by `backend`: 1 when the store answered its last check within the bound
/// ([`watch_store`]), 0 when it did not. Read from memory at each scrape, so it says "down" while
/// the store is down, even when no request comes.
pub const STORE_UP_METRIC: &str = "idempotency_store_up";

/// Gauge, by `backend`: the most connections the store's pool opens ([`record_pool`]).
pub const POOL_MAX_METRIC: &str = "idempotency_store_pool_max_connections";

/// Gauge, by `backend` and `state` (`in_use`, `idle`): the store's open connections
/// ([`record_pool`]).
pub const POOL_CONNECTIONS_METRIC: &str = "idempotency_store_pool_connections";

/// Gauge, by `backend`: calls waiting for one of the store's connections ([`record_pool`]).
pub const POOL_WAITING_METRIC: &str = "idempotency_store_pool_waiting";

/// Sets the pool gauges from what `store` says of its pool ([`IdempotencyStore::pool_status`]),
/// from memory: call it where a scrape is answered. A store without a pool sets none.
pub fn record_pool<S: IdempotencyStore + ?Sized>(store: &S) {
    let Some(pool) = store.pool_status() else {
        return;
    };
    let backend = store.backend();
    metrics::gauge!(POOL_MAX_METRIC, "backend" => backend).set(pool.max as f64);
    let in_use = pool.open.saturating_sub(pool.idle);
    metrics::gauge!(POOL_CONNECTIONS_METRIC, "backend" => backend, "state" => "in_use")
        .set(in_use as f64);
    metrics::gauge!(POOL_CONNECTIONS_METRIC, "backend" => backend, "state" => "idle")
        .set(pool.idle as f64);
    if let Some(waiting) = pool.waiting {
        metrics::gauge!(POOL_WAITING_METRIC, "backend" => backend).set(waiting as f64);
    }
}

/// Checks `store` every `every`, each check bounded by `within`: whether it answers and holds
/// its records ([`readiness`]: `idempotency_store_up` 1 or 0) and, when it does, what it holds
/// ([`record_footprint`]). Spawn it beside the metrics route, which then renders from memory:
/// a scrape never waits on the store, so it is answered during a database freeze too, and the
/// store's gauges say what the last check saw. Runs until dropped.
///
/// ```no_run
/// # async fn run(store: std::sync::Arc<dyn idempotency_core::IdempotencyStore>) {
/// use std::time::Duration;
/// tokio::spawn(async move {
///     idempotency_core::monitoring::watch_store(&*store, Duration::from_secs(5), Duration::from_secs(2)).await
/// });
/// # }
/// ```
pub async fn watch_store<S: IdempotencyStore + ?Sized>(
    store: &S,
    every: Duration,
    within: Duration,
) {
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        check_store(store, within).await;
    }
}

/// One check of [`watch_store`]: sets `idempotency_store_up` (1 when the store answered
/// [`readiness`] within `within`, 0 when it did not) and, when it answered, what it holds
/// ([`record_footprint`]). Returns whether the store was up.
pub async fn check_store<S: IdempotencyStore + ?Sized>(store: &S, within: Duration) -> bool {
    let backend = store.backend();
    let up = metrics::gauge!(STORE_UP_METRIC, "backend" => backend);
    if let Readiness::Unavailable(error) = readiness(store, within).await {
        tracing::warn!(backend, error = %crate::error::ErrorChain(&error), "the idempotency store did not answer its check");
        up.set(0.0);
        return false;
    }
    up.set(1.0);
    if let Err(error) = record_footprint(store, within).await {
        tracing::warn!(backend, error = %crate::error::ErrorChain(&error), "could not read what the idempotency store holds");
    }
    true
}

/// Reads what `store` holds ([`IdempotencyStore::footprint`], one cheap round trip) within
/// `within`, and sets `idempotency_store_records` and `idempotency_store_bytes` by backend.
/// [`watch_store`] calls it in the background; a scrape should not wait on the store. A figure
/// the store cannot tell is left unset; an error or a timeout leaves both where the last answer
/// put them, and is returned for the caller to log.
pub async fn record_footprint<S: IdempotencyStore + ?Sized>(
    store: &S,
    within: Duration,
) -> Result<Option<Footprint>, StoreError> {
    let backend = store.backend();
    let footprint = match tokio::time::timeout(within, store.footprint()).await {
        Ok(answer) => answer?,
        Err(_) => {
            return Err(StoreError::Timeout {
                backend,
                timeout: within,
            });
        }
    };
    if let Some(footprint) = footprint {
        if let Some(records) = footprint.records {
            metrics::gauge!(STORE_RECORDS_METRIC, "backend" => backend).set(records as f64);
        }
        if let Some(bytes) = footprint.bytes {
            metrics::gauge!(STORE_BYTES_METRIC, "backend" => backend).set(bytes as f64);
        }
    }
    Ok(footprint)
}
use std::fmt;
use std::time::Duration;

/// The store's answer to a readiness probe.
#[derive(Debug)]
#[non_exhaustive]
pub enum Readiness {
    /// The store answered and holds its records.
    Ready,
    /// The store answered, and had lost its records since it was last checked: keys completed
    /// before the loss run again if retried (the loss is counted, logged as an error, and its
    /// marker restored, so the next probe is ready again). Not ready for this probe, so that the
    /// loss shows where instances are watched, besides its metric and its log line.
    StateLost,
    /// The store did not answer within the probe's bound, or answered with an error: covered
    /// requests would be answered `503` (or run without protection, with `fail_open`).
    Unavailable(StoreError),
}

impl Readiness {
    /// Whether the instance may take requests: only [`Readiness::Ready`].
    pub fn is_ready(&self) -> bool {
        matches!(self, Readiness::Ready)
    }

    /// What a probe may be answered with: the kind of failure, never the store's own words
    /// (a database's error names roles, schemas and tables, and a readiness route usually
    /// sits on the public listener). [`Display`](fmt::Display) gives the whole reason, for the
    /// log.
    pub fn probe_answer(&self) -> &'static str {
        match self {
            Readiness::Ready => "ready",
            Readiness::StateLost => "not ready: the idempotency store had lost its records",
            Readiness::Unavailable(StoreError::Timeout { .. }) => {
                "not ready: the idempotency store did not answer in time"
            }
            Readiness::Unavailable(error) if error.is_unreachable() => {
                "not ready: the idempotency store cannot be reached"
            }
            Readiness::Unavailable(_) => {
                "not ready: the idempotency store answered with an error (see the log)"
            }
        }
    }
}

impl fmt::Display for Readiness {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Readiness::Ready => f.write_str("ready"),
            Readiness::StateLost => f.write_str(
                "not ready: the idempotency store had lost its records (counted in \
                 idempotency_store_state_lost_total); it is checked again at the next probe",
            ),
            Readiness::Unavailable(error) => {
                let chain = crate::error::ErrorChain(error);
                write!(
                    f,
                    "not ready: the idempotency store is unavailable: {chain}"
                )
            }
        }
    }
}

/// Asks `store` whether it answers and still holds its records, within `within`: one round
/// trip on PostgreSQL and Redis, nothing on the memory store. A store that does not answer in
/// time is [`Readiness::Unavailable`] with [`StoreError::Timeout`].
pub async fn readiness<S: IdempotencyStore + ?Sized>(store: &S, within: Duration) -> Readiness {
    match tokio::time::timeout(within, store.check_state()).await {
        Ok(Ok(false)) => Readiness::Ready,
        Ok(Ok(true)) => Readiness::StateLost,
        Ok(Err(error)) => Readiness::Unavailable(error),
        Err(_) => Readiness::Unavailable(StoreError::Timeout {
            backend: store.backend(),
            timeout: within,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_store::{Probe, metrics_by_series};

    fn probe(answer: fn() -> Result<bool, StoreError>, delay: Duration) -> Probe {
        Probe {
            answer,
            delay,
            ..Probe::default()
        }
    }

    #[tokio::test]
    async fn each_answer_of_the_store_is_its_readiness() {
        let within = Duration::from_millis(200);
        let ready = readiness(&probe(|| Ok(false), Duration::ZERO), within).await;
        assert!(ready.is_ready(), "{ready}");
        assert_eq!(ready.to_string(), "ready");
        let lost = readiness(&probe(|| Ok(true), Duration::ZERO), within).await;
        assert!(matches!(lost, Readiness::StateLost), "{lost}");
        let down = readiness(
            &probe(
                || {
                    Err(StoreError::Unavailable {
                        backend: "probe",
                        source: "connection refused".into(),
                    })
                },
                Duration::ZERO,
            ),
            within,
        )
        .await;
        assert!(!down.is_ready());
        assert!(down.to_string().contains("connection refused"), "{down}");
    }

    /// The log gets the store's words; the probe's answer only their kind (a rotated password
    /// names the role, a dropped table the schema and table).
    #[tokio::test]
    async fn the_probe_answer_never_carries_the_store_s_words() {
        let within = Duration::from_millis(200);
        let denied = readiness(
            &probe(
                || {
                    Err(StoreError::Backend {
                        backend: "probe",
                        source: "password authentication failed for user \"orders_app\"".into(),
                    })
                },
                Duration::ZERO,
            ),
            within,
        )
        .await;
        assert!(denied.to_string().contains("orders_app"), "{denied}");
        let answer = denied.probe_answer();
        assert!(
            !answer.contains("orders_app") && answer.starts_with("not ready"),
            "{answer}"
        );
        let gone = readiness(
            &probe(
                || {
                    Err(StoreError::Unavailable {
                        backend: "probe",
                        source: "relation \"billing.idempotency_keys\" does not exist".into(),
                    })
                },
                Duration::ZERO,
            ),
            within,
        )
        .await;
        assert!(
            !gone.probe_answer().contains("billing"),
            "{}",
            gone.probe_answer()
        );
        let ready = readiness(&probe(|| Ok(false), Duration::ZERO), within).await;
        assert_eq!(ready.probe_answer(), "ready");
    }

    /// The footprint a store tells is set on the two gauges by backend; a store that cannot
    /// tell sets neither.
    #[test]
    #[allow(clippy::unwrap_used)]
    fn the_footprint_is_set_on_its_gauges() {
        use metrics_util::debugging::{DebugValue, DebuggingRecorder};
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let _local = metrics::set_default_local_recorder(&recorder);
        let silent = Probe::default();
        let told = runtime
            .block_on(record_footprint(&silent, Duration::from_millis(200)))
            .unwrap();
        assert_eq!(told, None);
        assert!(metrics_by_series(&snapshotter).is_empty());

        let telling = Probe {
            footprint: Some(Footprint::new(Some(12), Some(3456))),
            ..Probe::default()
        };
        runtime
            .block_on(record_footprint(&telling, Duration::from_millis(200)))
            .unwrap();
        let seen = metrics_by_series(&snapshotter);
        let gauge = |name: &str| match seen.get(&format!("{name}{{backend=probe}}")) {
            Some(DebugValue::Gauge(value)) => value.into_inner(),
            other => panic!("{name}: {other:?} in {seen:?}"),
        };
        assert_eq!(gauge(STORE_RECORDS_METRIC), 12.0);
        assert_eq!(gauge(STORE_BYTES_METRIC), 3456.0);
    }

    #[tokio::test]
    async fn a_store_that_does_not_answer_in_time_is_unavailable() {
        let slow = probe(|| Ok(false), Duration::from_secs(60));
        let answer = readiness(&slow, Duration::from_millis(50)).await;
        assert!(
            matches!(answer, Readiness::Unavailable(StoreError::Timeout { timeout, .. }) if timeout == Duration::from_millis(50)),
            "{answer}"
        );
    }
}
