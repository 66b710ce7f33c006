//! Hostile input over real HTTP (raw bytes on a TCP socket to the demo service), corrupt records
//! planted in the real stores, and one user trying to reach another's keys.
#![allow(clippy::unwrap_used)]

use axum::http::StatusCode;
use bytes::Bytes;
use idempotency::http::HeaderMap;
use idempotency::{
    BodyCanonicalization, Fingerprint, IdempotencyKey, IdempotencyStore, KeyFormat, LeaseToken,
    PostgresStore, RedisStore, Scope, StoreError, StoredResponse,
};
use idempotency_e2e::{Backend, Namespace, Runs, counting_app, key, request, send, user};
use idempotency_testkit::env::{postgres_url, redis_url};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const USER: &str = "6f1c2e0a-5d4b-4c3e-9a8f-1b2c3d4e5f60";

async fn demo() -> SocketAddr {
    let app = idempotency_demo::build_app("memory").await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

/// Writes raw bytes, optionally stops writing without closing, and returns the status code
/// of the answer (0 if the server closed without one).
async fn raw(addr: SocketAddr, bytes: &[u8]) -> u16 {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    // The server may answer (413) and close before reading everything: the rest of the write
    // then fails, and the answer is still there to read.
    let _ = stream.write_all(bytes).await;
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer)).await;
    let text = String::from_utf8_lossy(&answer);
    text.split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

