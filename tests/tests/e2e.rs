//! Every scenario on every store, against the real servers.
#![allow(clippy::unwrap_used)]

use axum::http::StatusCode;
use idempotency_e2e::{Backend, Namespace, Runs, counting_app, key, request, send, user};
use std::sync::atomic::Ordering;
use std::time::Duration;
use tower::ServiceExt;

/// 64 identical requests at once: the handler runs once; every answer is the stored 201 or 409.
async fn concurrent_identical_requests_run_once(backend: Backend) {
    let ns = Namespace::new(backend);
    let runs = Runs::default();
    let app = counting_app(ns.store().await, &runs);
    let (k, u) = (key(), user());
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(64));
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let (app, k, barrier) = (app.clone(), k.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                send(&app, request("/orders", &k, u, r#"{"item":"book"}"#)).await
            })
        })
        .collect();
    let mut created = Vec::new();
    let mut conflicts = 0;
    for task in tasks {
        let (status, _, body) = task.await.unwrap();
        match status {
            StatusCode::CREATED => created.push(body),
            StatusCode::CONFLICT => conflicts += 1,
            other => panic!("unexpected status {other}"),
        }
    }
    assert_eq!(
        runs.orders.load(Ordering::SeqCst),
        1,
        "the side effect ran more than once"
    );
    assert!(!created.is_empty());
    assert!(
        created.iter().all(|b| b == &created[0]),
        "every 201 must carry the same bytes"
    );
    assert_eq!(created.len() + conflicts, 64);
    ns.cleanup().await;
}

