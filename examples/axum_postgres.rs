//! An axum app on PostgreSQL whose handler writes in the request's idempotency transaction, so
//! the order and the stored response commit together: a crash or a store error between them
//! cannot make the retry create a second order.
//!
//! `DATABASE_URL=postgres://postgres@127.0.0.1/postgres cargo run -p idempotency-examples
//! --example axum_postgres` (add `?sslmode=verify-full&sslrootcert=/path/ca.pem` for TLS with
//! the `postgres-tls` feature, `?prepared_statements=false` behind PgBouncer in transaction mode).

use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use idempotency::postgres::tokio_postgres::types::Type;
use idempotency::{IdempotencyLayer, PostgresStore, PostgresTransaction, Tx};
use serde::Deserialize;

/// The caller's id, as an authentication layer would put it in the request.
#[derive(Clone, Copy)]
struct UserId(uuid::Uuid);

impl From<UserId> for idempotency::Scope {
    fn from(user: UserId) -> Self {
        idempotency::Scope::from(user.0)
    }
}

/// A stand-in for real authentication: `Authorization: Bearer <user uuid>`.
async fn authenticate(mut request: Request, next: Next) -> Response {
    let user = request
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .and_then(|v| uuid::Uuid::parse_str(v).ok());
    match user {
        Some(user) => {
            request.extensions_mut().insert(UserId(user));
            next.run(request).await
        }
        None => (
            StatusCode::UNAUTHORIZED,
            "send Authorization: Bearer <uuid>",
        )
            .into_response(),
    }
}

#[derive(Deserialize)]
struct NewOrder {
    item: String,
}

/// Inserts the order in the request's transaction; the layer stores this response in the same
/// transaction and commits. There is no commit here, and none is possible.
async fn create_order(
    axum::Extension(user): axum::Extension<UserId>,
    tx: Tx<PostgresTransaction>,
    Json(order): Json<NewOrder>,
) -> Result<impl IntoResponse, (StatusCode, String)> {
    let row = tx
        .query_typed_one(
            "INSERT INTO orders (user_id, item) VALUES ($1, $2) RETURNING id",
            &[(&user.0, Type::UUID), (&order.item, Type::TEXT)],
        )
        .await
        .map_err(|e| (StatusCode::SERVICE_UNAVAILABLE, e.to_string()))?;
    let id: i64 = row.get(0);
    Ok((StatusCode::CREATED, format!("order {id}")))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned());
    let store = PostgresStore::connect(&url).await?;
    store.migrate().await?; // or apply migrations/*.sql with your own tool
    store
        .pool()
        .get()
        .await?
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS orders (id bigserial PRIMARY KEY, user_id uuid NOT NULL, item text NOT NULL)",
        )
        .await?;
    let app = Router::new()
        .route("/orders", post(create_order))
        // `route_layer`: the matched routes only, so an unknown path stays 404.
        .route_layer(
            IdempotencyLayer::builder(store)
                .scope_from_extension::<UserId>()
                .build()?,
        )
        .layer(middleware::from_fn(authenticate));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3002").await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app).await?;
    Ok(())
}
