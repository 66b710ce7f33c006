//! Through HTTP, on a throwaway PostgreSQL: a `COMMIT` the database writes but does not confirm.
//! The server is told that a synchronous standby must confirm every commit, and no standby
//! exists, so a commit writes its WAL locally and then waits: from the service's side it is lost
//! on the way. The client must hear "outcome unknown, retry with the same key", never "nothing
//! was kept" (a client that believes that and resubmits under a new key creates a duplicate);
//! once the standby requirement is lifted the commit lands, and the retry with the same key
//! replays the 201 with one task. In both claim modes.
//!
//! Before issue 26 item 2 the client got 503 `not-committed` ("none of its changes exist") here.
#![allow(clippy::unwrap_used)]

use axum::Router;
use axum::extract::State;
use axum::routing::post;
use hyper::StatusCode;
use idempotency::postgres::tokio_postgres::{self, NoTls};
use idempotency::{ClaimMode, IdempotencyLayer, PostgresStore, PostgresTransaction, Tx};
use idempotency_e2e::{User, request, send};
use idempotency_testkit::TempPostgres;
use std::sync::Arc;
use std::time::Duration;

/// The store's timeout: how long a held commit waits before the layer answers.
const STORE_TIMEOUT: Duration = Duration::from_millis(1000);

/// An administrator's connection to the throwaway server.
async fn admin(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await.unwrap();
    tokio::spawn(connection);
    client
}

/// Requires (`Some`) or lifts (`None`) a synchronous standby that does not exist, and waits
/// until the server acts on it. (Neither statement writes WAL, so neither waits itself.)
async fn synchronous_standby(admin: &tokio_postgres::Client, name: Option<&str>) {
    let sql = match name {
        Some(name) => format!("ALTER SYSTEM SET synchronous_standby_names = '{name}'"),
        None => "ALTER SYSTEM RESET synchronous_standby_names".to_owned(),
    };
    admin.batch_execute(&sql).await.unwrap();
    admin
        .batch_execute("SELECT pg_reload_conf()")
        .await
        .unwrap();
    // Backends read the new setting before their next statement; the checkpointer publishes
    // it to the commit path. Give both a moment.
    tokio::time::sleep(Duration::from_millis(500)).await;
}

/// The handler: once the request's transaction is open (and, in the lease mode, its claim
/// committed), it makes every later commit wait for the missing standby, then writes its task.
async fn create(
    State(admin): State<Arc<tokio_postgres::Client>>,
    tx: Tx<PostgresTransaction>,
    title: String,
) -> (StatusCode, &'static str) {
    synchronous_standby(&admin, Some("missing_standby")).await;
    tx.execute("INSERT INTO tasks (title) VALUES ($1)", &[&title])
        .await
        .unwrap();
    (StatusCode::CREATED, "created")
}

async fn tasks(admin: &tokio_postgres::Client, title: &str) -> i64 {
    admin
        .query_one("SELECT count(*) FROM tasks WHERE title = $1", &[&title])
        .await
        .unwrap()
        .get(0)
}

async fn held_commit_is_unknown_then_replays(mode: ClaimMode) {
    let pg = TempPostgres::start(&[]).unwrap();
    let url = pg.url("postgres");
    let store = PostgresStore::builder(url.clone()).build().await.unwrap();
    store.migrate().await.unwrap();
    let admin = Arc::new(admin(&url).await);
    admin
        .batch_execute("CREATE TABLE tasks (title text NOT NULL)")
        .await
        .unwrap();
    let layer = IdempotencyLayer::builder(store)
        .scope_from_extension::<User>()
        .claim_mode(mode)
        .store_timeout(STORE_TIMEOUT)
        .build()
        .expect("valid idempotency layer settings");
    let app = Router::new()
        .route("/tasks", post(create))
        .layer(layer)
        .with_state(Arc::clone(&admin));
    let (key, user) = (idempotency_e2e::key(), idempotency_e2e::user());

    let (status, headers, body) = send(&app, request("/tasks", &key, user, &key)).await;
    let body = String::from_utf8_lossy(&body);
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{mode:?}: {body}");
    assert!(
        body.contains("outcome-unknown"),
        "{mode:?}: the client must hear that the outcome is unknown: {body}"
    );
    assert!(headers.contains_key("retry-after"), "{mode:?}");

    // The standby requirement is lifted: the held commit lands.
    synchronous_standby(&admin, None).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while tasks(&admin, &key).await == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{mode:?}: the held commit never landed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let (status, headers, body) = send(&app, request("/tasks", &key, user, &key)).await;
    assert_eq!(
        status,
        StatusCode::CREATED,
        "{mode:?}: {}",
        String::from_utf8_lossy(&body)
    );
    assert!(
        headers.contains_key("idempotent-replayed"),
        "{mode:?}: the retry replays the commit that landed"
    );
    assert_eq!(&body[..], b"created");
    assert_eq!(tasks(&admin, &key).await, 1, "{mode:?}: one task");
    drop(app);
    pg.stop().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_held_by_a_missing_synchronous_standby_is_unknown_then_replays_in_one_transaction()
{
    held_commit_is_unknown_then_replays(ClaimMode::OneTransaction).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_held_by_a_missing_synchronous_standby_is_unknown_then_replays_in_lease_mode() {
    held_commit_is_unknown_then_replays(ClaimMode::Lease).await;
}
