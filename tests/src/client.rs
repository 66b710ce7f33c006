//! A client's side: requests as clients send them, and sending until done.

use crate::*;
use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, Method, Request, StatusCode, header};
use bytes::Bytes;
use http_body_util::BodyExt;
use std::time::Duration;
use tower::ServiceExt;

/// A request as a client sends it.
pub fn request(path: &str, key: &str, user: User, body: &str) -> Request<Body> {
    let mut request = Request::builder()
        .method(Method::POST)
        .uri(path)
        .header("idempotency-key", key)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_owned()))
        .unwrap();
    request.extensions_mut().insert(user);
    request
}

/// The demo's `POST /tasks` for `user` (a Bearer UUID) with idempotency key `key`, whose task is
/// titled with the key (so tasks can be counted per key).
pub fn create_task(user: &str, key: &str) -> Request<Body> {
    Request::builder()
        .method(Method::POST)
        .uri("/tasks")
        .header(header::AUTHORIZATION, format!("Bearer {user}"))
        .header("idempotency-key", key)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(format!(r#"{{"title":"{key}"}}"#)))
        .unwrap()
}

/// Sends a request and reads the whole response.
pub async fn send(app: &Router, request: Request<Body>) -> (StatusCode, HeaderMap, Bytes) {
    let response = app.clone().oneshot(request).await.unwrap();
    let (parts, body) = response.into_parts();
    (
        parts.status,
        parts.headers,
        body.collect().await.unwrap().to_bytes(),
    )
}

/// What a persistent client saw while sending one logical request until it succeeded.
#[derive(Debug, Default)]
pub struct Attempts {
    /// Every status received, in order.
    pub statuses: Vec<StatusCode>,
    /// Whether every 503 and 409 carried `Retry-After`.
    pub retry_after_always_present: bool,
    /// The longest single response time.
    pub slowest: Duration,
    /// The final 2xx body, if one came.
    pub body: Option<Bytes>,
}

/// Sends `make()` until a 2xx arrives or `deadline` passes, like a client that retries 503 and
/// 409 (after a short pause) and never retries once it has its answer. Each send is bounded by
/// `per_request`; a send that takes longer fails the test.
pub async fn send_until_done(
    app: &Router,
    make: impl Fn() -> Request<Body>,
    deadline: Duration,
    per_request: Duration,
) -> Attempts {
    let until = tokio::time::Instant::now() + deadline;
    let mut attempts = Attempts {
        retry_after_always_present: true,
        ..Attempts::default()
    };
    while tokio::time::Instant::now() < until {
        let started = tokio::time::Instant::now();
        let (status, headers, body) = tokio::time::timeout(per_request, send(app, make()))
            .await
            .unwrap_or_else(|_| panic!("a request hung for more than {per_request:?}"));
        attempts.slowest = attempts.slowest.max(started.elapsed());
        attempts.statuses.push(status);
        if status.is_success() {
            attempts.body = Some(body);
            break;
        }
        if matches!(
            status,
            StatusCode::SERVICE_UNAVAILABLE | StatusCode::CONFLICT
        ) {
            attempts.retry_after_always_present &= headers.contains_key(header::RETRY_AFTER);
            tokio::time::sleep(Duration::from_millis(100)).await;
        } else {
            panic!(
                "unexpected status {status}: {}",
                String::from_utf8_lossy(&body)
            );
        }
    }
    attempts
}

/// A fresh UUID v4 key.
pub fn key() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// A fresh user.
pub fn user() -> User {
    User(uuid::Uuid::new_v4())
}
