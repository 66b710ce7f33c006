//! The purge loop an application spawns where no server-side purge runs, and its metrics.

use super::IdempotencyStore;
use std::time::Duration;

/// Purges expired records of `store` every `period`, `batch` rows per statement, until the
/// future is dropped. Spawn it where no server-side purge exists (PostgreSQL without pg_cron):
///
/// ```no_run
/// # async fn run(store: std::sync::Arc<dyn idempotency_core::IdempotencyStore>) {
/// use std::time::Duration;
/// tokio::spawn(async move {
///     idempotency_core::purge_periodically(&*store, Duration::from_secs(3600), 10_000).await
/// });
/// # }
/// ```
/// Purging only reclaims space: expired records are already absent on read. Errors are logged
/// and the next period tries again.
///
/// Each run is counted in `idempotency_purge_runs_total{backend, result}` (`result`: `ok` or
/// `failed`), the rows it deleted in `idempotency_purged_records_total{backend}`, and a
/// successful run sets `idempotency_purge_last_success_timestamp_seconds{backend}` (Unix time),
/// which an alert compares with `time()` to notice a purge that stopped running.
pub async fn purge_periodically<S: IdempotencyStore + ?Sized>(
    store: &S,
    period: Duration,
    batch: usize,
) {
    let backend = store.backend();
    let runs_ok = metrics::counter!(PURGE_RUNS, "backend" => backend, "result" => "ok");
    let runs_failed = metrics::counter!(PURGE_RUNS, "backend" => backend, "result" => "failed");
    let purged = metrics::counter!(PURGED_RECORDS, "backend" => backend);
    let last_success = metrics::gauge!(PURGE_LAST_SUCCESS, "backend" => backend);
    // Exported at zero before the first run, so a dashboard and `increase()` see them.
    runs_ok.increment(0);
    runs_failed.increment(0);
    purged.increment(0);
    let batch = batch.max(1);
    let mut ticker = tokio::time::interval(period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first tick completes at once: purge right away, then every period.
    loop {
        ticker.tick().await;
        let mut total = 0u64;
        let mut failed = false;
        loop {
            match store.purge_expired(batch).await {
                Ok(n) => {
                    total += n;
                    purged.increment(n);
                    if n < batch as u64 {
                        break;
                    }
                }
                Err(error) => {
                    tracing::warn!(backend = store.backend(), error = %crate::error::ErrorChain(&error), "purge of expired idempotency records failed");
                    failed = true;
                    break;
                }
            }
        }
        if failed {
            runs_failed.increment(1);
        } else {
            runs_ok.increment(1);
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |since| since.as_secs_f64());
            last_success.set(now);
        }
        tracing::debug!(
            backend = store.backend(),
            purged = total,
            "purged expired idempotency records"
        );
    }
}

/// `idempotency_purge_runs_total{backend, result}`.
const PURGE_RUNS: &str = "idempotency_purge_runs_total";
/// `idempotency_purged_records_total{backend}`.
const PURGED_RECORDS: &str = "idempotency_purged_records_total";
/// `idempotency_purge_last_success_timestamp_seconds{backend}`.
const PURGE_LAST_SUCCESS: &str = "idempotency_purge_last_success_timestamp_seconds";

#[cfg(test)]
mod tests {
    /// Each purge run is counted by its result, the rows it deleted are added up, and a
    /// successful run sets the timestamp an alert compares with `time()`; a failed run leaves
    /// the timestamp where the last success put it.
    #[test]
    #[allow(clippy::unwrap_used)]
    fn purge_runs_are_counted_and_timestamped() {
        use crate::test_store::Probe;
        use metrics_util::debugging::{DebugValue, DebuggingRecorder};
        use std::time::Duration;

        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let store = Probe {
            purges: std::sync::Mutex::new(vec![
                Ok(10),
                Ok(3),
                Err(crate::error::StoreError::Unavailable {
                    backend: "probe",
                    source: "down".into(),
                }),
            ]),
            ..Probe::default()
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        // The thread-local recorder sees every run: the purge runs on this thread only.
        let _local = metrics::set_default_local_recorder(&recorder);
        runtime.block_on(async {
            // Batches of 10: run 1 deletes 10 then 3 (a short batch ends the run), run 2 fails,
            // run 3 deletes nothing.
            let purging = super::purge_periodically(&store, Duration::from_millis(40), 10);
            let _ = tokio::time::timeout(Duration::from_millis(100), purging).await;
        });
        let seen = crate::test_store::metrics_by_series(&snapshotter);
        assert_eq!(
            seen.get("idempotency_purge_runs_total{backend=probe,result=ok}"),
            Some(&DebugValue::Counter(2)),
            "{seen:?}"
        );
        assert_eq!(
            seen.get("idempotency_purge_runs_total{backend=probe,result=failed}"),
            Some(&DebugValue::Counter(1)),
            "{seen:?}"
        );
        assert_eq!(
            seen.get("idempotency_purged_records_total{backend=probe}"),
            Some(&DebugValue::Counter(13)),
            "{seen:?}"
        );
        match seen.get("idempotency_purge_last_success_timestamp_seconds{backend=probe}") {
            Some(DebugValue::Gauge(at)) => assert!(at.into_inner() > 1.7e9, "{at:?}"),
            other => panic!("no timestamp: {other:?}"),
        }
    }
}
