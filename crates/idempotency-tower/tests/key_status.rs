//! The key-status route (`IdempotencyLayer::key_status_service`) through axum on the memory
//! store: what a caller learns of its own keys (absent, in flight, completed, with times but
//! never the stored body), that another caller learns nothing of them, and its refusals.
#![allow(clippy::unwrap_used)]

use axum::Router;
use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use axum::routing::post;
use bytes::Bytes;
use http_body_util::BodyExt;
use idempotency_conformance::faults::{Fault, FaultyStore, StoreOp};
use idempotency_core::{IdempotencyStore, Scope};
use idempotency_memory::MemoryStore;
use idempotency_tower::IdempotencyLayer;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::sync::Notify;
use tower::ServiceExt;

const KEY: &str = "8e03978e-40d5-43e8-bc93-6894a57f9324";
const UNUSED: &str = "0b7a1c52-5d43-4c0e-9a59-f1c1d1e0aa11";
const RETENTION: Duration = Duration::from_secs(7_200);

/// `/orders` answers 201 with a secret in its body; `/slow` waits for `release`.
fn app<S: IdempotencyStore + 'static>(store: S, release: Arc<Notify>) -> Router {
    let layer = IdempotencyLayer::builder(store)
        .scope_with(|req| {
            req.headers
                .get("x-user")
                .and_then(|v| Scope::new(v.to_str().ok()?).ok())
        })
        .retention(RETENTION)
        .build()
        .unwrap();
    Router::new()
        .route(
            "/orders",
            post(|| async { (StatusCode::CREATED, "order 1, card 4242") }),
        )
        .route(
            "/slow",
            post(move || {
                let release = release.clone();
                async move {
                    release.notified().await;
                    (StatusCode::CREATED, "slow")
                }
            }),
        )
        .layer(layer.clone())
        .route_service("/idempotency-status", layer.key_status_service())
}

fn request(method: Method, uri: &str, key: Option<&str>, user: Option<&str>) -> Request<Body> {
    let mut builder = Request::builder().method(method).uri(uri);
    if let Some(key) = key {
        builder = builder.header("idempotency-key", key);
    }
    if let Some(user) = user {
        builder = builder.header("x-user", user);
    }
    builder.body(Body::empty()).unwrap()
}

async fn send(app: &Router, req: Request<Body>) -> (StatusCode, axum::http::HeaderMap, Bytes) {
    let response = app.clone().oneshot(req).await.unwrap();
    let (parts, body) = response.into_parts();
    (
        parts.status,
        parts.headers,
        body.collect().await.unwrap().to_bytes(),
    )
}

async fn status(app: &Router, key: &str, user: &str) -> (StatusCode, axum::http::HeaderMap, Bytes) {
    send(
        app,
        request(Method::GET, "/idempotency-status", Some(key), Some(user)),
    )
    .await
}

fn json(body: &Bytes) -> serde_json::Value {
    serde_json::from_slice(body).unwrap()
}

#[tokio::test]
async fn a_caller_reads_its_keys_answer_without_its_body() {
    let app = app(MemoryStore::default(), Arc::new(Notify::new()));
    let (code, headers, body) = status(&app, KEY, "alice").await;
    assert_eq!(code, StatusCode::OK);
    assert_eq!(json(&body), serde_json::json!({ "state": "absent" }));
    assert_eq!(headers.get(header::CACHE_CONTROL).unwrap(), "no-store");

    let before = SystemTime::now();
    let created = send(
        &app,
        request(Method::POST, "/orders", Some(KEY), Some("alice")),
    )
    .await;
    assert_eq!(created.0, StatusCode::CREATED);
    let (code, headers, body) = status(&app, KEY, "alice").await;
    assert_eq!(code, StatusCode::OK);
    assert_eq!(
        headers.get(header::CONTENT_TYPE).unwrap(),
        "application/json"
    );
    let answer = json(&body);
    let fields: Vec<&str> = answer
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(fields, ["answered", "expires", "state", "status"]);
    assert_eq!(answer["state"], "completed");
    assert_eq!(answer["status"], 201);
    assert!(
        !String::from_utf8_lossy(&body).contains("4242"),
        "the stored body is never told: {answer}"
    );
    let date = |field: &str| httpdate::parse_http_date(answer[field].as_str().unwrap()).unwrap();
    let second = Duration::from_secs(1);
    let answered = date("answered");
    assert!(answered + second >= before && answered <= SystemTime::now() + second);
    let expires = date("expires");
    assert!(expires + second >= before + RETENTION);
    assert!(expires <= SystemTime::now() + RETENTION + second);
}

