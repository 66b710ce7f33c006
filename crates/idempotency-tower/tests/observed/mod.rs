//! The app the observability tests (`spans.rs`, `metrics.rs`) watch: one route with a
//! parameter, `/x/{id}`, behind the layer on the memory store, its scope from a `User`
//! extension. Each of those tests is its own binary (tracing and metrics keep process-wide
//! state), so they share this module instead of a test file.
#![allow(clippy::unwrap_used, dead_code)]

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::routing::post;
use idempotency_core::Scope;
use idempotency_memory::MemoryStore;
use idempotency_tower::IdempotencyLayer;

/// The key every request sends.
pub(crate) const KEY: &str = "8e03978e-40d5-43e8-bc93-6894a57f9324";

/// The authenticated user, as an extension.
#[derive(Clone, Debug)]
pub(crate) struct User;

impl From<User> for Scope {
    fn from(_: User) -> Scope {
        Scope::new("alice").unwrap()
    }
}

/// A POST to `/x/42` with `body`, authenticated when `user`.
pub(crate) fn request(body: &'static str, user: bool) -> Request<Body> {
    let mut r = Request::post("/x/42")
        .header("idempotency-key", KEY)
        .body(Body::from(body))
        .unwrap();
    if user {
        r.extensions_mut().insert(User);
    }
    r
}

/// The watched app.
pub(crate) fn app() -> Router {
    Router::new()
        .route("/x/{id}", post(|| async { (StatusCode::CREATED, "made") }))
        .layer(
            IdempotencyLayer::builder(MemoryStore::default())
                .scope_from_extension::<User>()
                .build()
                .expect("valid idempotency layer settings"),
        )
}
