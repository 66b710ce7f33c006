//! The gauges of the keys this process holds in flight, scraped from the Prometheus exporter
//! while requests hold their keys: the count follows the requests, the oldest one's start moves
//! only when the oldest finishes, a replay holds nothing, and a handler's failure (its key
//! released) or its panic (its guard dropped) lets the key go from the gauges too. Its own test
//! binary: the exporter is the process's recorder.
#![allow(clippy::unwrap_used)]

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::routing::post;
use bytes::Bytes;
use idempotency_core::Scope;
use idempotency_core::monitoring::{KEYS_IN_FLIGHT_METRIC, OLDEST_KEY_IN_FLIGHT_METRIC};
use idempotency_memory::MemoryStore;
use idempotency_tower::IdempotencyLayer;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::Semaphore;
use tower::ServiceExt;

/// Handlers wait for a permit: each permit added lets the longest-waiting one finish.
fn holding_app(gate: Arc<Semaphore>) -> Router {
    Router::new()
        .route(
            "/hold",
            post(move |body: Bytes| {
                let gate = gate.clone();
                async move {
                    gate.acquire().await.unwrap().forget();
                    match &body[..] {
                        b"fail" => (StatusCode::INTERNAL_SERVER_ERROR, "failed"),
                        b"panic" => panic!("the handler panics while holding its key"),
                        _ => (StatusCode::CREATED, "made"),
                    }
                }
            }),
        )
        .layer(
            IdempotencyLayer::builder(MemoryStore::default())
                .scope_with(|_| Scope::new("alice").ok())
                .build()
                .expect("valid idempotency layer settings"),
        )
}

fn request(key: &str, body: &'static str) -> Request<Body> {
    Request::post("/hold")
        .header("idempotency-key", key)
        .body(Body::from(body))
        .unwrap()
}

/// The values of `name`'s series, one per engine, in one rendering of the exporter.
fn exported(text: &str, name: &str) -> Vec<f64> {
    let values: Vec<f64> = text
        .lines()
        .filter_map(|line| {
            let labelled = line.strip_prefix(name)?.strip_prefix("{engine=\"")?;
            labelled.split_once("\"} ")?.1.parse().ok()
        })
        .collect();
    assert!(!values.is_empty(), "{name} not exported by engine: {text}");
    values
}

/// (keys in flight, oldest start), every engine of the process together the way a dashboard
/// reads them: the counts summed, the oldest of the starts above 0. Both from one rendering: two
/// renderings could straddle a request's entry (a start of 0 read before it, a count of 1 after).
fn scrape(handle: &PrometheusHandle) -> (f64, f64) {
    let text = handle.render();
    let oldest = exported(&text, OLDEST_KEY_IN_FLIGHT_METRIC)
        .into_iter()
        .filter(|start| *start > 0.0)
        .fold(0.0, |oldest: f64, start| {
            if oldest == 0.0 {
                start
            } else {
                oldest.min(start)
            }
        });
    (
        exported(&text, KEYS_IN_FLIGHT_METRIC).into_iter().sum(),
        oldest,
    )
}

/// Scrapes until the count is `want` (the request's task gets there in its own time).
async fn count_becomes(handle: &PrometheusHandle, want: f64) -> (f64, f64) {
    for _ in 0..500 {
        let seen = scrape(handle);
        // The two gauges are separate values, read one after the other by the exporter: a
        // scrape taken as a request enters or leaves may pair the new count with the old start
        // for an instant (a dashboard sees the same), so the pair is read until it agrees.
        if seen.0 == want && (want == 0.0) == (seen.1 == 0.0) {
            return seen;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    panic!("keys in flight never became {want}: {:?}", scrape(handle));
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gauges_follow_the_keys_this_process_holds() {
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder).unwrap();
    let gate = Arc::new(Semaphore::new(0));
    let app = holding_app(gate.clone());
    assert_eq!(scrape(&handle), (0.0, 0.0), "exported before any request");

    let before = unix_now();
    let first = tokio::spawn(app.clone().oneshot(request("first", "a")));
    let (_, first_start) = count_becomes(&handle, 1.0).await;
    assert!(
        first_start >= before.floor() && first_start <= unix_now(),
        "{first_start} not between {before} and now"
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    let second = tokio::spawn(app.clone().oneshot(request("second", "b")));
    assert_eq!(count_becomes(&handle, 2.0).await, (2.0, first_start));

    // The oldest finishes: the next one's start is the oldest now.
    gate.add_permits(1);
    assert_eq!(first.await.unwrap().unwrap().status(), StatusCode::CREATED);
    let (_, second_start) = count_becomes(&handle, 1.0).await;
    assert!(
        second_start >= first_start + 0.04,
        "{second_start} is the second request's start, after {first_start}"
    );

    // A replay of the first holds nothing.
    let replay = app.clone().oneshot(request("first", "a")).await.unwrap();
    assert_eq!(replay.status(), StatusCode::CREATED);
    assert_eq!(scrape(&handle), (1.0, second_start));

    // A failed handler's key is released; a panicking handler's guard is dropped.
    let failing = tokio::spawn(app.clone().oneshot(request("failing", "fail")));
    let panicking = tokio::spawn(app.clone().oneshot(request("panicking", "panic")));
    count_becomes(&handle, 3.0).await;
    gate.add_permits(3);
    assert_eq!(second.await.unwrap().unwrap().status(), StatusCode::CREATED);
    let failed = failing.await.unwrap().unwrap();
    assert_eq!(failed.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let _ = panicking.await;
    assert_eq!(count_becomes(&handle, 0.0).await, (0.0, 0.0));

    // A second layer is an engine of its own: each key shows in its engine's series, and the
    // sum over them is the process's.
    let other = holding_app(gate.clone());
    let here = tokio::spawn(app.clone().oneshot(request("here", "a")));
    let there = tokio::spawn(other.oneshot(request("there", "a")));
    count_becomes(&handle, 2.0).await;
    assert_eq!(
        exported(&handle.render(), KEYS_IN_FLIGHT_METRIC),
        vec![1.0, 1.0]
    );
    gate.add_permits(2);
    assert_eq!(here.await.unwrap().unwrap().status(), StatusCode::CREATED);
    assert_eq!(there.await.unwrap().unwrap().status(), StatusCode::CREATED);
    assert_eq!(count_becomes(&handle, 0.0).await, (0.0, 0.0));
}
