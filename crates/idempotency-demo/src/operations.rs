//! What the person on call scrapes and probes: `GET /metrics` (the Prometheus text format),
//! `GET /health/live` and `GET /health/ready`. The task API serves them beside its routes; the
//! consumer demo (`tasks-consumer --ops-listen`) on a listener of their own.

use axum::Router;
use axum::http::{HeaderValue, StatusCode, header};
use axum::routing::get;
use idempotency::IdempotencyStore;
use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder, PrometheusHandle};
use std::sync::Arc;
use std::time::Duration;

/// How long the readiness probe, and the background check of the store, wait for it.
const READINESS_WITHIN: Duration = Duration::from_secs(2);

/// `GET /health/live` (never touches the store: a store outage must not restart every
/// instance) and `GET /health/ready` (`503` while the store does not answer, or on the probe
/// that finds it lost its records; see `idempotency::monitoring`).
pub fn health_routes(store: Arc<dyn IdempotencyStore>) -> Router {
    Router::new()
        .route("/health/live", get(|| async { "live\n" }))
        .route(
            "/health/ready",
            get(move || {
                let store = store.clone();
                async move {
                    let readiness =
                        idempotency::monitoring::readiness(&*store, READINESS_WITHIN).await;
                    let status = if readiness.is_ready() {
                        StatusCode::OK
                    } else {
                        tracing::warn!(%readiness, "readiness probe failed");
                        StatusCode::SERVICE_UNAVAILABLE
                    };
                    // The reason stays in the log: the probe sits on the public listener.
                    (status, format!("{}\n", readiness.probe_answer()))
                }
            }),
        )
}

/// The process's metrics recorder, in the Prometheus text format: installs it (once per
/// process) with [`STORE_DURATION_BUCKETS`](idempotency::monitoring::STORE_DURATION_BUCKETS) for
/// the store-latency histogram, and keeps its histograms drained in the background.
pub fn install_metrics() -> Result<PrometheusHandle, BuildError> {
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Full(idempotency::monitoring::STORE_DURATION_METRIC.into()),
            idempotency::monitoring::STORE_DURATION_BUCKETS,
        )?
        .install_recorder()?;
    let upkeep = handle.clone();
    tokio::spawn(async move {
        let mut every = tokio::time::interval(Duration::from_secs(5));
        loop {
            every.tick().await;
            upkeep.run_upkeep();
        }
    });
    Ok(handle)
}

/// How often the store is checked for the gauges a scrape shows (`idempotency_store_up`, what it
/// holds).
const WATCH_EVERY: Duration = Duration::from_secs(5);

/// `GET /metrics`: what `handle` recorded, in the Prometheus text format, answered from memory:
/// a scrape never waits on the store (before, each waited up to 2 s on the database, so with a 1 s
/// scrape every scrape failed during a freeze, and the in-flight gauges went blank exactly while
/// keys were held). With `store`, a task checks it every 5 s in the background
/// (`idempotency::monitoring::watch_store`: `idempotency_store_up`, `idempotency_store_records`,
/// `idempotency_store_bytes`), and each scrape reads its pool from memory
/// (`idempotency_store_pool_*`). Call it inside the runtime.
pub fn metrics_route(handle: PrometheusHandle, store: Option<Arc<dyn IdempotencyStore>>) -> Router {
    // Whether the first check is done: a scrape before it waits for it (bounded), so the
    // store's gauges exist from the first scrape on.
    let (checked, first_check) = tokio::sync::watch::channel(store.is_none());
    if let Some(store) = &store {
        let watched = Arc::clone(store);
        tokio::spawn(async move {
            idempotency::monitoring::check_store(&*watched, READINESS_WITHIN).await;
            let _ = checked.send(true);
            tokio::time::sleep(WATCH_EVERY).await;
            idempotency::monitoring::watch_store(&*watched, WATCH_EVERY, READINESS_WITHIN).await;
        });
    }
    Router::new().route(
        "/metrics",
        get(move || {
            let handle = handle.clone();
            let store = store.clone();
            let mut first_check = first_check.clone();
            async move {
                if !*first_check.borrow() {
                    let first = first_check.wait_for(|done| *done);
                    let _ = tokio::time::timeout(READINESS_WITHIN, first).await;
                }
                if let Some(store) = store {
                    idempotency::monitoring::record_pool(&*store);
                }
                (
                    [(
                        header::CONTENT_TYPE,
                        HeaderValue::from_static("text/plain; version=0.0.4"),
                    )],
                    handle.render(),
                )
            }
        }),
    )
}

/// [`health_routes`] and [`metrics_route`] together: what a process without routes of its own
/// serves on its operations listener.
pub fn routes(store: Arc<dyn IdempotencyStore>, metrics: PrometheusHandle) -> Router {
    health_routes(store.clone()).merge(metrics_route(metrics, Some(store)))
}
