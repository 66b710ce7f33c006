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

/// How long the readiness probe, and a scrape's reading of the store's footprint, wait for the
/// store.
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

/// `GET /metrics`: what `handle` recorded, in the Prometheus text format. With `store`, each
/// scrape first records what the store holds (`idempotency_store_records` and
/// `idempotency_store_bytes`, one cheap round trip: see `idempotency::monitoring::record_footprint`);
/// a store that does not answer in time leaves them where the last scrape put them.
pub fn metrics_route(handle: PrometheusHandle, store: Option<Arc<dyn IdempotencyStore>>) -> Router {
    Router::new().route(
        "/metrics",
        get(move || {
            let handle = handle.clone();
            let store = store.clone();
            async move {
                if let Some(store) = store
                    && let Err(error) =
                        idempotency::monitoring::record_footprint(&*store, READINESS_WITHIN).await
                {
                    tracing::warn!(
                        error = %idempotency::ErrorChain(&error),
                        "could not read what the idempotency store holds for this scrape"
                    );
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
