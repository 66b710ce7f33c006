//! One user's flood must not make another user's retry run again (issue 28, item 1): user B
//! creates a report, user A sends a flood of new keys with large responses, and B's retry with
//! its key must still be a replay, on every store with its default settings.
#![allow(clippy::unwrap_used)]

use axum::Router;
use axum::extract::Extension;
use axum::http::StatusCode;
use axum::routing::post;
use idempotency::{IdempotencyLayer, IdempotencyStore, MemoryStore};
use idempotency_e2e::{Backend, Namespace, User, key, request, send, user};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

type RunsPerUser = Arc<Mutex<HashMap<uuid::Uuid, usize>>>;

/// An app whose `POST /reports` answers `size` bytes and counts its runs per user.
fn app(store: Arc<dyn IdempotencyStore>, size: usize) -> (Router, RunsPerUser) {
    app_with(store, size, |b| b)
}

/// [`app`] with the layer configured by `configure`.
fn app_with(
    store: Arc<dyn IdempotencyStore>,
    size: usize,
    configure: impl FnOnce(idempotency_e2e::Builder) -> idempotency_e2e::Builder,
) -> (Router, RunsPerUser) {
    let runs = Arc::new(Mutex::new(HashMap::new()));
    let counted = Arc::clone(&runs);
    let router = Router::new()
        .route(
            "/reports",
            post(move |Extension(user): Extension<User>| {
                let counted = Arc::clone(&counted);
                async move {
                    *counted.lock().unwrap().entry(user.0).or_insert(0) += 1;
                    (StatusCode::CREATED, vec![b'r'; size])
                }
            }),
        )
        .layer(
            configure(IdempotencyLayer::builder(store).scope_from_extension::<User>())
                .build()
                .expect("valid idempotency layer settings"),
        );
    (router, runs)
}

/// B stores, A floods `flood` new keys, B retries: a replay, and B's report ran once.
async fn flood_then_retry(store: Arc<dyn IdempotencyStore>, size: usize, flood: usize) -> bool {
    let (app, runs) = app(store, size);
    let (victim, attacker) = (user(), user());
    let victim_key = key();
    let (status, ..) = send(&app, request("/reports", &victim_key, victim, "{}")).await;
    assert_eq!(status, StatusCode::CREATED);
    for _ in 0..flood {
        let (status, ..) = send(&app, request("/reports", &key(), attacker, "{}")).await;
        assert_eq!(
            status,
            StatusCode::CREATED,
            "the flood's own requests are served"
        );
    }
    let (status, headers, body) = send(&app, request("/reports", &victim_key, victim, "{}")).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(body.len(), size);
    let replayed = headers.contains_key("idempotent-replayed");
    let victim_runs = runs.lock().unwrap()[&victim.0];
    assert_eq!(
        victim_runs == 1,
        replayed,
        "a replay runs nothing; a run is no replay"
    );
    replayed
}

/// The memory store's default bound is 64 MiB: 1,100 responses of 64 KiB pass it.
const BIG: usize = 64 * 1024;
const PAST_THE_BOUND: usize = 1_100;

mod memory {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_user_flooding_the_default_store_does_not_evict_another_user_s_response() {
        let store: Arc<dyn IdempotencyStore> = Arc::new(MemoryStore::default());
        assert!(
            flood_then_retry(store, BIG, PAST_THE_BOUND).await,
            "the victim's retry ran again"
        );
    }

    /// What the per-scope share prevents: one least-recently-used order for every user.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn without_per_user_shares_the_flood_makes_the_victim_s_retry_run_again() {
        let store = MemoryStore::builder().max_bytes_per_scope(u64::MAX).build();
        assert!(
            !flood_then_retry(Arc::new(store), BIG, PAST_THE_BOUND).await,
            "expected the flood to evict the victim's response"
        );
    }
}

