//! An axum app on the in-process memory store: `cargo run -p idempotency-examples --example
//! axum_memory`, then
//!
//! ```text
//! curl -i localhost:3001/orders -H 'x-user: alice' -H 'idempotency-key: 8e03978e-40d5-43e8-bc93-6894a57f9324' -d '{"item":"tea"}'
//! ```
//! twice: the second answer is the first, replayed (`idempotent-replayed: true`).

use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Extension, Router};
use idempotency::{IdempotencyLayer, MemoryStore, Scope};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// The caller, as an authentication layer would put it in the request.
#[derive(Clone)]
struct User(String);

/// A user name is a valid scope unless it has control characters or is too long: the
/// conversion can fail, so it is `TryFrom`, and the layer answers such a request with 401
/// `scope-invalid`. Never fall back to `Scope::unscoped()` here: that would put every such user
/// in one shared key space, where one user is replayed another's responses.
impl TryFrom<User> for Scope {
    type Error = idempotency::ScopeError;
    fn try_from(user: User) -> Result<Scope, Self::Error> {
        Scope::new(user.0)
    }
}

/// A stand-in for real authentication: the `x-user` header names the caller.
async fn authenticate(mut request: Request, next: Next) -> Response {
    let user = request
        .headers()
        .get("x-user")
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_graphic()))
        .map(str::to_owned);
    match user {
        Some(user) => {
            request.extensions_mut().insert(User(user));
            next.run(request).await
        }
        None => (StatusCode::UNAUTHORIZED, "send x-user").into_response(),
    }
}

async fn create_order(
    Extension(orders): Extension<Arc<AtomicU64>>,
    body: String,
) -> impl IntoResponse {
    let n = orders.fetch_add(1, Ordering::SeqCst) + 1;
    (StatusCode::CREATED, format!("order {n}: {body}"))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let idempotency = IdempotencyLayer::builder(MemoryStore::default())
        .scope_from_extension::<User>()
        .build()?;
    let app = Router::new()
        .route("/orders", post(create_order))
        // `route_layer`: the matched routes only, so an unknown path stays 404.
        .route_layer(idempotency)
        .layer(middleware::from_fn(authenticate))
        .layer(Extension(Arc::new(AtomicU64::new(0))));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3001").await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app).await?;
    Ok(())
}
