//! Through HTTP: a one-transaction request whose key another request completes while its
//! transaction is open. The unique index refuses its record at commit, its writes roll back, and
//! its client gets what the other request stored (a replay, or 422 for another request): what
//! the client sees and how many side effects stand.
//!
//! The other request runs in the lease mode on the same table (a deployment moving between
//! modes, or a route of each kind), which does not take the one-transaction mode's lock.
#![allow(clippy::unwrap_used)]

use axum::Router;
use axum::extract::State;
use axum::routing::post;
use hyper::StatusCode;
use idempotency::{ClaimMode, IdempotencyLayer, PostgresStore, PostgresTransaction, Tx};
use idempotency_e2e::{User, migrated_postgres_store_with_side_effects, request, send};
use std::sync::Arc;
use tokio::sync::Semaphore;

/// What the handler shares: the side-effect table, and a gate a handler may be held at after
/// its write.
#[derive(Clone)]
struct Handler {
    /// Which app answered, in the response body.
    name: &'static str,
    side_effects: String,
    gate: Arc<Semaphore>,
}

/// Writes one side effect in the request's transaction; a request with an `x-hold` header (not
/// part of the fingerprint) then waits at the gate before answering.
async fn create(
    State(handler): State<Handler>,
    headers: axum::http::HeaderMap,
    tx: Tx<PostgresTransaction>,
    body: String,
) -> (StatusCode, String) {
    let sql = format!("INSERT INTO {} (body) VALUES ($1)", handler.side_effects);
    tx.execute(&sql, &[&body]).await.unwrap();
    drop(tx);
    if headers.contains_key("x-hold") {
        let _permit = handler.gate.acquire().await.unwrap();
    }
    (StatusCode::CREATED, format!("created by {}", handler.name))
}

fn app(store: PostgresStore, mode: ClaimMode, handler: Handler) -> Router {
    let layer = IdempotencyLayer::builder(store)
        .scope_from_extension::<User>()
        .claim_mode(mode)
        .build()
        .expect("valid idempotency layer settings");
    Router::new()
        .route("/tasks", post(create))
        .layer(layer)
        .with_state(handler)
}

async fn side_effects(store: &PostgresStore, table: &str) -> i64 {
    let client = store.pool().get().await.unwrap();
    client
        .query_one(&format!("SELECT count(*) FROM {table}"), &[])
        .await
        .unwrap()
        .get(0)
}

/// Runs the race with the lease-mode request's `body` (the same as the held request's, or
/// another); returns what the held one-transaction request's client saw and the side effects.
async fn race(other_body: &str) -> (StatusCode, bool, String, i64) {
    let (store, schema, table) = migrated_postgres_store_with_side_effects("idem_superseded").await;
    let gate = Arc::new(Semaphore::new(0));
    let handler = |name| Handler {
        name,
        side_effects: table.clone(),
        gate: Arc::clone(&gate),
    };
    let one_tx = app(store.clone(), ClaimMode::OneTransaction, handler("one-tx"));
    let lease = app(store.clone(), ClaimMode::Lease, handler("lease"));
    let (key, user) = (idempotency_e2e::key(), idempotency_e2e::user());

    // The one-transaction request writes, then waits with its transaction open.
    let held = tokio::spawn({
        let (one_tx, key) = (one_tx.clone(), key.clone());
        async move {
            let mut held = request("/tasks", &key, user, "same");
            held.headers_mut()
                .insert("x-hold", axum::http::HeaderValue::from_static("1"));
            send(&one_tx, held).await
        }
    });
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    // The same key completes in the lease mode meanwhile.
    let (status, _, body) = send(&lease, request("/tasks", &key, user, other_body)).await;
    assert_eq!(
        status,
        StatusCode::CREATED,
        "{}",
        String::from_utf8_lossy(&body)
    );
    gate.add_permits(1);
    let (status, headers, body) = held.await.unwrap();
    let replayed = headers.get("idempotent-replayed").is_some();
    let count = side_effects(&store, &table).await;
    drop((one_tx, lease, store));
    idempotency_testkit::drop_test_schema(schema.name()).await;
    (
        status,
        replayed,
        String::from_utf8_lossy(&body).into_owned(),
        count,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_superseded_request_rolls_back_and_replays_the_stored_response() {
    let (status, replayed, body, count) = race("same").await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert!(
        replayed,
        "the client gets the stored response, marked as a replay"
    );
    assert_eq!(body, "created by lease", "the stored response, not its own");
    assert_eq!(
        count, 1,
        "only the request that stored its record kept its write"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_superseded_request_with_another_body_is_a_mismatch() {
    let (status, replayed, body, count) = race("other").await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(!replayed);
    assert_eq!(
        count, 1,
        "only the request that stored its record kept its write"
    );
}
