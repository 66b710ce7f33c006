//! Duplicate storms on PostgreSQL, through the demo's task API in each claim mode: many copies
//! of one request at once, on a 32-connection pool. Every request must be answered within a
//! bound (no deadlock, no pool exhausted for good), and each key must create one task.
#![allow(clippy::unwrap_used)]

use axum::Router;
use hyper::{StatusCode, header};
use idempotency::ClaimMode;
use idempotency_demo::Options;
use idempotency_e2e::{TestDatabase, create_task, send};
use std::time::Duration;

/// Bound on one request's answer, however many duplicates it races.
const PER_REQUEST: Duration = Duration::from_secs(10);
/// Bound on a client's retries of one key until it gets its 201.
const PER_KEY: Duration = Duration::from_secs(30);

async fn demo(db: &TestDatabase, claim_mode: ClaimMode) -> Router {
    let options = Options {
        claim_mode,
        ..Options::default()
    };
    idempotency_demo::build_app_with(db.url(), &options)
        .await
        .unwrap()
        .router
}

/// Sends `create(user, key)` until it gets its 201 (first or replayed), retrying 409 and 503
/// like a client; returns the body and how many sends it took.
async fn until_created(app: &Router, user: &str, key: &str) -> (bytes::Bytes, usize) {
    let until = tokio::time::Instant::now() + PER_KEY;
    let mut sends = 0;
    loop {
        sends += 1;
        let (status, headers, body) =
            tokio::time::timeout(PER_REQUEST, send(app, create_task(user, key)))
                .await
                .unwrap_or_else(|_| panic!("a request went unanswered for {PER_REQUEST:?}"));
        match status {
            StatusCode::CREATED => return (body, sends),
            StatusCode::CONFLICT | StatusCode::SERVICE_UNAVAILABLE => {
                assert!(
                    headers.contains_key(header::RETRY_AFTER),
                    "{status} without Retry-After"
                );
                assert!(
                    tokio::time::Instant::now() < until,
                    "key {key} not created within {PER_KEY:?}"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            other => panic!("unexpected {other}: {}", String::from_utf8_lossy(&body)),
        }
    }
}

/// How many tasks each of `keys` (task titles) has, for the keys that have any.
async fn tasks_per_key(db: &TestDatabase, keys: &[String]) -> Vec<i64> {
    db.connect()
        .await
        .query(
            "SELECT count(*) FROM tasks WHERE title = ANY($1) GROUP BY title",
            &[&keys],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect()
}

/// 200 copies of one request at once on a 32-connection pool: all answered within the bound,
/// every one ends with the same 201, one task.
async fn two_hundred_duplicates_of_one_key(claim_mode: ClaimMode) {
    let db = TestDatabase::create("idem_storm").await;
    let app = demo(&db, claim_mode).await;
    let (user, key) = (
        uuid::Uuid::new_v4().to_string(),
        uuid::Uuid::new_v4().to_string(),
    );
    let mut clients = Vec::new();
    for _ in 0..200 {
        let (app, user, key) = (app.clone(), user.clone(), key.clone());
        clients.push(tokio::spawn(async move {
            until_created(&app, &user, &key).await
        }));
    }
    let mut bodies = Vec::new();
    for client in clients {
        bodies.push(client.await.unwrap().0);
    }
    assert!(
        bodies.windows(2).all(|w| w[0] == w[1]),
        "every duplicate got the same task"
    );
    assert_eq!(tasks_per_key(&db, &[key]).await, vec![1], "one task");
    drop(app);
    db.drop().await;
}

/// 64 clients each send the same 20 keys, in their own order: every key creates one task, and
/// every client gets each key's one task back.
async fn sixty_four_clients_sending_the_same_twenty_keys(claim_mode: ClaimMode) {
    let db = TestDatabase::create("idem_storm").await;
    let app = demo(&db, claim_mode).await;
    let user = uuid::Uuid::new_v4().to_string();
    let keys: Vec<String> = (0..20).map(|_| uuid::Uuid::new_v4().to_string()).collect();
    let mut clients = Vec::new();
    for client in 0..64usize {
        let (app, user, keys) = (app.clone(), user.clone(), keys.clone());
        clients.push(tokio::spawn(async move {
            let mut seen = Vec::new();
            for i in 0..keys.len() {
                let key = &keys[(i + client) % keys.len()];
                seen.push((key.clone(), until_created(&app, &user, key).await.0));
            }
            seen
        }));
    }
    let mut first: std::collections::HashMap<String, bytes::Bytes> = Default::default();
    for client in clients {
        for (key, body) in client.await.unwrap() {
            let expected = first.entry(key).or_insert_with(|| body.clone());
            assert_eq!(*expected, body, "every client got the key's one task");
        }
    }
    let counts = tasks_per_key(&db, &keys).await;
    assert_eq!(counts.len(), 20, "every key created its task");
    assert!(
        counts.iter().all(|&n| n == 1),
        "one task per key: {counts:?}"
    );
    drop(app);
    db.drop().await;
}

/// The storms in each claim mode.
macro_rules! storms {
    ($($module:ident: $mode:expr;)*) => {$(
        mod $module {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn two_hundred_duplicates_of_one_key() {
                super::two_hundred_duplicates_of_one_key($mode).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sixty_four_clients_sending_the_same_twenty_keys() {
                super::sixty_four_clients_sending_the_same_twenty_keys($mode).await;
            }
        }
    )*};
}

storms! {
    speculative: ClaimMode::OneTransactionSpeculative;
    one_transaction: ClaimMode::OneTransaction;
    lease: ClaimMode::Lease;
}