/// PostgreSQL and Redis evict nothing by default: the flood (kept small, the records stay on
/// the shared servers until they expire) leaves the victim's record in place.
mod postgres {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_user_flooding_does_not_make_another_user_s_retry_run_again() {
        let namespace = Namespace::new(Backend::Postgres);
        assert!(flood_then_retry(namespace.store().await, 8 * 1024, 200).await);
        namespace.cleanup().await;
    }
}

mod redis {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_user_flooding_does_not_make_another_user_s_retry_run_again() {
        let namespace = Namespace::new(Backend::Redis);
        assert!(flood_then_retry(namespace.store().await, 8 * 1024, 200).await);
        namespace.cleanup().await;
    }
}

/// With `new_keys_per_scope`, a caller flooding a store that evicts nothing is refused once it
/// used its new keys of the window: 429 `scope-full`, its handler not run and nothing stored
/// for the refused keys, while its used keys and other callers' requests go on.
async fn a_caller_over_its_new_keys_is_refused_and_stores_nothing(
    store: Arc<dyn IdempotencyStore>,
) {
    use idempotency::{IdempotencyKey, KeyFormat, Scope};
    use std::time::Duration;
    let (app, runs) = app_with(Arc::clone(&store), 64, |b| {
        b.new_keys_per_scope(20, Duration::from_secs(60))
    });
    let (victim, attacker) = (user(), user());
    let victim_key = key();
    assert_eq!(
        send(&app, request("/reports", &victim_key, victim, "{}"))
            .await
            .0,
        StatusCode::CREATED
    );
    let attacker_keys: Vec<String> = (0..30).map(|_| key()).collect();
    let mut refused = Vec::new();
    for k in &attacker_keys {
        let (status, headers, body) = send(&app, request("/reports", k, attacker, "{}")).await;
        match status {
            StatusCode::CREATED => {}
            StatusCode::TOO_MANY_REQUESTS => {
                let retry_after: u64 = headers["retry-after"].to_str().unwrap().parse().unwrap();
                assert!((1..=60).contains(&retry_after), "{retry_after}");
                let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
                assert!(
                    problem["type"].as_str().unwrap().ends_with("scope-full"),
                    "{problem}"
                );
                refused.push(k.clone());
            }
            other => panic!("unexpected {other}"),
        }
    }
    assert_eq!(refused.len(), 10, "20 new keys per window, then 429");
    assert_eq!(
        runs.lock().unwrap()[&attacker.0],
        20,
        "the refused requests ran nothing"
    );
    let scope = Scope::from(attacker.0);
    for k in &refused {
        let key = IdempotencyKey::parse(k.as_bytes(), KeyFormat::opaque()).unwrap();
        assert!(
            store.get(&scope, &key).await.unwrap().is_none(),
            "a refused key left a record"
        );
    }
    // The attacker's used keys still replay; the victim's retry replays and its new key runs.
    let (status, headers, _) =
        send(&app, request("/reports", &attacker_keys[0], attacker, "{}")).await;
    assert_eq!(
        (status, headers.contains_key("idempotent-replayed")),
        (StatusCode::CREATED, true)
    );
    let (status, headers, _) = send(&app, request("/reports", &victim_key, victim, "{}")).await;
    assert_eq!(
        (status, headers.contains_key("idempotent-replayed")),
        (StatusCode::CREATED, true)
    );
    assert_eq!(
        send(&app, request("/reports", &key(), victim, "{}"))
            .await
            .0,
        StatusCode::CREATED
    );
}

mod limited {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres() {
        let namespace = Namespace::new(Backend::Postgres);
        a_caller_over_its_new_keys_is_refused_and_stores_nothing(namespace.store().await).await;
        namespace.cleanup().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redis() {
        let namespace = Namespace::new(Backend::Redis);
        a_caller_over_its_new_keys_is_refused_and_stores_nothing(namespace.store().await).await;
        namespace.cleanup().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn memory() {
        a_caller_over_its_new_keys_is_refused_and_stores_nothing(Arc::new(MemoryStore::default()))
            .await;
    }
}
