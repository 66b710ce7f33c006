//! Redis at `maxmemory` under `noeviction`, through HTTP on a throwaway server: a new key is
//! refused with `503` + `Retry-After` and its handler does not run; a key completed before keeps
//! replaying its first response.
#![allow(clippy::unwrap_used)]

use axum::http::StatusCode;
use bytes::Bytes;
use idempotency::http::HeaderMap;
use idempotency::store::ClaimOutcome;
use idempotency::{
    BodyCanonicalization, Fingerprint, IdempotencyKey, IdempotencyStore, KeyFormat, LeaseToken,
    RedisStore, Scope, StoredResponse,
};
use idempotency_e2e::{Runs, counting_app, key, request, send, user};
use idempotency_testkit::TempRedis;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// Fills Redis with 32 KiB records under another scope until it refuses a claim; returns the
/// number stored.
async fn fill(store: &RedisStore) -> usize {
    let scope = Scope::new("filler").unwrap();
    let fp = Fingerprint::of_request("POST", "/", b"", BodyCanonicalization::Raw);
    let body = Bytes::from(vec![b'x'; 32 * 1024]);
    let hour = Duration::from_secs(3600);
    for i in 0.. {
        let key =
            IdempotencyKey::parse(format!("fill-{i}").as_bytes(), KeyFormat::opaque()).unwrap();
        let token = LeaseToken::new();
        match store.claim(&scope, &key, &fp, token, hour).await {
            Ok(ClaimOutcome::Claimed) => {}
            _ => return i,
        }
        let response = StoredResponse::new(StatusCode::OK, HeaderMap::new(), body.clone());
        if store
            .complete(&scope, &key, token, &response, hour)
            .await
            .is_err()
        {
            return i;
        }
    }
    unreachable!("the loop returns when Redis is full")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_at_maxmemory_refuses_new_keys_and_keeps_replaying() {
    let server = TempRedis::start(&["--maxmemory", "4mb", "--maxmemory-policy", "noeviction"])
        .unwrap_or_else(|e| panic!("could not start a throwaway redis-server: {e}"));
    let store = RedisStore::builder(server.url())
        .watch_interval(None)
        .build()
        .await
        .unwrap();
    let runs = Runs::default();
    let app = counting_app(Arc::new(store.clone()), &runs);
    let (done, u) = (key(), user());
    let body = r#"{"item":"book"}"#;
    let (status, _, first) = send(&app, request("/orders", &done, u, body)).await;
    assert_eq!(status, StatusCode::CREATED);

    let stored = fill(&store).await;
    assert!(
        stored < 128,
        "4 MiB cannot hold 128 records of 32 KiB ({stored} went in)"
    );

    let (status, headers, _) = send(&app, request("/orders", &key(), u, body)).await;
    assert_eq!(
        status,
        StatusCode::SERVICE_UNAVAILABLE,
        "a new key at maxmemory"
    );
    assert!(headers.contains_key("retry-after"));
    assert_eq!(
        runs.orders.load(Ordering::SeqCst),
        1,
        "the refused request ran"
    );

    for _ in 0..3 {
        let (status, headers, replay) = send(&app, request("/orders", &done, u, body)).await;
        assert_eq!((status, &replay), (StatusCode::CREATED, &first));
        assert_eq!(headers["idempotent-replayed"], "true");
    }
    assert_eq!(
        runs.orders.load(Ordering::SeqCst),
        1,
        "a replay ran the handler"
    );
}