/// A retry gets the same status, headers and bytes, marked as a replay; a changed body gets 422.
async fn retry_replays_and_a_changed_body_is_422(backend: Backend) {
    let ns = Namespace::new(backend);
    let runs = Runs::default();
    let app = counting_app(ns.store().await, &runs);
    let (k, u) = (key(), user());
    let first = send(&app, request("/orders", &k, u, r#"{"item":"book"}"#)).await;
    let retry = send(&app, request("/orders", &k, u, r#"{ "item" : "book" }"#)).await;
    assert_eq!(runs.orders.load(Ordering::SeqCst), 1);
    assert_eq!(
        (first.0, retry.0),
        (StatusCode::CREATED, StatusCode::CREATED)
    );
    assert_eq!(retry.2, first.2);
    assert_eq!(retry.1.get("location"), first.1.get("location"));
    assert_eq!(retry.1.get("idempotent-replayed").unwrap(), "true");
    let changed = send(&app, request("/orders", &k, u, r#"{"item":"pen"}"#)).await;
    assert_eq!(changed.0, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(runs.orders.load(Ordering::SeqCst), 1);
    ns.cleanup().await;
}

/// Another user sending the same key runs separately and never sees the first response.
async fn another_user_with_the_same_key_runs_separately(backend: Backend) {
    let ns = Namespace::new(backend);
    let runs = Runs::default();
    let app = counting_app(ns.store().await, &runs);
    let k = key();
    let alice = send(&app, request("/orders", &k, user(), r#"{"item":"book"}"#)).await;
    let bob = send(&app, request("/orders", &k, user(), r#"{"item":"book"}"#)).await;
    assert_eq!(runs.orders.load(Ordering::SeqCst), 2);
    assert_eq!(bob.0, StatusCode::CREATED);
    assert!(bob.1.get("idempotent-replayed").is_none());
    assert_ne!(alice.2, bob.2);
    ns.cleanup().await;
}

/// A 5xx releases the key: the retry runs the handler again.
async fn a_server_error_releases_the_key(backend: Backend) {
    let ns = Namespace::new(backend);
    let runs = Runs::default();
    let app = counting_app(ns.store().await, &runs);
    let (k, u) = (key(), user());
    assert_eq!(
        send(&app, request("/flaky", &k, u, "")).await.0,
        StatusCode::SERVICE_UNAVAILABLE
    );
    let retry = send(&app, request("/flaky", &k, u, "")).await;
    assert_eq!(retry.0, StatusCode::CREATED);
    assert_eq!(retry.2, "up");
    assert_eq!(runs.flaky.load(Ordering::SeqCst), 2);
    ns.cleanup().await;
}

/// A panicking handler answers 500 and releases the key; the retry runs.
async fn a_panic_releases_the_key(backend: Backend) {
    let ns = Namespace::new(backend);
    let runs = Runs::default();
    let app = counting_app(ns.store().await, &runs);
    let (k, u) = (key(), user());
    assert_eq!(
        send(&app, request("/panics", &k, u, "")).await.0,
        StatusCode::INTERNAL_SERVER_ERROR
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let (status, _, body) = send(&app, request("/panics", &k, u, "")).await;
        if status == StatusCode::CONFLICT && tokio::time::Instant::now() < deadline {
            // The release runs in the background right after the panic.
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        }
        assert_eq!(status, StatusCode::CREATED);
        assert_eq!(body, "second run");
        break;
    }
    assert_eq!(runs.panics.load(Ordering::SeqCst), 2);
    ns.cleanup().await;
}

/// A client that disconnects does not stop the handler; its retry replays the stored response.
async fn a_client_disconnect_does_not_cut_the_handler(backend: Backend) {
    let ns = Namespace::new(backend);
    let runs = Runs::default();
    let app = counting_app(ns.store().await, &runs);
    let (k, u) = (key(), user());
    let gave_up = tokio::time::timeout(
        Duration::from_millis(50),
        app.clone().oneshot(request("/slow", &k, u, "")),
    )
    .await;
    assert!(gave_up.is_err());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while runs.slow.load(Ordering::SeqCst) == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the handler never finished"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The completion is stored right after the handler returns.
    let (status, headers, body) = loop {
        let answer = send(&app, request("/slow", &k, u, "")).await;
        if answer.0 != StatusCode::CONFLICT || tokio::time::Instant::now() > deadline {
            break answer;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(body, "slow done");
    assert_eq!(headers.get("idempotent-replayed").unwrap(), "true");
    assert_eq!(runs.slow.load(Ordering::SeqCst), 1);
    ns.cleanup().await;
}

/// Two instances of a service (two layers, two store connections) on one namespace: with a
/// shared store they behave as one; with memory stores each runs the request (the ADR's reason
/// to reject application memory).
async fn two_instances(backend: Backend) {
    let ns = Namespace::new(backend);
    let runs = Runs::default();
    let instance_a = counting_app(ns.store().await, &runs);
    let instance_b = counting_app(ns.store().await, &runs);
    let (k, u) = (key(), user());
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(32));
    let tasks: Vec<_> = (0..32)
        .map(|i| {
            let app = if i % 2 == 0 {
                instance_a.clone()
            } else {
                instance_b.clone()
            };
            let (k, barrier) = (k.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                send(&app, request("/orders", &k, u, r#"{"item":"book"}"#))
                    .await
                    .0
            })
        })
        .collect();
    for task in tasks {
        let status = task.await.unwrap();
        assert!(
            matches!(status, StatusCode::CREATED | StatusCode::CONFLICT),
            "{status}"
        );
    }
    // Sequential retries to each instance afterwards.
    let a = send(&instance_a, request("/orders", &k, u, r#"{"item":"book"}"#)).await;
    let b = send(&instance_b, request("/orders", &k, u, r#"{"item":"book"}"#)).await;
    let executions = runs.orders.load(Ordering::SeqCst);
    if backend == Backend::Memory {
        assert_eq!(
            executions, 2,
            "two memory stores are two key spaces: the request ran on each instance"
        );
        assert_ne!(a.2, b.2, "each instance replays its own execution");
    } else {
        assert_eq!(
            executions, 1,
            "a shared store makes two instances behave as one"
        );
        assert_eq!(a.2, b.2, "both instances replay the one execution");
    }
    ns.cleanup().await;
}

macro_rules! e2e_suite {
    ($backend:expr => $($scenario:ident)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn $scenario() {
            super::$scenario($backend).await;
        }
    )*};
}

macro_rules! per_store {
    ($($module:ident: $backend:expr),*) => {$(
        mod $module {
            use super::Backend;
            e2e_suite!($backend =>
                concurrent_identical_requests_run_once
                retry_replays_and_a_changed_body_is_422
                another_user_with_the_same_key_runs_separately
                a_server_error_releases_the_key
                a_panic_releases_the_key
                a_client_disconnect_does_not_cut_the_handler
                two_instances
            );
        }
    )*};
}

per_store!(memory: Backend::Memory, postgres: Backend::Postgres, redis: Backend::Redis);
