//! Responses the library generates itself are never stored as a key's result, and go through
//! the layer's renderer: a `Tx` refused inside the handler (the lease ran out before the
//! handler asked for it: 409; the store cannot give one: 500) must not be replayed for a day
//! while the handler never ran, and a Stripe-profile client must get Stripe's envelope for it.
#![allow(clippy::unwrap_used)]

use axum::Router;
use axum::extract::Request;
use axum::middleware::{self, Next};
use axum::routing::post;
use hyper::StatusCode;
use idempotency::{IdempotencyLayer, PostgresTransaction, Profile, Tx};
use idempotency_e2e::{User, migrated_postgres_store, request, send};
use idempotency_testkit::TestSchema;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// Holds a request marked `x-slow` for longer than the lease before the handler's extractors
/// run (a slow middleware, or a request queued behind a concurrency limit).
async fn slow_first(request: Request, next: Next) -> axum::response::Response {
    if request.headers().contains_key("x-slow") {
        tokio::time::sleep(Duration::from_millis(1_300)).await;
    }
    next.run(request).await
}

async fn app(profile: Profile, runs: Arc<AtomicUsize>) -> (Router, TestSchema) {
    let (store, schema) = migrated_postgres_store("idem_refusals").await;
    let layer = IdempotencyLayer::builder(store)
        .scope_from_extension::<User>()
        .profile(profile)
        // No heartbeat, a 1 s lease: the lease runs out while the request is held.
        .heartbeat(false)
        .lease(Duration::from_secs(1))
        .build()
        .expect("valid idempotency layer settings");
    let app = Router::new()
        .route(
            "/tasks",
            post(move |tx: Tx<PostgresTransaction>| {
                let runs = runs.clone();
                async move {
                    tx.execute("SELECT 1", &[]).await.unwrap();
                    runs.fetch_add(1, Ordering::SeqCst);
                    StatusCode::CREATED
                }
            }),
        )
        .route_layer(middleware::from_fn(slow_first))
        .route_layer(layer);
    (app, schema)
}

/// On PostgreSQL: the 409 for a lapsed lease is rendered in the layer's profile (a Stripe client
/// got problem+json before) and the retry runs. (Here the store's lease has lapsed too, so its
/// fencing would have kept the 409 out anyway; the next test shows a refusal that was stored.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_refused_for_a_lapsed_lease_is_not_stored() {
    for (profile, conflict_code) in [
        (Profile::Ietf, "idempotency_key_in_flight"),
        (Profile::Stripe, "idempotency_key_in_use"),
    ] {
        let runs = Arc::new(AtomicUsize::new(0));
        let (app, _schema) = app(profile, runs.clone()).await;
        let user = User(uuid::Uuid::new_v4());
        let key = uuid::Uuid::new_v4().to_string();

        let mut slow = request("/tasks", &key, user, "{}");
        slow.headers_mut()
            .insert("x-slow", axum::http::HeaderValue::from_static("1"));
        let (status, headers, body) = send(&app, slow).await;
        assert_eq!(
            status,
            StatusCode::CONFLICT,
            "{profile:?}: the lease ran out"
        );
        assert_eq!(runs.load(Ordering::SeqCst), 0, "the handler never ran");
        let text = String::from_utf8_lossy(&body).into_owned();
        assert!(text.contains(conflict_code), "{profile:?}: {text}");
        match profile {
            Profile::Stripe => assert!(
                text.contains("\"error\""),
                "Stripe's envelope, not problem+json: {text}"
            ),
            _ => assert_eq!(
                headers[axum::http::header::CONTENT_TYPE],
                "application/problem+json"
            ),
        }

        // The retry runs: the refusal was not the key's result.
        let (status, headers, _) = send(&app, request("/tasks", &key, user, "{}")).await;
        assert_eq!(status, StatusCode::CREATED, "{profile:?}");
        assert!(headers.get("idempotent-replayed").is_none(), "{profile:?}");
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{profile:?}");
    }
}

/// A store without transactions (memory) and a handler that asks for one: the layer's 500
/// `transaction-unavailable` is a configuration error, never the key's result, even under a
/// policy that stores every final status: the retry is not a replay (before, it was replayed
/// for the retention period, `idempotent-replayed: true`, while the handler never ran).
#[tokio::test]
async fn a_refused_transaction_is_not_stored_even_when_every_status_is() {
    use idempotency::{MemoryStore, ReplayPolicy};
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let app = Router::new()
        .route(
            "/tasks",
            post(move |_tx: Tx<PostgresTransaction>| {
                counted.fetch_add(1, Ordering::SeqCst);
                async { StatusCode::CREATED }
            }),
        )
        .route_layer(
            IdempotencyLayer::builder(MemoryStore::default())
                .scope_from_extension::<User>()
                .replay_policy(ReplayPolicy::all_final())
                .build()
                .expect("valid idempotency layer settings"),
        );
    let (user, key) = (User(uuid::Uuid::new_v4()), uuid::Uuid::new_v4().to_string());
    for attempt in 0..2 {
        let (status, headers, body) = send(&app, request("/tasks", &key, user, "{}")).await;
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{attempt}");
        assert!(
            String::from_utf8_lossy(&body).contains("transaction-unavailable"),
            "{body:?}"
        );
        assert!(
            headers.get("idempotent-replayed").is_none(),
            "attempt {attempt}: a library refusal was replayed"
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}