fn post(key: &[u8], body: &[u8]) -> Vec<u8> {
    let mut r = format!(
        "POST /tasks HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {USER}\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: {}\r\nIdempotency-Key: ",
        body.len()
    )
    .into_bytes();
    r.extend_from_slice(key);
    r.extend_from_slice(b"\r\n\r\n");
    r.extend_from_slice(body);
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn malformed_keys_on_the_wire_are_refused_and_nothing_runs() {
    let addr = demo().await;
    let body = br#"{"title":"x"}"#;
    // Too long, not a UUID, invalid UTF-8, NUL-free control bytes, a quote never closed.
    assert_eq!(raw(addr, &post(&[b'a'; 300], body)).await, 400);
    assert_eq!(
        raw(addr, &post(b"robert'); DROP TABLE tasks;--", body)).await,
        400
    );
    assert_eq!(raw(addr, &post(b"\xff\xfe\xfd", body)).await, 400);
    assert_eq!(
        raw(addr, &post(b"\"8e03978e-40d5-43e8-bc93-6894a57f9324", body)).await,
        400
    );
    assert_eq!(raw(addr, &post(b"abc\x01def", body)).await, 400);
    // A bare CR or an obs-fold inside the header is a framing error for the HTTP server.
    assert_eq!(raw(addr, &post(b"abc\rX-Injected: 1", body)).await, 400);
    let mut folded = post(b"8e03978e-40d5-43e8-bc93-6894a57f9324", body);
    let at = folded.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    folded.splice(at..at, b"\r\n folded".iter().copied());
    assert_eq!(raw(addr, &folded).await, 400);
    // A header block far over the server's limit.
    let huge = vec![b'a'; 200 * 1024];
    let status = raw(addr, &post(&huge, body)).await;
    assert!(matches!(status, 400 | 431 | 0), "got {status}");
    // None of it created a task.
    let listing = format!(
        "GET /tasks HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {USER}\r\nConnection: close\r\n\r\n"
    );
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(listing.as_bytes()).await.unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    assert!(answer.ends_with("[]"), "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bodies_over_the_limit_duplicate_fields_and_truncated_bodies() {
    let addr = demo().await;
    // Over the 1 MiB limit: 413, whatever the declared length says.
    let big = vec![b' '; 2 * 1024 * 1024];
    assert_eq!(
        raw(addr, &post(b"1b4e28ba-2fa1-4d3b-a3f5-ef19b5a7633b", &big)).await,
        413
    );
    // JSON with a duplicate field: the handler refuses it (422), and the answer is replayed.
    let dup = br#"{"title":"a","title":"b"}"#;
    let k = b"2c5ea4c0-4067-41c3-9a2b-3fdd1f4a7f3e";
    assert_eq!(raw(addr, &post(k, dup)).await, 422);
    assert_eq!(raw(addr, &post(k, dup)).await, 422);
    // A body that stops early (the client promised 100 bytes, sent 10, and left).
    let k = b"3d6fb5d1-5178-42d4-8b3c-40ee2a5b8a4f";
    let mut partial = post(k, &[b'{'; 100]);
    partial.truncate(partial.len() - 90);
    {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream.write_all(&partial).await.unwrap();
        stream.shutdown().await.unwrap();
        let mut rest = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut rest)).await;
    }
    // The key was not claimed by the broken request: a proper request with it runs.
    assert_eq!(raw(addr, &post(k, br#"{"title":"after"}"#)).await, 201);
}

/// User B cannot read, replay, block or free user A's key, even while A's request runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn another_user_cannot_block_or_read_a_running_key() {
    for backend in [Backend::Memory, Backend::Postgres, Backend::Redis] {
        let ns = Namespace::new(backend);
        let runs = Runs::default();
        let app = counting_app(ns.store().await, &runs);
        let (k, alice, bob) = (key(), user(), user());
        let running = tokio::spawn({
            let (app, k) = (app.clone(), k.clone());
            async move { send(&app, request("/slow", &k, alice, "")).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        let (status, headers, body) = send(&app, request("/slow", &k, bob, "")).await;
        assert_eq!(
            status,
            StatusCode::CREATED,
            "{backend:?}: bob must not be blocked by alice"
        );
        assert!(headers.get("idempotent-replayed").is_none());
        assert_eq!(body, "slow done");
        assert_eq!(running.await.unwrap().0, StatusCode::CREATED);
        assert_eq!(runs.slow.load(Ordering::SeqCst), 2);
        ns.cleanup().await;
    }
}

fn fp() -> Fingerprint {
    Fingerprint::of_request("POST", "/tasks", b"{}", BodyCanonicalization::Raw)
}

async fn completed(store: &dyn IdempotencyStore, scope: &Scope, key: &IdempotencyKey) {
    let token = LeaseToken::new();
    store
        .claim(scope, key, &fp(), token, Duration::from_secs(60))
        .await
        .unwrap();
    let response = StoredResponse::new(
        StatusCode::CREATED,
        HeaderMap::new(),
        Bytes::from_static(b"ok"),
    );
    let _ = store
        .complete(scope, key, token, &response, Duration::from_secs(600))
        .await
        .unwrap();
}

fn assert_corrupt(result: Result<impl std::fmt::Debug, StoreError>) {
    match result {
        Err(e @ StoreError::Corrupt { .. }) => assert!(!e.is_retryable()),
        other => {
            panic!("a corrupt record must be a Corrupt error, never a value or absent: {other:?}")
        }
    }
}

/// Bytes damaged in the store are a typed error on read and on claim, never a panic, never
/// "absent" (which would let the request run again).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn corrupt_records_are_errors_not_panics() {
    let scope = Scope::new("victim").unwrap();
    let k = IdempotencyKey::parse(b"corrupt-1", KeyFormat::opaque()).unwrap();

    let schema = format!("idem_t_{}", uuid::Uuid::new_v4().simple());
    let pg = PostgresStore::builder(postgres_url())
        .schema(&schema)
        .build()
        .await
        .unwrap();
    pg.migrate().await.unwrap();
    completed(&pg, &scope, &k).await;
    let client = pg.pool().get().await.unwrap();
    client
        .execute(
            &format!(
                "UPDATE {} SET response = '\\xdeadbeef'::bytea WHERE key = 'corrupt-1'",
                pg.table_name()
            ),
            &[],
        )
        .await
        .unwrap();
    assert_corrupt(pg.get(&scope, &k).await);
    assert_corrupt(
        pg.claim(&scope, &k, &fp(), LeaseToken::new(), Duration::from_secs(1))
            .await,
    );
    idempotency_testkit::drop_test_schema(&schema).await;

    let prefix = format!("idem-t:{}:", uuid::Uuid::new_v4().simple());
    let redis = RedisStore::builder(redis_url())
        .key_prefix(&prefix)
        .build()
        .await
        .unwrap();
    completed(&redis, &scope, &k).await;
    let client = idempotency::redis::redis::Client::open(redis_url()).unwrap();
    let mut con = client.get_multiplexed_async_connection().await.unwrap();
    let _: () = idempotency::redis::redis::cmd("HSET")
        .arg(redis.record_key(&scope, &k))
        .arg("resp")
        .arg(&b"\xde\xad\xbe\xef"[..])
        .query_async(&mut con)
        .await
        .unwrap();
    assert_corrupt(redis.get(&scope, &k).await);
    assert_corrupt(
        redis
            .claim(&scope, &k, &fp(), LeaseToken::new(), Duration::from_secs(1))
            .await,
    );
}

/// A body trickled in slowly, in small pieces, is read whole and runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slowly_sent_body_is_read_whole() {
    let addr = demo().await;
    let body = br#"{"title":"slow but complete"}"#;
    let request = post(b"4e7a06e2-6289-43e5-9c4d-51ff3b6c9b50", body);
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    for piece in request.chunks(7) {
        stream.write_all(piece).await.unwrap();
        tokio::time::sleep(Duration::from_millis(15)).await;
    }
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer))
        .await
        .unwrap()
        .unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 201"), "{answer}");
    assert!(answer.contains("slow but complete"));
}
