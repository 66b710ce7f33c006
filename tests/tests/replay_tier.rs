//! The local replay tier on the shared stores, through HTTP: a retry answered from the tier
//! costs the store no call (counted on the store behind it), gets the same bytes as the first
//! answer, and the handler runs once. A retry that lands on another instance first asks the
//! store once, then that instance answers from its own tier.
#![allow(clippy::unwrap_used)]

use axum::http::StatusCode;
use idempotency::IdempotencyStore;
use idempotency::memory::ReplayTier;
use idempotency_conformance::faults::{FaultyStore, Op};
use idempotency_e2e::{Backend, Namespace, Runs, counting_app, key, request, send, user};
use std::sync::Arc;
use std::sync::atomic::Ordering;

type Counted = FaultyStore<Arc<dyn IdempotencyStore>>;

/// Every call that reaches the store behind a tier.
fn store_calls(store: &Counted) -> u64 {
    [Op::Claim, Op::Complete, Op::Extend, Op::Release, Op::Get]
        .into_iter()
        .map(|op| store.calls(op))
        .sum()
}

async fn retries_cost_no_round_trip(backend: Backend) {
    let ns = Namespace::new(backend);
    let runs = Runs::default();
    let (near, far) = (
        FaultyStore::new(ns.store().await),
        FaultyStore::new(ns.store().await),
    );
    let near_app = counting_app(Arc::new(ReplayTier::new(near.clone())), &runs);
    let far_app = counting_app(Arc::new(ReplayTier::new(far.clone())), &runs);
    let (k, u) = (key(), user());
    let body = r#"{"item":"book"}"#;

    let (status, headers, first) = send(&near_app, request("/orders", &k, u, body)).await;
    assert_eq!(status, StatusCode::CREATED);
    assert!(headers.get("idempotent-replayed").is_none());
    let before = store_calls(&near);
    for _ in 0..3 {
        let (status, headers, replay) = send(&near_app, request("/orders", &k, u, body)).await;
        assert_eq!((status, &replay), (StatusCode::CREATED, &first));
        assert_eq!(headers["idempotent-replayed"], "true");
    }
    assert_eq!(
        store_calls(&near),
        before,
        "{backend:?}: a replay from the tier reached the store"
    );
    let (status, _, _) = send(&near_app, request("/orders", &k, u, r#"{"item":"pen"}"#)).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(store_calls(&near), before);

    // The other instance has not seen the key: one claim finds the record in the store, and
    // its later retries stay local.
    for expected in [1, 1, 1] {
        let (status, _, replay) = send(&far_app, request("/orders", &k, u, body)).await;
        assert_eq!((status, &replay), (StatusCode::CREATED, &first));
        assert_eq!(store_calls(&far), expected, "{backend:?}");
    }
    assert_eq!(
        runs.orders.load(Ordering::SeqCst),
        1,
        "the side effect ran again"
    );
    ns.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_retries_cost_no_round_trip() {
    retries_cost_no_round_trip(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_retries_cost_no_round_trip() {
    retries_cost_no_round_trip(Backend::Redis).await;
}