#[tokio::test]
async fn another_caller_learns_nothing_of_a_key_it_does_not_own() {
    let release = Arc::new(Notify::new());
    let app = app(MemoryStore::default(), release.clone());
    let created = send(
        &app,
        request(Method::POST, "/orders", Some(KEY), Some("alice")),
    )
    .await;
    assert_eq!(created.0, StatusCode::CREATED);
    let never_used = status(&app, UNUSED, "bob").await;
    let alices = status(&app, KEY, "bob").await;
    assert_eq!(alices.0, never_used.0);
    assert_eq!(alices.1, never_used.1, "the same headers");
    assert_eq!(alices.2, never_used.2, "the same bytes");
    assert_eq!(json(&alices.2), serde_json::json!({ "state": "absent" }));
    // Nor of one running.
    const RUNNING: &str = "running-key-1";
    let running = tokio::spawn({
        let app = app.clone();
        async move {
            send(
                &app,
                request(Method::POST, "/slow", Some(RUNNING), Some("alice")),
            )
            .await
        }
    });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let mine = status(&app, RUNNING, "alice").await;
        if json(&mine.2)["state"] == "in_flight" {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never in flight");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let bobs = status(&app, RUNNING, "bob").await;
    assert_eq!((bobs.0, bobs.1, bobs.2), never_used);
    release.notify_one();
    assert_eq!(running.await.unwrap().0, StatusCode::CREATED);
}

#[tokio::test]
async fn a_running_key_reads_in_flight_with_when_to_ask_again() {
    let release = Arc::new(Notify::new());
    let app = app(MemoryStore::default(), release.clone());
    let running = tokio::spawn({
        let app = app.clone();
        async move {
            send(
                &app,
                request(Method::POST, "/slow", Some(KEY), Some("alice")),
            )
            .await
        }
    });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let (headers, answer) = loop {
        let (code, headers, body) = status(&app, KEY, "alice").await;
        assert_eq!(code, StatusCode::OK);
        let answer = json(&body);
        if answer["state"] == "in_flight" {
            break (headers, answer);
        }
        assert_eq!(answer["state"], "absent");
        assert!(tokio::time::Instant::now() < deadline, "never in flight");
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert_eq!(answer["retry_after_seconds"], 1);
    assert_eq!(headers.get(header::RETRY_AFTER).unwrap(), "1");
    release.notify_one();
    assert_eq!(running.await.unwrap().0, StatusCode::CREATED);
    let (_, _, body) = status(&app, KEY, "alice").await;
    assert_eq!(json(&body)["state"], "completed");
}

#[tokio::test]
async fn bad_requests_to_the_route_are_refused_as_the_layer_refuses() {
    let app = app(MemoryStore::default(), Arc::new(Notify::new()));
    let (code, headers, body) = send(
        &app,
        request(Method::GET, "/idempotency-status", None, Some("alice")),
    )
    .await;
    assert_eq!(code, StatusCode::BAD_REQUEST);
    assert_eq!(
        headers.get(header::CONTENT_TYPE).unwrap(),
        "application/problem+json"
    );
    assert_eq!(json(&body)["type"], "urn:idempotency:problem:key-missing");
    let (code, _, body) = send(
        &app,
        request(Method::GET, "/idempotency-status", Some(KEY), None),
    )
    .await;
    assert_eq!(code, StatusCode::UNAUTHORIZED);
    assert_eq!(json(&body)["type"], "urn:idempotency:problem:scope-missing");
    let (code, _, _) = send(
        &app,
        request(
            Method::GET,
            "/idempotency-status",
            Some("a key with spaces"),
            Some("alice"),
        ),
    )
    .await;
    assert_eq!(code, StatusCode::BAD_REQUEST);
    let (code, headers, _) = send(
        &app,
        request(
            Method::POST,
            "/idempotency-status",
            Some(KEY),
            Some("alice"),
        ),
    )
    .await;
    assert_eq!(code, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(headers.get(header::ALLOW).unwrap(), "GET, HEAD");
}

#[tokio::test]
async fn a_store_that_fails_is_a_503_never_absent() {
    let store = Arc::new(FaultyStore::new(MemoryStore::default()));
    store.set(StoreOp::Get, Fault::Fail);
    let app = app(Arc::clone(&store), Arc::new(Notify::new()));
    let (code, headers, body) = status(&app, KEY, "alice").await;
    assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
    assert!(headers.get(header::RETRY_AFTER).is_some());
    assert_eq!(
        json(&body)["type"],
        "urn:idempotency:problem:store-unavailable"
    );
}
