//! Routes with their own fingerprint, key source and replay policy on one engine: variants of a
//! layer (`fingerprint_with`, `key_with`, `replay_policy`) share its engine, store and
//! drain. Before issue 27 item 7 a route with another fingerprint needed a second layer, with a
//! second engine and a second drain to await at shutdown.
#![allow(clippy::unwrap_used)]

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::routing::post;
use http_body_util::BodyExt;
use idempotency_core::{
    FingerprintSpec, IdempotencyKey, IdempotencyStore, KeyFormat, ReplayPolicy, Scope,
};
use idempotency_memory::MemoryStore;
use idempotency_tower::IdempotencyLayer;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tower::ServiceExt;

/// A handler that counts its runs and answers `status` with the run's number.
fn counting(
    runs: &Arc<AtomicUsize>,
    status: StatusCode,
    delay: Duration,
) -> axum::routing::MethodRouter {
    let runs = Arc::clone(runs);
    post(move || {
        let runs = Arc::clone(&runs);
        async move {
            tokio::time::sleep(delay).await;
            let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
            (status, format!("run {n}"))
        }
    })
}

async fn send(app: &Router, path: &str, key: Option<&str>, body: &str) -> (StatusCode, String) {
    let mut request = Request::post(path).header("content-type", "application/json");
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    let response = app
        .clone()
        .oneshot(request.body(Body::from(body.to_owned())).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

#[tokio::test]
async fn each_route_has_its_own_fingerprint_key_source_and_policy_on_one_engine() {
    let runs = Arc::new(AtomicUsize::new(0));
    let layer = IdempotencyLayer::builder(MemoryStore::default())
        .unscoped()
        .build()
        .expect("valid idempotency layer settings");
    let charges = layer.fingerprint_with(FingerprintSpec::new().ignore_json("/sent_at").unwrap());
    let by_query = layer.key_with(|parts| {
        parts
            .uri
            .query()?
            .strip_prefix("request_id=")
            .map(str::to_owned)
    });
    let keep_errors = layer.replay_policy(ReplayPolicy::all_final());
    let app = Router::new()
        .route(
            "/tasks",
            counting(&runs, StatusCode::CREATED, Duration::ZERO).route_layer(layer.clone()),
        )
        .route(
            "/charges",
            counting(&runs, StatusCode::CREATED, Duration::ZERO).route_layer(charges),
        )
        .route(
            "/orders",
            counting(&runs, StatusCode::CREATED, Duration::ZERO).route_layer(by_query),
        )
        .route(
            "/fails",
            counting(&runs, StatusCode::INTERNAL_SERVER_ERROR, Duration::ZERO)
                .route_layer(keep_errors),
        )
        .route(
            "/fails-default",
            counting(&runs, StatusCode::INTERNAL_SERVER_ERROR, Duration::ZERO)
                .route_layer(layer.clone()),
        );

    // The charge's retry differs in `sent_at` only, which its route ignores: a replay.
    let first = send(&app, "/charges", Some("c"), r#"{"amount":5,"sent_at":1}"#).await;
    let retry = send(&app, "/charges", Some("c"), r#"{"amount":5,"sent_at":2}"#).await;
    assert_eq!(first, (StatusCode::CREATED, "run 1".to_owned()));
    assert_eq!(retry, first, "the charge's retry replays");
    // The same difference on the default route is another request: 422.
    send(&app, "/tasks", Some("t"), r#"{"title":"a","sent_at":1}"#).await;
    let (status, _) = send(&app, "/tasks", Some("t"), r#"{"title":"a","sent_at":2}"#).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);

    // The orders route reads its key from the query.
    let first = send(&app, "/orders?request_id=o-1", None, "{}").await;
    let retry = send(&app, "/orders?request_id=o-1", None, "{}").await;
    assert_eq!(first.0, StatusCode::CREATED);
    assert_eq!(retry, first);

    // A 500 is kept on the route whose policy stores every final status, not on the other.
    let first = send(&app, "/fails", Some("f"), "{}").await;
    assert_eq!(send(&app, "/fails", Some("f"), "{}").await, first);
    let a = send(&app, "/fails-default", Some("g"), "{}").await;
    let b = send(&app, "/fails-default", Some("g"), "{}").await;
    assert_ne!(a, b, "the default policy releases a 500: the retry runs");

    // One engine: the charge's key, stored through the variant, is in the base layer's store.
    let key = IdempotencyKey::parse(b"c", KeyFormat::opaque()).unwrap();
    let record = layer.engine().store().get(&Scope::unscoped(), &key).await;
    assert!(record.unwrap().is_some());
}

#[tokio::test]
async fn one_drain_awaits_the_requests_of_every_variant() {
    let runs = Arc::new(AtomicUsize::new(0));
    let layer = IdempotencyLayer::builder(MemoryStore::default())
        .unscoped()
        .build()
        .expect("valid idempotency layer settings");
    let variant = layer.fingerprint_with(FingerprintSpec::new().ignore_json("/x").unwrap());
    let app = Router::new().route(
        "/slow",
        counting(&runs, StatusCode::CREATED, Duration::from_millis(300)).route_layer(variant),
    );
    let running = tokio::spawn({
        let app = app.clone();
        async move { send(&app, "/slow", Some("s"), "{}").await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let drain = layer.drain();
    tokio::time::timeout(Duration::from_secs(5), drain.drained())
        .await
        .expect("drained");
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the base layer's drain waited for the variant's request"
    );
    assert_eq!(running.await.unwrap().0, StatusCode::CREATED);
}
