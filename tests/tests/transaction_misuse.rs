//! Through HTTP, in every claim mode: what a client sees, and how many side effects stand, when
//! a handler misuses its request's transaction or a retry meets a limit. In the speculative
//! mode a retry's handler runs before the key's lookup has answered, and its statements are
//! refused (`25P02`); these cases hold the layer to answering such a retry from the key's
//! record whatever the handler does with the refusal.
//!
//! - a handler that unwraps its refused statement (panics): the retry still replays, and a
//!   different request with the key still gets 422;
//! - replays do not use up the per-caller limit on new keys;
//! - taking the transaction twice (two extractors, or a helper opening it again) is answered at
//!   once with `500 transaction-misused`, the key released and the connection returned;
//! - a handler that keeps its transaction open and idle for longer than a lease (waiting on
//!   something outside the database) loses it: nothing it wrote stands, and its retry runs.
#![allow(clippy::unwrap_used)]

use axum::Router;
use axum::extract::{Extension, State};
use axum::response::IntoResponse;
use axum::routing::post;
use hyper::StatusCode;
use idempotency::{ClaimMode, IdempotencyLayer, PostgresStore, PostgresTransaction, Tx};
use idempotency::{TransactionSlot, TxRejection};
use idempotency_e2e::{User, migrated_postgres_store_with_side_effects, request, send};
use std::time::Duration;

const MODES: [ClaimMode; 3] = [
    ClaimMode::Lease,
    ClaimMode::OneTransaction,
    ClaimMode::OneTransactionSpeculative,
];

/// Bound on any one answer: a hang fails the case instead of the suite.
const ANSWER_WITHIN: Duration = Duration::from_secs(10);

#[derive(Clone)]
struct Effects(String);

/// Writes one side effect and unwraps the statement's result, as many handlers do.
async fn create_unwrapping(
    State(effects): State<Effects>,
    tx: Tx<PostgresTransaction>,
    body: String,
) -> (StatusCode, String) {
    let sql = format!("INSERT INTO {} (body) VALUES ($1)", effects.0);
    tx.execute(&sql, &[&body]).await.unwrap();
    (StatusCode::CREATED, format!("created {body}"))
}

/// Writes one side effect and answers 500 when the statement fails.
async fn create_checked(
    State(effects): State<Effects>,
    tx: Tx<PostgresTransaction>,
    body: String,
) -> Result<(StatusCode, String), StatusCode> {
    let sql = format!("INSERT INTO {} (body) VALUES ($1)", effects.0);
    match tx.execute(&sql, &[&body]).await {
        Ok(_) => Ok((StatusCode::CREATED, format!("created {body}"))),
        Err(_) => Err(StatusCode::INTERNAL_SERVER_ERROR),
    }
}

/// Asks for the request's transaction twice through two extractors.
async fn two_extractors(
    State(effects): State<Effects>,
    tx: Tx<PostgresTransaction>,
    _again: Tx<PostgresTransaction>,
    body: String,
) -> StatusCode {
    let sql = format!("INSERT INTO {} (body) VALUES ($1)", effects.0);
    let _ = tx.execute(&sql, &[&body]).await;
    StatusCode::CREATED
}

/// Holds the transaction and asks the slot for it again, as a helper function might.
async fn reopens(
    State(effects): State<Effects>,
    Extension(slot): Extension<TransactionSlot>,
    tx: Tx<PostgresTransaction>,
    body: String,
) -> axum::response::Response {
    let sql = format!("INSERT INTO {} (body) VALUES ($1)", effects.0);
    let _ = tx.execute(&sql, &[&body]).await;
    match slot.open::<PostgresTransaction>().await {
        Ok(_) => StatusCode::CREATED.into_response(),
        Err(error) => TxRejection(error).into_response(),
    }
}

/// Writes one side effect, then, the first time only, waits longer than the idle bound (a call
/// to a slow service with the transaction open) before answering.
async fn create_then_wait(
    State(effects): State<Effects>,
    Extension(first): Extension<std::sync::Arc<std::sync::atomic::AtomicBool>>,
    tx: Tx<PostgresTransaction>,
    body: String,
) -> Result<(StatusCode, String), StatusCode> {
    let sql = format!("INSERT INTO {} (body) VALUES ($1)", effects.0);
    tx.execute(&sql, &[&body])
        .await
        .map_err(|_| StatusCode::INTERNAL_SERVER_ERROR)?;
    if first.swap(false, std::sync::atomic::Ordering::SeqCst) {
        tokio::time::sleep(IDLE_LEASE + Duration::from_millis(1500)).await;
    }
    Ok((StatusCode::CREATED, format!("created {body}")))
}

