//! A database that does not answer (issue 46 item 2): frozen (`SIGSTOP`, a paused VM), or its
//! key table locked (`LOCK TABLE .. ACCESS EXCLUSIVE`, as `VACUUM FULL` or an `ALTER` takes).
//! Every covered request that arrives meanwhile is answered within `store_timeout` plus a
//! second, in every claim mode: before, the speculative mode's requests hung for the whole
//! fault (up to 60 s here), their lookup riding the handler's first statement, which nothing
//! bounded. What the client sees, and that each key's task is created once when its client
//! retries after the fault.
#![allow(clippy::unwrap_used)]

use axum::Router;
use axum::extract::State;
use axum::routing::post;
use hyper::StatusCode;
use idempotency::{ClaimMode, IdempotencyLayer, PostgresStore, PostgresTransaction, Tx};
use idempotency_e2e::{User, request, send};
use idempotency_testkit::TempPostgres;
use std::time::{Duration, Instant};

const STORE_TIMEOUT: Duration = Duration::from_secs(1);
/// Requests sent during the fault, at once.
const REQUESTS: usize = 4;

#[derive(Clone, Copy, Debug)]
enum Fault {
    Frozen,
    KeyTableLocked,
}

async fn create(State(()): State<()>, tx: Tx<PostgresTransaction>) -> StatusCode {
    match tx
        .execute("INSERT INTO side_effects (body) VALUES ('x')", &[])
        .await
    {
        Ok(_) => StatusCode::CREATED,
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

fn app(store: PostgresStore, mode: ClaimMode) -> Router {
    let layer = IdempotencyLayer::builder(store)
        .scope_from_extension::<User>()
        .claim_mode(mode)
        .store_timeout(STORE_TIMEOUT)
        .build()
        .expect("valid idempotency layer settings");
    Router::new()
        .route("/tasks", post(create))
        .route_layer(layer)
        .with_state(())
}

/// The slowest answer of the requests sent during `fault` in `mode`, and their statuses.
async fn answers_during(fault: Fault, mode: ClaimMode) -> (Duration, Vec<StatusCode>) {
    let pg = TempPostgres::start(&[])
        .unwrap_or_else(|e| panic!("could not start a throwaway PostgreSQL: {e}"));
    let url = pg.url("postgres");
    let store = PostgresStore::builder(&url)
        .pool_size(8)
        .connect_timeout(Duration::from_secs(2))
        .build()
        .await
        .unwrap();
    store.migrate().await.unwrap();
    let admin = idempotency_e2e::connect_postgres(&url).await;
    admin
        .batch_execute("CREATE TABLE side_effects (body text NOT NULL)")
        .await
        .unwrap();
    let app = app(store.clone(), mode);
    let user = idempotency_e2e::user();
    // Warm: the statements are prepared on a pooled connection.
    let (status, _, _) = send(&app, request("/tasks", &idempotency_e2e::key(), user, "{}")).await;
    assert_eq!(status, StatusCode::CREATED);

    match fault {
        Fault::Frozen => pg.freeze().unwrap(),
        Fault::KeyTableLocked => admin
            .batch_execute("BEGIN; LOCK TABLE idempotency_keys IN ACCESS EXCLUSIVE MODE")
            .await
            .unwrap(),
    }
    let keys: Vec<String> = (0..REQUESTS).map(|_| idempotency_e2e::key()).collect();
    let mut sends = tokio::task::JoinSet::new();
    for key in &keys {
        let (app, key) = (app.clone(), key.clone());
        sends.spawn(async move {
            let started = Instant::now();
            let answer = tokio::time::timeout(
                Duration::from_secs(20),
                send(&app, request("/tasks", &key, user, "{}")),
            )
            .await;
            (started.elapsed(), answer.map(|(status, _, _)| status).ok())
        });
    }
    let mut slowest = Duration::ZERO;
    let mut statuses = Vec::new();
    while let Some(sent) = sends.join_next().await {
        let (took, status) = sent.unwrap();
        slowest = slowest.max(took);
        statuses.push(status.unwrap_or(StatusCode::GATEWAY_TIMEOUT));
    }
    match fault {
        Fault::Frozen => pg.thaw().unwrap(),
        Fault::KeyTableLocked => admin.batch_execute("ROLLBACK").await.unwrap(),
    }
    // Each client retries with its key until it gets its answer: every task is created once.
    for key in &keys {
        let until = Instant::now() + Duration::from_secs(20);
        loop {
            let (status, _, _) = send(&app, request("/tasks", key, user, "{}")).await;
            if status == StatusCode::CREATED {
                break;
            }
            assert!(
                Instant::now() < until,
                "{mode:?}: {key} still answers {status}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let tasks: i64 = admin
        .query_one("SELECT count(*) FROM side_effects", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        tasks,
        1 + REQUESTS as i64,
        "{fault:?} {mode:?}: one task per key"
    );
    (slowest, statuses)
}

async fn bounded_during(fault: Fault) {
    let mut failures = Vec::new();
    for mode in [
        ClaimMode::Lease,
        ClaimMode::OneTransaction,
        ClaimMode::OneTransactionSpeculative,
    ] {
        let (slowest, statuses) = answers_during(fault, mode).await;
        eprintln!("{fault:?} {mode:?}: slowest {slowest:?}, {statuses:?}");
        if slowest > STORE_TIMEOUT + Duration::from_secs(1) {
            failures.push(format!("{mode:?}: slowest answer {slowest:?}"));
        }
        if let Some(status) = statuses
            .iter()
            .find(|s| **s != StatusCode::SERVICE_UNAVAILABLE)
        {
            failures.push(format!(
                "{mode:?}: answered {status} (the store did not answer)"
            ));
        }
    }
    assert!(failures.is_empty(), "{fault:?}: {failures:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_database_gets_every_request_an_answer_within_the_store_timeout() {
    bounded_during(Fault::Frozen).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locked_key_table_gets_every_request_an_answer_within_the_store_timeout() {
    bounded_during(Fault::KeyTableLocked).await;
}
