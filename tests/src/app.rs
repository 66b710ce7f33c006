//! The counting app: handlers that count their side effects, behind the layer.

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderValue, StatusCode, header};
use axum::routing::post;
use bytes::Bytes;
use idempotency::{IdempotencyLayer, IdempotencyLayerBuilder, IdempotencyStore, ScopeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// How many times each handler's side effect ran.
#[derive(Clone, Debug, Default)]
pub struct Runs {
    /// POST /orders
    pub orders: Arc<AtomicUsize>,
    /// POST /flaky (503 on its first run)
    pub flaky: Arc<AtomicUsize>,
    /// POST /panics (panics on its first run)
    pub panics: Arc<AtomicUsize>,
    /// POST /slow (takes 300 ms)
    pub slow: Arc<AtomicUsize>,
    /// POST /slow-first (its first run takes 2 s, later runs are fast)
    pub slow_first: Arc<AtomicUsize>,
}

/// The user id the test puts where an authentication layer would.
#[derive(Clone, Copy, Debug)]
pub struct User(pub uuid::Uuid);

impl From<User> for idempotency::Scope {
    fn from(user: User) -> Self {
        idempotency::Scope::from(user.0)
    }
}

/// The layer builder, scope chosen, for [`counting_app_with`].
pub type Builder = IdempotencyLayerBuilder<Arc<dyn IdempotencyStore>, ScopeSet>;

/// An app whose handlers count their side effects in `runs`, with the layer's defaults.
pub fn counting_app(store: Arc<dyn IdempotencyStore>, runs: &Runs) -> Router {
    counting_app_with(store, runs, |b| b)
}

/// An app whose handlers count their side effects in `runs`, with the layer configured by
/// `configure`.
pub fn counting_app_with(
    store: Arc<dyn IdempotencyStore>,
    runs: &Runs,
    configure: impl FnOnce(Builder) -> Builder,
) -> Router {
    let layer = configure(IdempotencyLayer::builder(store).scope_from_extension::<User>())
        .build()
        .expect("valid idempotency layer settings");
    let orders = runs.orders.clone();
    let flaky = runs.flaky.clone();
    let panics = runs.panics.clone();
    let slow = runs.slow.clone();
    let slow_first = runs.slow_first.clone();
    Router::new()
        .route(
            "/slow-first",
            post(move || {
                let slow_first = slow_first.clone();
                async move {
                    let n = slow_first.fetch_add(1, Ordering::SeqCst) + 1;
                    if n == 1 {
                        tokio::time::sleep(Duration::from_millis(2000)).await;
                    }
                    (StatusCode::CREATED, format!("run {n}"))
                }
            }),
        )
        .route(
            "/orders",
            post(move |body: Bytes| {
                let orders = orders.clone();
                async move {
                    // Widen the window in which duplicates arrive while the first one runs.
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    let n = orders.fetch_add(1, Ordering::SeqCst) + 1;
                    let mut response = axum::response::Response::new(Body::from(format!(
                        "{{\"order\":{n},\"request\":{}}}",
                        String::from_utf8_lossy(&body)
                    )));
                    *response.status_mut() = StatusCode::CREATED;
                    let headers = response.headers_mut();
                    headers.insert(
                        header::CONTENT_TYPE,
                        HeaderValue::from_static("application/json"),
                    );
                    headers.insert(
                        header::LOCATION,
                        HeaderValue::from_str(&format!("/orders/{n}")).unwrap(),
                    );
                    response
                }
            }),
        )
        .route(
            "/flaky",
            post(move || {
                let flaky = flaky.clone();
                async move {
                    if flaky.fetch_add(1, Ordering::SeqCst) == 0 {
                        (StatusCode::SERVICE_UNAVAILABLE, "down")
                    } else {
                        (StatusCode::CREATED, "up")
                    }
                }
            }),
        )
        .route(
            "/panics",
            post(move || {
                let panics = panics.clone();
                async move {
                    if panics.fetch_add(1, Ordering::SeqCst) == 0 {
                        panic!("the first run panics");
                    }
                    (StatusCode::CREATED, "second run")
                }
            }),
        )
        .route(
            "/slow",
            post(move || {
                let slow = slow.clone();
                async move {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    slow.fetch_add(1, Ordering::SeqCst);
                    (StatusCode::CREATED, "slow done")
                }
            }),
        )
        .layer(layer)
}