/// The lease of [`a_transaction_idle_longer_than_a_lease_commits_nothing`].
const IDLE_LEASE: Duration = Duration::from_secs(2);

async fn setup(
    mode: ClaimMode,
    limit: Option<u32>,
) -> (
    Router,
    PostgresStore,
    String,
    idempotency_testkit::TestSchema,
) {
    let (store, schema, table) = migrated_postgres_store_with_side_effects("idem_misuse").await;
    let mut builder = IdempotencyLayer::builder(store.clone())
        .scope_from_extension::<User>()
        .claim_mode(mode);
    if let Some(keys) = limit {
        builder = builder.new_keys_per_scope(keys, Duration::from_secs(600));
    }
    let app = Router::new()
        .route("/tasks", post(create_unwrapping))
        .route("/checked", post(create_checked))
        .route("/twice", post(two_extractors))
        .route("/reopen", post(reopens))
        .layer(builder.build().expect("valid idempotency layer settings"))
        .with_state(Effects(table.clone()));
    (app, store, table, schema)
}

async fn count(store: &PostgresStore, table: &str) -> i64 {
    let client = store.pool().get().await.unwrap();
    client
        .query_one(&format!("SELECT count(*) FROM {table}"), &[])
        .await
        .unwrap()
        .get(0)
}

async fn post_to(
    app: &Router,
    path: &str,
    key: &str,
    user: User,
    body: &str,
) -> (StatusCode, hyper::HeaderMap, bytes::Bytes) {
    tokio::time::timeout(ANSWER_WITHIN, send(app, request(path, key, user, body)))
        .await
        .unwrap_or_else(|_| panic!("POST {path} went unanswered for {ANSWER_WITHIN:?}"))
}

