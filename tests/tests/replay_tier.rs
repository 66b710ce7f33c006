//! The local replay tier on the shared stores, through HTTP: a retry answered from the tier
//! costs the store no call (counted on the store behind it), gets the same bytes as the first
//! answer, and the handler runs once. A retry that lands on another instance first asks the
//! store once, then that instance answers from its own tier.
#![allow(clippy::unwrap_used)]

use axum::http::StatusCode;
use idempotency::IdempotencyStore;
use idempotency::memory::ReplayTier;
use idempotency_conformance::faults::{FaultyStore, StoreOp};
use idempotency_e2e::{Backend, Namespace, Runs, counting_app, key, request, send, user};
use std::sync::Arc;
use std::sync::atomic::Ordering;

type Counted = FaultyStore<Arc<dyn IdempotencyStore>>;

/// Every call that reaches the store behind a tier.
fn store_calls(store: &Counted) -> u64 {
    [
        StoreOp::Claim,
        StoreOp::Complete,
        StoreOp::Extend,
        StoreOp::Release,
        StoreOp::Get,
    ]
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

/// Issue 26 item 5: after the store loses its records (a Redis restart without persistence), an
/// instance whose tier holds a copy made before the loss must answer what the store holds now,
/// as every other instance does: the tier asks the store whether it lost its records (at most
/// every `check_state_every`) and drops older copies. A tier that never asks shows the hazard:
/// it keeps replaying the lost answer while the store holds another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_store_loss_every_instance_replays_what_the_store_holds() {
    use idempotency::RedisStore;
    use idempotency_testkit::TempRedis;
    use std::time::Duration;
    let mut server = TempRedis::start(&[]).unwrap_or_else(|e| panic!("throwaway redis: {e}"));
    let store = || async {
        RedisStore::builder(server.url())
            .connect_timeout(Duration::from_secs(1))
            .response_timeout(Duration::from_secs(1))
            // No background watch: only the tier's own check can notice the loss.
            .watch_interval(None)
            .build()
            .await
            .unwrap()
    };
    let tier = |store: RedisStore, every: Duration| {
        Arc::new(ReplayTier::builder(store).check_state_every(every).build())
    };
    let runs = Runs::default();
    let checking = counting_app(tier(store().await, Duration::from_millis(100)), &runs);
    let never = counting_app(tier(store().await, Duration::from_secs(3600)), &runs);
    let other = counting_app(tier(store().await, Duration::from_millis(100)), &runs);
    let (k, u) = (key(), user());
    let k = k.as_str();
    let body = r#"{"item":"book"}"#;
    // Sends until the store answers (a store reconnecting answers 503 meanwhile).
    let answer = |app: axum::Router| async move {
        for _ in 0..100 {
            let (status, _, answer) = send(&app, request("/orders", k, u, body)).await;
            if status == StatusCode::CREATED {
                return answer;
            }
            assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("the store never answered");
    };

    let first = answer(checking.clone()).await;
    assert_eq!(
        answer(never.clone()).await,
        first,
        "both tiers now hold the first answer"
    );
    assert_eq!(runs.orders.load(Ordering::SeqCst), 1);

    server.kill().unwrap();
    server.start_server().unwrap();
    // The record is gone with Redis' data: another instance runs the request again (what a
    // loss costs) and the store now holds its answer.
    let second = answer(other).await;
    assert_eq!(runs.orders.load(Ordering::SeqCst), 2);
    assert_ne!(second, first);

    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(
        answer(checking).await,
        second,
        "the checking tier must answer what the store holds"
    );
    assert_eq!(
        answer(never).await,
        first,
        "a tier that never checks keeps the lost answer (the hazard the check removes)"
    );
    assert_eq!(
        runs.orders.load(Ordering::SeqCst),
        2,
        "nothing ran a third time"
    );
}
