//! Request transactions admitted at once (`TransactionAdmission::Adaptive`, the default), on
//! hot rows: while the admitted transactions wait on a row another session holds, a request
//! for a new key waits for a place holding no connection and is answered `503 store-busy`
//! after the store timeout (its handler not run, its key free), a replay of a stored key is
//! answered at once (it needs no place), and once the row is free every order runs once. In
//! each claim mode.
#![allow(clippy::unwrap_used)]

use axum::Router;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::IntoResponse;
use axum::routing::post;
use hyper::StatusCode;
use idempotency::{ClaimMode, IdempotencyLayer, PostgresStore, PostgresTransaction, Tx};
use idempotency_e2e::{User, request, send};
use std::time::{Duration, Instant};

/// The store timeout: how long a request waits for a place.
const STORE_TIMEOUT: Duration = Duration::from_millis(500);
/// The store's pool: the engine admits one transaction fewer at once, and keeps that
/// connection for the lookups that answer replays.
const POOL: usize = 5;
/// What the engine admits at first: all it ever admits on this pool.
const ADMITTED_AT_FIRST: usize = POOL - 1;

#[derive(Clone)]
struct Shop {
    schema: String,
}

/// Takes one of the hot item and records the order.
async fn order(
    State(shop): State<Shop>,
    headers: HeaderMap,
    tx: Tx<PostgresTransaction>,
) -> axum::response::Response {
    let s = &shop.schema;
    let key = headers["idempotency-key"].to_str().unwrap().to_owned();
    let taken = tx
        .execute(
            &format!("UPDATE \"{s}\".stock SET qty = qty - 1 WHERE item = 'hot'"),
            &[],
        )
        .await;
    let inserted = tx
        .execute(
            &format!("INSERT INTO \"{s}\".orders (key) VALUES ($1)"),
            &[&key],
        )
        .await;
    match (taken, inserted) {
        (Ok(1), Ok(1)) => (StatusCode::CREATED, "created").into_response(),
        _ => (StatusCode::SERVICE_UNAVAILABLE, "db error").into_response(),
    }
}

async fn hot_rows_wait_for_a_place(mode: ClaimMode) {
    let schema = idempotency_testkit::TestSchema::new("idem_admission");
    let store = PostgresStore::builder(schema.url())
        .schema(schema.name())
        .pool_size(POOL)
        .build()
        .await
        .unwrap_or_else(|e| {
            panic!(
                "PostgreSQL at {}: {e} (scripts/services.sh starts it)",
                schema.url()
            )
        });
    store.migrate().await.unwrap();
    let s = schema.name().to_owned();
    let admin = idempotency_e2e::connect_postgres(schema.url()).await;
    admin
        .batch_execute(&format!(
            "CREATE TABLE \"{s}\".stock (item text PRIMARY KEY, qty int NOT NULL); \
             INSERT INTO \"{s}\".stock VALUES ('hot', 1000); \
             CREATE TABLE \"{s}\".orders (key text NOT NULL)"
        ))
        .await
        .unwrap();
    let layer = IdempotencyLayer::builder(store)
        .scope_from_extension::<User>()
        .claim_mode(mode)
        .store_timeout(STORE_TIMEOUT)
        .build()
        .expect("valid idempotency layer settings");
    let app = Router::new()
        .route("/orders", post(order))
        .route_layer(layer)
        .with_state(Shop { schema: s.clone() });
    let user = idempotency_e2e::user();

    // A key answered before the row is locked: its replay needs no place later.
    let stored = idempotency_e2e::key();
    let (status, _, _) = send(&app, request("/orders", &stored, user, "{}")).await;
    assert_eq!(status, StatusCode::CREATED, "{mode:?}");

    // Another session holds the hot row; the admitted requests wait on it.
    let mut holder = idempotency_e2e::connect_postgres(schema.url()).await;
    let lock = holder.transaction().await.unwrap();
    lock.batch_execute(&format!(
        "SELECT * FROM \"{s}\".stock WHERE item = 'hot' FOR UPDATE"
    ))
    .await
    .unwrap();
    let waiting: Vec<String> = (0..ADMITTED_AT_FIRST)
        .map(|_| idempotency_e2e::key())
        .collect();
    let mut admitted = tokio::task::JoinSet::new();
    for key in &waiting {
        let (app, key) = (app.clone(), key.clone());
        admitted.spawn(async move { send(&app, request("/orders", &key, user, "{}")).await.0 });
    }
    // Until every admitted request waits on the row.
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let row = admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
                 AND query LIKE '%' || $1 || '%'",
                &[&format!("\"{s}\".stock SET qty")],
            )
            .await
            .unwrap();
        if row.get::<_, i64>(0) >= ADMITTED_AT_FIRST as i64 {
            break;
        }
        assert!(
            Instant::now() < until,
            "{mode:?}: the admitted requests never waited on the row"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // One more new key: no place, answered store-busy after the store timeout.
    let late = idempotency_e2e::key();
    let sent = Instant::now();
    let (status, headers, body) = send(&app, request("/orders", &late, user, "{}")).await;
    let took = sent.elapsed();
    assert_eq!(
        status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{mode:?}: {}",
        String::from_utf8_lossy(&body)
    );
    assert_eq!(
        headers.get("idempotency-refusal").unwrap(),
        "store-busy",
        "{mode:?}"
    );
    assert!(headers.contains_key("retry-after"), "{mode:?}");
    assert!(
        took >= STORE_TIMEOUT && took < STORE_TIMEOUT + Duration::from_secs(3),
        "{mode:?}: store-busy after {took:?}"
    );

    // A replay is answered while the row is still held.
    let (status, headers, body) = send(&app, request("/orders", &stored, user, "{}")).await;
    assert_eq!(status, StatusCode::CREATED, "{mode:?}");
    assert_eq!(&body[..], b"created");
    assert!(headers.contains_key("idempotent-replayed"), "{mode:?}");
    assert_eq!(
        admitted.len(),
        ADMITTED_AT_FIRST,
        "{mode:?}: an admitted request ended while the row was held"
    );

    // The row freed: the admitted orders run, and the refused key runs when sent again.
    lock.rollback().await.unwrap();
    while let Some(status) = admitted.join_next().await {
        assert_eq!(status.unwrap(), StatusCode::CREATED, "{mode:?}");
    }
    let (status, _, _) = send(&app, request("/orders", &late, user, "{}")).await;
    assert_eq!(status, StatusCode::CREATED, "{mode:?}");
    let orders: i64 = admin
        .query_one(&format!("SELECT count(*) FROM \"{s}\".orders"), &[])
        .await
        .unwrap()
        .get(0);
    let distinct: i64 = admin
        .query_one(
            &format!("SELECT count(DISTINCT key) FROM \"{s}\".orders"),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        (orders, distinct),
        (ADMITTED_AT_FIRST as i64 + 2, ADMITTED_AT_FIRST as i64 + 2),
        "{mode:?}: each order once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn in_the_lease_mode_a_request_past_the_admitted_ones_is_store_busy_and_a_replay_is_not() {
    hot_rows_wait_for_a_place(ClaimMode::Lease).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn in_the_one_transaction_mode_a_request_past_the_admitted_ones_is_store_busy_and_a_replay_is_not()
 {
    hot_rows_wait_for_a_place(ClaimMode::OneTransaction).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn in_the_speculative_mode_a_request_past_the_admitted_ones_is_store_busy_and_a_replay_is_not()
 {
    hot_rows_wait_for_a_place(ClaimMode::OneTransactionSpeculative).await;
}