fn replayed(headers: &hyper::HeaderMap) -> bool {
    headers
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_handler_that_unwraps_its_refused_statement_still_replays() {
    for mode in MODES {
        let (app, store, table, _schema) = setup(mode, None).await;
        let (user, key) = (idempotency_e2e::user(), idempotency_e2e::key());
        let (status, _, first) = post_to(&app, "/tasks", &key, user, "milk").await;
        assert_eq!(status, StatusCode::CREATED, "{mode:?}");
        for retry in 0..3 {
            let (status, headers, body) = post_to(&app, "/tasks", &key, user, "milk").await;
            assert_eq!(
                (status, replayed(&headers)),
                (StatusCode::CREATED, true),
                "{mode:?}: retry {retry} must replay: {}",
                String::from_utf8_lossy(&body)
            );
            assert_eq!(body, first, "{mode:?}: the replay is the first response");
        }
        let (status, _, body) = post_to(&app, "/tasks", &key, user, "bread").await;
        assert_eq!(
            status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{mode:?}: another request with the key: {}",
            String::from_utf8_lossy(&body)
        );
        assert_eq!(count(&store, &table).await, 1, "{mode:?}: one side effect");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replays_do_not_use_up_the_limit_on_new_keys() {
    for mode in MODES {
        let (app, store, table, _schema) = setup(mode, Some(3)).await;
        let user = idempotency_e2e::user();
        let first = idempotency_e2e::key();
        let (status, _, _) = post_to(&app, "/checked", &first, user, "a").await;
        assert_eq!(status, StatusCode::CREATED, "{mode:?}");
        for _ in 0..3 {
            let (status, headers, _) = post_to(&app, "/checked", &first, user, "a").await;
            assert_eq!((status, replayed(&headers)), (StatusCode::CREATED, true));
        }
        let (status, _, _) = post_to(&app, "/checked", &first, user, "other").await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{mode:?}");
        // The replays and the mismatch were not new keys: two more fit in the limit of 3.
        for body in ["b", "c"] {
            let (status, _, problem) =
                post_to(&app, "/checked", &idempotency_e2e::key(), user, body).await;
            assert_eq!(
                status,
                StatusCode::CREATED,
                "{mode:?}: new key {body} after replays: {}",
                String::from_utf8_lossy(&problem)
            );
        }
        let (status, _, _) = post_to(&app, "/checked", &idempotency_e2e::key(), user, "d").await;
        assert_eq!(
            status,
            StatusCode::TOO_MANY_REQUESTS,
            "{mode:?}: the fourth new key is over the limit"
        );
        assert_eq!(count(&store, &table).await, 3, "{mode:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn taking_the_transaction_twice_is_an_immediate_typed_error() {
    for mode in MODES {
        let (app, store, table, _schema) = setup(mode, None).await;
        let user = idempotency_e2e::user();
        for path in ["/twice", "/reopen"] {
            let key = idempotency_e2e::key();
            // Twice: the key was released after the first, so the second runs (and fails) again
            // instead of waiting for it.
            for attempt in 0..2 {
                let (status, headers, body) = post_to(&app, path, &key, user, "x").await;
                let body = String::from_utf8_lossy(&body);
                assert_eq!(
                    status,
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "{mode:?} {path} attempt {attempt}: {body}"
                );
                assert_eq!(
                    headers.get("content-type").unwrap(),
                    "application/problem+json"
                );
                assert!(
                    body.contains("transaction-misused"),
                    "{mode:?} {path}: {body}"
                );
            }
        }
        // No connection was kept: more requests than the pool has connections all run.
        for i in 0..40 {
            let (status, _, _) = post_to(
                &app,
                "/tasks",
                &idempotency_e2e::key(),
                user,
                &i.to_string(),
            )
            .await;
            assert_eq!(status, StatusCode::CREATED, "{mode:?}");
        }
        assert_eq!(
            count(&store, &table).await,
            40,
            "{mode:?}: no misused write stands"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_transaction_idle_longer_than_a_lease_commits_nothing() {
    for mode in MODES {
        let (store, _schema, table) = migrated_postgres_store_with_side_effects("idem_idle").await;
        let first = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let app = Router::new()
            .route("/slow", post(create_then_wait))
            .layer(
                IdempotencyLayer::builder(store.clone())
                    .scope_from_extension::<User>()
                    .claim_mode(mode)
                    .lease(IDLE_LEASE)
                    .store_timeout(Duration::from_millis(500))
                    .build()
                    .expect("valid idempotency layer settings"),
            )
            .layer(Extension(first))
            .with_state(Effects(table.clone()));
        let (user, key) = (idempotency_e2e::user(), idempotency_e2e::key());
        let (status, headers, body) = post_to(&app, "/slow", &key, user, "milk").await;
        let body = String::from_utf8_lossy(&body);
        eprintln!("{mode:?}: the idle request answered {status} {body}");
        assert!(
            status.is_server_error(),
            "{mode:?}: the idle transaction was ended, so its request cannot succeed: {status} {body}"
        );
        assert!(!replayed(&headers), "{mode:?}");
        assert_eq!(
            count(&store, &table).await,
            0,
            "{mode:?}: nothing the ended transaction wrote stands ({status} {body})"
        );
        // The retry runs and commits, once. In the one-transaction modes the ended transaction
        // was what held the key, so at once; in the lease mode the commit's failure is a lost
        // connection (`503 outcome-unknown`), so the claim stands until its lease lapses and
        // the retry gets `409` until then.
        let deadline = tokio::time::Instant::now() + IDLE_LEASE + Duration::from_secs(3);
        loop {
            let (status, headers, body) = post_to(&app, "/slow", &key, user, "milk").await;
            if status == StatusCode::CONFLICT
                && mode == ClaimMode::Lease
                && tokio::time::Instant::now() < deadline
            {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
            assert_eq!(
                (status, replayed(&headers)),
                (StatusCode::CREATED, false),
                "{mode:?}: {}",
                String::from_utf8_lossy(&body)
            );
            break;
        }
        let (status, headers, _) = post_to(&app, "/slow", &key, user, "milk").await;
        assert_eq!((status, replayed(&headers)), (StatusCode::CREATED, true));
        assert_eq!(count(&store, &table).await, 1, "{mode:?}: one side effect");
    }
}
