//! Faults through the layer, each on its own throwaway servers: restarts and crashes of
//! PostgreSQL and Redis mid-traffic, a hung server, and a handler slower than its lease.
#![allow(clippy::unwrap_used)]

use axum::http::StatusCode;
use idempotency::{IdempotencyStore, PostgresStore, RedisStore, TableMode};
use idempotency_e2e::{
    Backend, Namespace, Runs, counting_app_with, key, request, send, send_until_done, user,
};
use idempotency_testkit::{TempPostgres, TempRedis};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

const PER_REQUEST: Duration = Duration::from_secs(10);

/// Runs `logical` requests (distinct keys) from `clients` persistent clients against `app`;
/// returns every client's attempts.
async fn traffic(
    app: &axum::Router,
    logical: usize,
    clients: usize,
) -> Vec<idempotency_e2e::Attempts> {
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let keys: Arc<Vec<(String, idempotency_e2e::User)>> =
        Arc::new((0..logical).map(|_| (key(), user())).collect());
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (app, next, keys) = (app.clone(), next.clone(), keys.clone());
        tasks.push(tokio::spawn(async move {
            let mut all = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                if i >= keys.len() {
                    break;
                }
                let (k, u) = keys[i].clone();
                let body = format!(r#"{{"n":{i}}}"#);
                all.push(
                    send_until_done(
                        &app,
                        || request("/orders", &k, u, &body),
                        Duration::from_secs(60),
                        PER_REQUEST,
                    )
                    .await,
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            all
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all
}

fn assert_served_once_each(all: &[idempotency_e2e::Attempts], runs: &Runs, logical: usize) {
    assert_eq!(all.len(), logical);
    for a in all {
        assert!(
            a.body.is_some(),
            "a request never succeeded: {:?}",
            a.statuses
        );
        assert!(
            a.retry_after_always_present,
            "a 503/409 came without Retry-After: {:?}",
            a.statuses
        );
        assert!(a.slowest < PER_REQUEST);
    }
    assert_eq!(
        runs.orders.load(Ordering::SeqCst),
        logical,
        "a request ran twice (or never)"
    );
}

/// Runs 240 logical requests from 4 clients through a layer on `store`, with `stop` called
/// 400 ms in and `start` 1.5 s later; checks that the outage was seen as 503s and that every
/// request was served exactly once.
async fn outage_mid_traffic(
    store: Arc<dyn IdempotencyStore>,
    stop: impl FnOnce(),
    start: impl FnOnce(),
) {
    let runs = Runs::default();
    let app = counting_app_with(store, &runs, |b| b.store_timeout(Duration::from_secs(2)));
    let traffic = tokio::spawn({
        let app = app.clone();
        async move { traffic(&app, 240, 4).await }
    });
    tokio::time::sleep(Duration::from_millis(400)).await;
    stop();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    start();
    let all = traffic.await.unwrap();
    let unavailable = all
        .iter()
        .flat_map(|a| &a.statuses)
        .filter(|s| **s == StatusCode::SERVICE_UNAVAILABLE)
        .count();
    assert!(unavailable > 0, "the outage must have been seen as 503s");
    assert_served_once_each(&all, &runs, 240);
}

/// A handler slower than its lease, with the heartbeat turned off: the retry takes the key over
/// (the documented hazard: the side effect runs twice), the first run's late completion is
/// refused, and only the second run's response is ever replayed.
async fn lease_steal(backend: Backend) {
    let ns = Namespace::new(backend);
    let runs = Runs::default();
    let app = counting_app_with(ns.store().await, &runs, |b| {
        b.lease(Duration::from_millis(600)).heartbeat(false)
    });
    let (k, u) = (key(), user());
    let first = tokio::spawn({
        let (app, k) = (app.clone(), k.clone());
        async move { send(&app, request("/slow-first", &k, u, "")).await }
    });
    tokio::time::sleep(Duration::from_millis(1000)).await;
    // The first request is still running, but its lease ran out: this one takes the key over.
    let second = send(&app, request("/slow-first", &k, u, "")).await;
    let first = first.await.unwrap();
    // The first run's response is not what the key stands for (its completion is refused by
    // the fence): its client is told to retry, and gets the second run's answer.
    assert_eq!(
        (first.0, second.0),
        (StatusCode::CONFLICT, StatusCode::CREATED)
    );
    assert_eq!(
        runs.slow_first.load(Ordering::SeqCst),
        2,
        "a takeover runs the handler again"
    );
    assert_ne!(first.2.as_ref(), &b"run 1"[..]);
    assert_eq!(second.2.as_ref(), &b"run 2"[..]);
    for _ in 0..3 {
        let (status, headers, body) = send(&app, request("/slow-first", &k, u, "")).await;
        assert_eq!(status, StatusCode::CREATED);
        assert_eq!(headers.get("idempotent-replayed").unwrap(), "true");
        assert_eq!(
            body, second.2,
            "only the run that held the lease is replayed"
        );
    }
    ns.cleanup().await;
}

/// The same slow handler with the heartbeat on (the default): its lease is extended while it
/// runs, the retry is told it is in flight, and the handler runs once.
async fn heartbeat_prevents_the_steal(backend: Backend) {
    let ns = Namespace::new(backend);
    let runs = Runs::default();
    let app = counting_app_with(ns.store().await, &runs, |b| {
        b.lease(Duration::from_millis(1000))
            .store_timeout(Duration::from_millis(300))
    });
    let (k, u) = (key(), user());
    let first = tokio::spawn({
        let (app, k) = (app.clone(), k.clone());
        async move { send(&app, request("/slow-first", &k, u, "")).await }
    });
    // Past the first lease's end (1 s), while the handler still runs (2 s).
    tokio::time::sleep(Duration::from_millis(1300)).await;
    let (status, headers, _) = send(&app, request("/slow-first", &k, u, "")).await;
    assert_eq!(
        status,
        StatusCode::CONFLICT,
        "a kept-alive request must not be taken over"
    );
    assert!(headers.contains_key("retry-after"));
    let first = first.await.unwrap();
    assert_eq!(
        (first.0, first.2.as_ref()),
        (StatusCode::CREATED, &b"run 1"[..])
    );
    let (status, headers, body) = send(&app, request("/slow-first", &k, u, "")).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(headers.get("idempotent-replayed").unwrap(), "true");
    assert_eq!(body, "run 1");
    assert_eq!(runs.slow_first.load(Ordering::SeqCst), 1);
    ns.cleanup().await;
}

mod memory {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn heartbeat() {
        heartbeat_prevents_the_steal(Backend::Memory).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn lease_steal() {
        super::lease_steal(Backend::Memory).await;
    }
}

mod postgres {
    use super::*;

    /// PostgreSQL stops (fast shutdown) and starts again in the middle of traffic: 503 with
    /// Retry-After while it is down, no request hangs, every request is served, none runs twice.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn restart_mid_traffic() {
        let pg = TempPostgres::start(&[]).unwrap();
        let store = PostgresStore::builder(pg.url("postgres"))
            .connect_timeout(Duration::from_secs(1))
            .build()
            .await
            .unwrap();
        store.migrate().await.unwrap();
        outage_mid_traffic(
            Arc::new(store.clone()),
            || pg.stop().unwrap(),
            || pg.start_server().unwrap(),
        )
        .await;
        // A fast shutdown is clean: the UNLOGGED table kept its rows, nothing was lost.
        assert_eq!(store.state_losses(), 0);
    }

    /// PostgreSQL crashes (immediate shutdown) with UNLOGGED: the store recovers, counts the loss,
    /// and, exactly as documented, retries of requests completed before the crash run again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn crash_loses_unlogged_records_and_says_so() {
        let pg = TempPostgres::start(&[]).unwrap();
        let store = PostgresStore::builder(pg.url("postgres"))
            .table_mode(TableMode::Unlogged)
            .build()
            .await
            .unwrap();
        store.migrate().await.unwrap();
        let runs = Runs::default();
        let app = counting_app_with(
            Arc::new(store.clone()) as Arc<dyn IdempotencyStore>,
            &runs,
            |b| b,
        );
        let requests: Vec<_> = (0..20).map(|_| (key(), user())).collect();
        for (k, u) in &requests {
            assert_eq!(
                send(&app, request("/orders", k, *u, "{}")).await.0,
                StatusCode::CREATED
            );
        }
        // Before the crash, retries replay.
        for (k, u) in &requests {
            let (status, headers, _) = send(&app, request("/orders", k, *u, "{}")).await;
            assert_eq!(status, StatusCode::CREATED);
            assert_eq!(headers.get("idempotent-replayed").unwrap(), "true");
        }
        assert_eq!(runs.orders.load(Ordering::SeqCst), 20);
        pg.crash().unwrap();
        pg.start_server().unwrap();
        for (k, u) in &requests {
            let attempts = send_until_done(
                &app,
                || request("/orders", k, *u, "{}"),
                Duration::from_secs(20),
                PER_REQUEST,
            )
            .await;
            assert!(attempts.body.is_some(), "{:?}", attempts.statuses);
        }
        assert_eq!(store.state_losses(), 1, "the loss must be counted once");
        assert_eq!(
            runs.orders.load(Ordering::SeqCst),
            40,
            "documented: every completed key ran again after the crash"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn heartbeat() {
        heartbeat_prevents_the_steal(Backend::Postgres).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn lease_steal() {
        super::lease_steal(Backend::Postgres).await;
    }
}

mod redis {
    use super::*;

    /// Redis is killed and started again (persistence off) mid-traffic: 503 while it is down, every
    /// request served once, and the loss of Redis' data is counted.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn restart_mid_traffic() {
        let server = TempRedis::start(&[]).unwrap();
        let store = RedisStore::builder(server.url())
            .connect_timeout(Duration::from_secs(1))
            .response_timeout(Duration::from_secs(1))
            .build()
            .await
            .unwrap();
        let server = std::sync::Mutex::new(server);
        outage_mid_traffic(
            Arc::new(store.clone()),
            || server.lock().unwrap().kill().unwrap(),
            || server.lock().unwrap().start_server().unwrap(),
        )
        .await;
        assert_eq!(
            store.state_losses(),
            1,
            "Redis came back empty: counted once"
        );
    }

    /// A hung store (Redis frozen with SIGSTOP) is bounded by the layer's store timeout: 503 with
    /// Retry-After, never a stuck request; after it thaws, requests run again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_hung_store_is_bounded_by_the_store_timeout() {
        let server = TempRedis::start(&[]).unwrap();
        let store = RedisStore::builder(server.url())
            .response_timeout(Duration::from_secs(30))
            .build()
            .await
            .unwrap();
        let runs = Runs::default();
        let app = counting_app_with(Arc::new(store) as Arc<dyn IdempotencyStore>, &runs, |b| {
            b.store_timeout(Duration::from_millis(500))
        });
        server.pause().unwrap();
        let started = std::time::Instant::now();
        let (status, headers, _) = send(&app, request("/orders", &key(), user(), "{}")).await;
        let took = started.elapsed();
        server.resume().unwrap();
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(headers.contains_key("retry-after"));
        assert!(
            took < Duration::from_secs(3),
            "the hung store held the request for {took:?}"
        );
        assert_eq!(runs.orders.load(Ordering::SeqCst), 0);
        let attempts = send_until_done(
            &app,
            || {
                request(
                    "/orders",
                    "8e03978e-40d5-43e8-bc93-6894a57f9324",
                    user(),
                    "{}",
                )
            },
            Duration::from_secs(10),
            PER_REQUEST,
        )
        .await;
        assert!(attempts.body.is_some());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn heartbeat() {
        heartbeat_prevents_the_steal(Backend::Redis).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn lease_steal() {
        super::lease_steal(Backend::Redis).await;
    }
}
