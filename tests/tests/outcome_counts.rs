//! Each request counts once, under the outcome its client got (issue 46 item 4): in the
//! speculative mode a replay, a duplicate in flight and a mismatch proceed into a transaction
//! before their lookup is read, and were counted `executed` as well, so the replay and conflict
//! ratios could not pass 0.5 and the replay-storm alert could never fire.
#![allow(clippy::unwrap_used)]

use axum::Router;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::post;
use hyper::StatusCode;
use idempotency::{ClaimMode, IdempotencyLayer, PostgresTransaction, Tx};
use idempotency_e2e::{User, migrated_postgres_store_with_side_effects, request, send};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use std::collections::HashMap;
use std::sync::Arc;
use tokio::sync::Semaphore;

#[derive(Clone)]
struct Handler {
    table: String,
    gate: Arc<Semaphore>,
}

/// Writes a row in the request's transaction; with `x-hold`, waits at the gate after it.
async fn create(
    State(handler): State<Handler>,
    headers: HeaderMap,
    tx: Tx<PostgresTransaction>,
) -> StatusCode {
    let sql = format!("INSERT INTO {} (body) VALUES ('x')", handler.table);
    if tx.execute(&sql, &[]).await.is_err() {
        return StatusCode::INTERNAL_SERVER_ERROR;
    }
    drop(tx);
    if headers.contains_key("x-hold") {
        let _permit = handler.gate.acquire().await.unwrap();
    }
    StatusCode::CREATED
}

/// `idempotency_requests_total` by outcome, for the requests one speculative app answered.
fn counts_of(
    requests: impl FnOnce() -> std::pin::Pin<Box<dyn std::future::Future<Output = ()>>>,
) -> HashMap<String, u64> {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(requests());
    });
    let mut counts = HashMap::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let key = key.key();
        if key.name() != "idempotency_requests_total" {
            continue;
        }
        let outcome = key
            .labels()
            .find(|label| label.key() == "outcome")
            .map(|label| label.value().to_owned())
            .unwrap();
        if let DebugValue::Counter(n) = value {
            *counts.entry(outcome).or_default() += n;
        }
    }
    counts
}

#[test]
fn the_speculative_mode_counts_each_request_once() {
    let counts = counts_of(|| {
        Box::pin(async {
            let (store, _schema, table) =
                migrated_postgres_store_with_side_effects("idem_counts").await;
            let gate = Arc::new(Semaphore::new(0));
            let layer = IdempotencyLayer::builder(store)
                .scope_from_extension::<User>()
                .claim_mode(ClaimMode::OneTransactionSpeculative)
                .build()
                .expect("valid idempotency layer settings");
            let app = Router::new()
                .route("/tasks", post(create))
                .route_layer(layer)
                .with_state(Handler {
                    table,
                    gate: Arc::clone(&gate),
                });
            let (key, user) = (idempotency_e2e::key(), idempotency_e2e::user());
            // In flight: the first request holds the key while a duplicate comes.
            let mut held = request("/tasks", &key, user, "{}");
            held.headers_mut().insert("x-hold", "1".parse().unwrap());
            let first = tokio::spawn({
                let app = app.clone();
                async move { send(&app, held).await.0 }
            });
            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
            let (status, _, _) = send(&app, request("/tasks", &key, user, "{}")).await;
            assert_eq!(status, StatusCode::CONFLICT);
            gate.add_permits(1);
            assert_eq!(first.await.unwrap(), StatusCode::CREATED);
            for _ in 0..3 {
                let (status, headers, _) = send(&app, request("/tasks", &key, user, "{}")).await;
                assert_eq!(status, StatusCode::CREATED);
                assert!(headers.contains_key("idempotent-replayed"));
            }
            let (status, _, _) = send(&app, request("/tasks", &key, user, r#"{"other":1}"#)).await;
            assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
        })
    });
    let count = |outcome: &str| counts.get(outcome).copied().unwrap_or(0);
    assert_eq!(count("executed"), 1, "{counts:?}");
    assert_eq!(count("conflict"), 1, "{counts:?}");
    assert_eq!(count("replayed"), 3, "{counts:?}");
    assert_eq!(count("mismatch"), 1, "{counts:?}");
    assert_eq!(
        counts.values().sum::<u64>(),
        6,
        "one count per request: {counts:?}"
    );
}
