//! A request that lost its lease while its handler ran (a frozen process, failing heartbeats),
//! on a store without transactions: what its client is told once another request has taken
//! the key over and completed it. Found by the model checker (`crates/idempotency-model`):
//! the stale request's own refusal reached its client while the key replayed the other's `201`.
#![allow(clippy::unwrap_used)]

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use axum::routing::post;
use axum::{Extension, Router};
use http_body_util::BodyExt;
use idempotency_conformance::faults::{Fault, FaultyStore, StoreOp};
use idempotency_core::{KeyClaim, Scope};
use idempotency_memory::MemoryStore;
use idempotency_tower::IdempotencyLayer;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::Notify;
use tower::ServiceExt;

const KEY: &str = "5c0f0e0e-8a4c-4d43-9b1f-6d2a4b1c9e11";

fn post_order() -> Request<Body> {
    Request::builder()
        .method(Method::POST)
        .uri("/orders")
        .header("idempotency-key", KEY)
        .body(Body::from("{}"))
        .unwrap()
}

async fn send(app: &Router, request: Request<Body>) -> (StatusCode, String) {
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// The first run loses its lease (every heartbeat fails), a retry takes the key over and
/// creates the order, and only then does the first run answer: out of stock, a refusal the
/// policy stores. Its client must not be told "out of stock" for a key that stands for the
/// order: it is told to retry, and the retry replays the order.
/// A memory store whose heartbeats all fail, behind a layer with a 600 ms lease, and an app
/// whose first run stalls until its lease is lost and a retry has created the order, then
/// finds the stock gone (`409 out of stock`, a refusal the policy stores). `before_refusing`
/// runs just before that refusal.
fn stalled_refusal(
    store: &FaultyStore<MemoryStore>,
    runs: &Arc<AtomicUsize>,
    before_refusing: impl Fn() + Clone + Send + Sync + 'static,
) -> Router {
    store.set(StoreOp::Extend, Fault::Fail);
    let layer = IdempotencyLayer::builder(store.clone())
        .scope_with(|_| Some(Scope::new("alice").unwrap()))
        .lease(Duration::from_millis(600))
        .store_timeout(Duration::from_millis(200))
        .build()
        .expect("valid idempotency layer settings");
    let created = Arc::new(Notify::new());
    let runs = runs.clone();
    Router::new()
        .route(
            "/orders",
            post(move |Extension(claim): Extension<KeyClaim>| {
                let (runs, created, before_refusing) =
                    (runs.clone(), created.clone(), before_refusing.clone());
                async move {
                    if runs.fetch_add(1, Ordering::SeqCst) == 0 {
                        claim.lost().await;
                        created.notified().await;
                        before_refusing();
                        (StatusCode::CONFLICT, "out of stock")
                    } else {
                        created.notify_one();
                        (StatusCode::CREATED, "order 1")
                    }
                }
            }),
        )
        .layer(layer)
}

/// Sends the first run, then retries until a retry takes the key over (once the first run's
/// lease ran out) and creates the order; returns what the first run's client was told.
async fn first_answer_after_a_takeover(app: &Router) -> (StatusCode, String) {
    let first = tokio::spawn({
        let app = app.clone();
        async move { send(&app, post_order()).await }
    });
    let mut tries = 0;
    let (status, body) = loop {
        tries += 1;
        assert!(tries <= 100, "no retry took the key over within 10 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
        let (status, body) = send(app, post_order()).await;
        if status != StatusCode::CONFLICT {
            break (status, body);
        }
    };
    assert_eq!((status, body.as_str()), (StatusCode::CREATED, "order 1"));
    first.await.unwrap()
}

fn assert_told_to_retry((status, body): (StatusCode, String)) {
    assert_ne!(
        body, "out of stock",
        "the client of the run that lost its lease was told the opposite of what the key stands for"
    );
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(body.contains("in-flight"), "a retryable answer: {body}");
}

/// The first run's store finds the key another's: its client must not be told "out of stock"
/// for a key that stands for the order; it is told to retry, and the retry replays the order.
#[tokio::test]
async fn a_request_whose_lease_was_taken_over_answers_what_the_key_stands_for() {
    let store = FaultyStore::new(MemoryStore::default());
    let runs = Arc::new(AtomicUsize::new(0));
    let app = stalled_refusal(&store, &runs, || {});
    assert_told_to_retry(first_answer_after_a_takeover(&app).await);
    let (status, body) = send(&app, post_order()).await;
    assert_eq!((status, body.as_str()), (StatusCode::CREATED, "order 1"));
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// As above, but the first run's store call fails as well, so the store never says the key
/// is another's: past its lease by the process's clock, the refusal is not deferred to the
/// background (which would tell the client "out of stock" and then find the key taken); the
/// client is told to retry.
#[tokio::test]
async fn a_store_that_fails_past_the_lease_does_not_pass_the_response_on() {
    let store = FaultyStore::new(MemoryStore::default());
    let runs = Arc::new(AtomicUsize::new(0));
    let app = stalled_refusal(&store, &runs, {
        let store = store.clone();
        move || store.set(StoreOp::Complete, Fault::Fail)
    });
    assert_told_to_retry(first_answer_after_a_takeover(&app).await);
    store.clear(StoreOp::Complete);
    let (status, body) = send(&app, post_order()).await;
    assert_eq!((status, body.as_str()), (StatusCode::CREATED, "order 1"));
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}
