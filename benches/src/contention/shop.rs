//! The orders service of the contention workload, written as `docs/handlers.md` says: the
//! handler takes each line's stock in the order the client gave (so two orders may lock the same
//! hot rows in opposite orders), retries a deadlocked or timed-out statement from a savepoint,
//! stores "out of stock" with `discard_writes` and a `409`, and answers `503` for the rest of the
//! database's errors. It runs as a child process of the bench (`serve-shop`), so a run can
//! SIGKILL it and start it again.

use crate::err;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use idempotency::postgres::tokio_postgres;
use idempotency::postgres::tokio_postgres::error::SqlState;
use idempotency::{
    ClaimMode, IdempotencyLayer, PostgresStore, PostgresTransaction, Scope, TransactionAdmission,
    Tx,
};
use std::net::SocketAddr;
use std::time::Duration;

/// An order as the client sends it: `(item, quantity)` lines, in the client's order, and the
/// client's reference (its idempotency key, so the check can tie each order to its key).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct NewOrder {
    /// The client's reference of the order.
    pub reference: String,
    /// `(item, quantity)`, locked in this order.
    pub lines: Vec<(i32, i32)>,
}

/// How a shop process is set up.
#[derive(Clone, Debug)]
pub struct ShopSettings {
    /// The database.
    pub url: String,
    /// The schema of the shop's tables and of the key table.
    pub schema: String,
    /// The claim mode.
    pub mode: ClaimMode,
    /// The store's pool (the handler's transactions run on it in every mode); 0: the store's
    /// default.
    pub pool: usize,
    /// The lease (`None`: the default).
    pub lease: Option<Duration>,
    /// The store timeout (`None`: the default).
    pub store_timeout: Option<Duration>,
    /// How many request transactions run at once (default: adaptive).
    pub admission: TransactionAdmission,
    /// A seeded bug, for the test that shows the checks fail: the handler stores its refusal
    /// without `discard_writes`, so the stock lines it took before the missing one commit
    /// with the `409`.
    pub keep_refused_writes: bool,
}

#[derive(Clone)]
struct Shop {
    schema: String,
    keep_refused_writes: bool,
}

/// What the handler's own database errors become: `503`, not stored, the key released.
fn try_again() -> Response {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        [("retry-after", "1")],
        "try again",
    )
        .into_response()
}

/// Takes each line's stock in the order given. The lines' writes are retried together from a
/// savepoint taken before the first of them when the database broke a deadlock or a lock wait:
/// rolling back to it releases the row locks taken since, so the cycle is broken (a savepoint
/// just before the failed statement would keep the locks that formed it). `Ok(Some(item))`: not
/// enough of `item`.
async fn take_stock(
    tx: &Tx<PostgresTransaction>,
    schema: &str,
    lines: &[(i32, i32)],
) -> Result<Option<i32>, tokio_postgres::Error> {
    let sql = format!("UPDATE \"{schema}\".stock SET qty = qty - $2 WHERE item = $1 AND qty >= $2");
    let mut attempt = 1;
    loop {
        tx.batch_execute("SAVEPOINT take_stock").await?;
        let taken = async {
            for &(item, qty) in lines {
                if tx.execute(&sql, &[&item, &qty]).await? == 0 {
                    return Ok(Some(item));
                }
            }
            Ok::<_, tokio_postgres::Error>(None)
        }
        .await;
        match taken {
            Ok(out_of) => {
                tx.batch_execute("RELEASE SAVEPOINT take_stock").await?;
                return Ok(out_of);
            }
            Err(error)
                if attempt < 4
                    && matches!(
                        error.code(),
                        Some(&SqlState::T_R_DEADLOCK_DETECTED | &SqlState::LOCK_NOT_AVAILABLE)
                    ) =>
            {
                tx.batch_execute("ROLLBACK TO SAVEPOINT take_stock").await?;
                // Not at once: the transactions of the cycle would meet again.
                let pause = rand::random_range(0..10u64 << attempt);
                tokio::time::sleep(Duration::from_millis(pause)).await;
                attempt += 1;
            }
            Err(error) => return Err(error),
        }
    }
}

async fn create_order(
    State(shop): State<Shop>,
    tx: Tx<PostgresTransaction>,
    Json(order): Json<NewOrder>,
) -> Response {
    let s = &shop.schema;
    match take_stock(&tx, s, &order.lines).await {
        Ok(None) => {}
        Ok(Some(item)) => {
            // Out of stock: the lines taken so far roll back; this answer is stored.
            if !shop.keep_refused_writes {
                tx.discard_writes();
            }
            return (
                StatusCode::CONFLICT,
                Json(serde_json::json!({ "error": "out_of_stock", "item": item })),
            )
                .into_response();
        }
        Err(_) => return try_again(),
    }
    let items: Vec<i32> = order.lines.iter().map(|line| line.0).collect();
    let qtys: Vec<i32> = order.lines.iter().map(|line| line.1).collect();
    let insert = format!(
        "INSERT INTO \"{s}\".orders (reference, items, qtys) VALUES ($1, $2, $3) RETURNING id"
    );
    match tx
        .query_one(&insert, &[&order.reference, &items, &qtys])
        .await
    {
        Ok(row) => {
            let id: i64 = row.get(0);
            (
                StatusCode::CREATED,
                Json(serde_json::json!({ "id": id, "lines": order.lines })),
            )
                .into_response()
        }
        Err(_) => try_again(),
    }
}

fn user_scope(parts: &axum::http::request::Parts) -> Option<Scope> {
    parts
        .headers
        .get("x-user")
        .and_then(|v| v.to_str().ok())
        .and_then(|u| Scope::new(u).ok())
}

/// The shop's router on its own store.
pub async fn app(settings: &ShopSettings) -> Result<Router, String> {
    let mut builder = PostgresStore::builder(&settings.url).schema(&settings.schema);
    if settings.pool > 0 {
        builder = builder.pool_size(settings.pool);
    }
    let store = builder.build().await.map_err(err)?;
    store.migrate().await.map_err(err)?;
    let mut layer = IdempotencyLayer::builder(store)
        .scope_with(user_scope)
        .claim_mode(settings.mode)
        .transaction_admission(settings.admission);
    if let Some(lease) = settings.lease {
        layer = layer.lease(lease);
    }
    if let Some(timeout) = settings.store_timeout {
        layer = layer.store_timeout(timeout);
    }
    Ok(Router::new()
        .route(
            "/orders",
            post(create_order).layer(layer.build().map_err(err)?),
        )
        .with_state(Shop {
            schema: settings.schema.clone(),
            keep_refused_writes: settings.keep_refused_writes,
        }))
}

/// Serves the shop on `listen` and prints `listening on <addr>` once bound.
pub async fn serve(listen: SocketAddr, settings: ShopSettings) -> Result<(), String> {
    let app = app(&settings).await?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| e.to_string())?;
    println!(
        "listening on {}",
        listener.local_addr().map_err(|e| e.to_string())?
    );
    axum::serve(listener, app).await.map_err(|e| e.to_string())
}
