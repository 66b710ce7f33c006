//! An axum app on sqlx: the idempotency store runs on the app's own `sqlx::PgPool`, and the
//! handler writes its order in the request's `sqlx::Transaction`, so the order and the stored
//! response commit together: a crash or a store error between them cannot make the retry create
//! a second order. (The end-to-end crash test runs this very file: `tests/tests/exactly_once.rs`.)
//!
//! `DATABASE_URL=postgres://postgres@127.0.0.1/postgres cargo run -p idempotency-examples
//! --example axum_sqlx` (optional: `--listen 127.0.0.1:3003`, `--lease <seconds>`).

use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use idempotency::postgres::sqlx::{self, postgres::PgPoolOptions};
use idempotency::{IdempotencyLayer, SqlxPostgresStore, SqlxPostgresTransaction, Tx};
use serde::Deserialize;
use std::time::Duration;

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

/// Inserts the order in the request's transaction (`&mut **tx` is its `PgConnection`); the
/// layer stores this response in the same transaction and commits. There is no commit here,
/// and none is possible.
async fn create_order(
    axum::Extension(user): axum::Extension<UserId>,
    mut tx: Tx<SqlxPostgresTransaction>,
    Json(order): Json<NewOrder>,
) -> Result<impl IntoResponse, (StatusCode, String)> {
    let id: i64 =
        sqlx::query_scalar("INSERT INTO orders (user_id, item) VALUES ($1, $2) RETURNING id")
            .bind(user.0)
            .bind(&order.item)
            .fetch_one(&mut **tx)
            .await
            .map_err(|e| (StatusCode::SERVICE_UNAVAILABLE, e.to_string()))?;
    Ok((StatusCode::CREATED, format!("order {id}")))
}

/// The value after `name` on the command line.
fn arg(name: &str) -> Option<String> {
    let mut args = std::env::args().skip_while(|a| a != name);
    args.next().and(args.next())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned());
    // The app's pool; the store shares it.
    let pool = PgPoolOptions::new()
        .max_connections(16)
        .connect(&url)
        .await?;
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS orders \
         (id bigserial PRIMARY KEY, user_id uuid NOT NULL, item text NOT NULL)",
    )
    .execute(&pool)
    .await?;
    let store = SqlxPostgresStore::builder_from_sqlx_pool(pool)
        .build()
        .await?;
    store.migrate().await?; // or apply migrations/*.sql with your own tool
    let lease = arg("--lease").map_or(Ok(60), |s| s.parse())?;
    let app = Router::new()
        .route("/orders", post(create_order))
        // `route_layer`: the matched routes only, so an unknown path stays 404.
        .route_layer(
            IdempotencyLayer::builder(store)
                .scope_from_extension::<UserId>()
                .lease(Duration::from_secs(lease))
                .build()?,
        )
        .layer(middleware::from_fn(authenticate));
    let listen = arg("--listen").unwrap_or_else(|| "127.0.0.1:3003".to_owned());
    let listener = tokio::net::TcpListener::bind(listen).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app).await?;
    Ok(())
}
