//! The layer's HTTP behaviour, row by row of the table in the crate docs, on the memory store
//! (and on stores that fail or hang, for the 503 rows).
#![allow(clippy::unwrap_used)]

use async_trait::async_trait;
use axum::Router;
use axum::body::Body;
use axum::http::{HeaderValue, Method, Request, StatusCode, header};
use axum::routing::{get, post};
use bytes::Bytes;
use http_body_util::BodyExt;
use idempotency_core::store::{ClaimOutcome, FenceOutcome, Record};
use idempotency_core::{
    Fingerprint, IdempotencyKey, IdempotencyStore, LeaseToken, Scope, StoreError, StoredResponse,
};
use idempotency_memory::MemoryStore;
use idempotency_tower::{IdempotencyLayer, Profile};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tower::ServiceExt;

const KEY: &str = "8e03978e-40d5-43e8-bc93-6894a57f9324";

#[derive(Clone)]
struct User(&'static str);

fn app_with<S: IdempotencyStore + 'static>(
    configure: impl FnOnce(
        idempotency_tower::IdempotencyLayerBuilder<S, idempotency_tower::ScopeSet>,
    )
        -> idempotency_tower::IdempotencyLayerBuilder<S, idempotency_tower::ScopeSet>,
    store: S,
    runs: Arc<AtomicUsize>,
) -> Router {
    let layer = configure(IdempotencyLayer::builder(store).scope_with(|req| {
        req.extensions
            .get::<User>()
            .map(|u| Scope::new(u.0).unwrap())
    }))
    .build()
    .expect("valid idempotency layer settings");
    let r = runs.clone();
    Router::new()
        .route(
            "/tasks",
            post(move |body: Bytes| {
                let runs = r.clone();
                async move {
                    let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
                    let mut response = axum::response::Response::new(Body::from(format!(
                        "{{\"run\":{n},\"echo\":{}}}",
                        String::from_utf8_lossy(&body)
                    )));
                    *response.status_mut() = StatusCode::CREATED;
                    let h = response.headers_mut();
                    h.insert(
                        header::CONTENT_TYPE,
                        HeaderValue::from_static("application/json"),
                    );
                    h.insert(header::LOCATION, HeaderValue::from_static("/tasks/1"));
                    h.append("x-multi", HeaderValue::from_static("a"));
                    h.append("x-multi", HeaderValue::from_static("b"));
                    h.insert(header::SET_COOKIE, HeaderValue::from_static("s=secret"));
                    response
                }
            })
            .get(|| async { "listing" }),
        )
        .route(
            "/slow",
            post({
                let runs = runs.clone();
                move || {
                    let runs = runs.clone();
                    async move {
                        tokio::time::sleep(Duration::from_millis(300)).await;
                        runs.fetch_add(1, Ordering::SeqCst);
                        (StatusCode::CREATED, "slow done")
                    }
                }
            }),
        )
        .route(
            "/fail",
            post({
                let runs = runs.clone();
                move || {
                    let runs = runs.clone();
                    async move {
                        let n = runs.fetch_add(1, Ordering::SeqCst);
                        if n == 0 {
                            (StatusCode::SERVICE_UNAVAILABLE, "try later")
                        } else {
                            (StatusCode::CREATED, "worked")
                        }
                    }
                }
            }),
        )
        .route(
            "/panic",
            post({
                let runs = runs.clone();
                move || {
                    let runs = runs.clone();
                    async move {
                        if runs.fetch_add(1, Ordering::SeqCst) == 0 {
                            panic!("handler panics on its first run");
                        }
                        (StatusCode::CREATED, "second run")
                    }
                }
            }),
        )
        .route("/big", post(|| async { vec![7u8; 64 * 1024] }))
        .route("/health", get(|| async { "ok" }))
        .layer(layer)
}

fn app(runs: Arc<AtomicUsize>) -> Router {
    app_with(|b| b, MemoryStore::default(), runs)
}

fn request(
    method: Method,
    uri: &str,
    key: Option<&str>,
    user: Option<&'static str>,
    body: &str,
) -> Request<Body> {
    let mut builder = Request::builder().method(method).uri(uri);
    if let Some(key) = key {
        builder = builder.header("idempotency-key", key);
    }
    let mut req = builder.body(Body::from(body.to_owned())).unwrap();
    if let Some(user) = user {
        req.extensions_mut().insert(User(user));
    }
    req
}

async fn send(app: &Router, req: Request<Body>) -> (StatusCode, axum::http::HeaderMap, Bytes) {
    let response = app.clone().oneshot(req).await.unwrap();
    let (parts, body) = response.into_parts();
    (
        parts.status,
        parts.headers,
        body.collect().await.unwrap().to_bytes(),
    )
}

fn problem(body: &Bytes) -> serde_json::Value {
    serde_json::from_slice(body).unwrap()
}

#[tokio::test]
async fn first_request_runs_and_the_retry_replays_byte_for_byte() {
    let runs = Arc::new(AtomicUsize::new(0));
    let app = app(runs.clone());
    let first = send(
        &app,
        request(
            Method::POST,
            "/tasks",
            Some(KEY),
            Some("alice"),
            r#"{"title":"x"}"#,
        ),
    )
    .await;
    assert_eq!(first.0, StatusCode::CREATED);
    assert!(first.1.get("idempotent-replayed").is_none());
    // The client re-serialises the same JSON on retry: canonical fingerprints still match.
    let retry = send(
        &app,
        request(
            Method::POST,
            "/tasks",
            Some(&format!("\"{KEY}\"")),
            Some("alice"),
            "{ \"title\" : \"x\" }",
        ),
    )
    .await;
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the retry must not run the handler"
    );
    assert_eq!(retry.0, StatusCode::CREATED);
    assert_eq!(
        retry.2, first.2,
        "the replayed body must be byte for byte the first"
    );
    assert_eq!(retry.1.get("idempotent-replayed").unwrap(), "true");
    assert_eq!(retry.1.get(header::LOCATION).unwrap(), "/tasks/1");
    assert_eq!(
        retry.1.get(header::CONTENT_TYPE).unwrap(),
        "application/json"
    );
    let multi: Vec<_> = retry.1.get_all("x-multi").iter().collect();
    assert_eq!(multi, ["a", "b"]);
    assert!(
        retry.1.get(header::SET_COOKIE).is_none(),
        "Set-Cookie is never replayed"
    );
}

#[tokio::test]
async fn a_replay_says_when_its_key_was_first_answered_and_when_it_expires() {
    let runs = Arc::new(AtomicUsize::new(0));
    let retention = Duration::from_secs(3_600);
    let app = app_with(
        |b| b.retention(retention),
        MemoryStore::default(),
        runs.clone(),
    );
    let before = std::time::SystemTime::now();
    let first = send(
        &app,
        request(Method::POST, "/tasks", Some(KEY), Some("alice"), "{}"),
    )
    .await;
    let after = std::time::SystemTime::now();
    assert_eq!(first.0, StatusCode::CREATED);
    assert!(first.1.get("idempotency-original-date").is_none());
    assert!(first.1.get("idempotency-key-expires").is_none());
    // Two seconds on, so a replay that gave its own time as the first answer's fails below.
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    let retry = send(
        &app,
        request(Method::POST, "/tasks", Some(KEY), Some("alice"), "{}"),
    )
    .await;
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(retry.1.get("idempotent-replayed").unwrap(), "true");
    let date = |name: &str| {
        httpdate::parse_http_date(retry.1.get(name).unwrap().to_str().unwrap()).unwrap()
    };
    let second = Duration::from_secs(1);
    let original = date("idempotency-original-date");
    // HTTP-dates are to the second (truncated), and the first answer is derived from the
    // record's time left, read two seconds later.
    assert!(
        original + second >= before && original <= after + second,
        "first answered at {original:?}, between {before:?} and {after:?}"
    );
    let expires = date("idempotency-key-expires");
    assert!(
        expires + second >= before + retention && expires <= after + retention + second,
        "the key expires at {expires:?}, a retention after the first answer"
    );
}

#[tokio::test]
async fn methods_not_covered_pass_through_untouched() {
    let runs = Arc::new(AtomicUsize::new(0));
    let app = app(runs);
    let (status, headers, body) = send(
        &app,
        request(Method::GET, "/tasks", Some("not-even-a-uuid"), None, ""),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, "listing");
    assert!(headers.get("idempotent-replayed").is_none());
}

#[tokio::test]
async fn missing_malformed_and_repeated_keys_are_400_problems() {
    let app = app(Arc::new(AtomicUsize::new(0)));
    let (status, headers, body) = send(
        &app,
        request(Method::POST, "/tasks", None, Some("alice"), "{}"),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(
        headers.get(header::CONTENT_TYPE).unwrap(),
        "application/problem+json"
    );
    let p = problem(&body);
    assert_eq!(p["type"], "urn:idempotency:problem:key-missing");
    assert_eq!(p["status"], 400);
    let too_long = "a".repeat(256);
    for bad in ["\"unterminated", "two words", "\"\"", too_long.as_str()] {
        let (status, _, body) = send(
            &app,
            request(Method::POST, "/tasks", Some(bad), Some("alice"), "{}"),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}");
        assert_eq!(
            problem(&body)["type"],
            "urn:idempotency:problem:key-invalid"
        );
    }
    // The strict opt-in refuses what is not a UUID v4.
    let strict = app_with(
        |b| b.key_format(idempotency_core::KeyFormat::UuidV4),
        MemoryStore::default(),
        Arc::new(AtomicUsize::new(0)),
    );
    for bad in ["not-a-uuid", "c232ab00-9414-11ec-b3c8-9f68deced846"] {
        let (status, _, body) = send(
            &strict,
            request(Method::POST, "/tasks", Some(bad), Some("alice"), "{}"),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}");
        assert_eq!(
            problem(&body)["type"],
            "urn:idempotency:problem:key-invalid"
        );
    }
    let mut req = request(Method::POST, "/tasks", Some(KEY), Some("alice"), "{}");
    req.headers_mut()
        .append("idempotency-key", HeaderValue::from_static(KEY));
    let (status, _, body) = send(&app, req).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(
        problem(&body)["type"],
        "urn:idempotency:problem:key-repeated"
    );
    let (status, _, body) = send(
        &app,
        request(
            Method::POST,
            "/tasks",
            Some(&"a".repeat(300)),
            Some("alice"),
            "{}",
        ),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let detail = problem(&body)["detail"].as_str().unwrap().to_owned();
    assert!(detail.contains("255"), "{detail}");
    // A sentence like every other detail.
    assert!(
        detail.starts_with("The idempotency key") && detail.ends_with('.'),
        "{detail}"
    );
}

/// The keys real clients send pass with the default settings, and their retries replay:
/// stripe-python's UUID-shaped keys (whose version digit is random; a v1-looking one here),
/// Stainless-generated SDKs' `stainless-python-retry-<uuid4>` (OpenAI, Anthropic, Increase), a
/// Stripe-dashboard style free-form key, and the IETF draft's quoted form.
#[tokio::test]
async fn real_clients_keys_are_accepted_by_default() {
    for profile in [Profile::Ietf, Profile::Stripe] {
        let runs = Arc::new(AtomicUsize::new(0));
        let app = app_with(|b| b.profile(profile), MemoryStore::default(), runs.clone());
        let keys = [
            "c232ab00-9414-11ec-b3c8-9f68deced846",
            "5f0c0a8e-1d2b-0c3d-8e4f-5a6b7c8d9e0f",
            "stainless-python-retry-2b3c4d5e-6f70-4182-93a4-b5c6d7e8f901",
            "order_1234:checkout",
            "\"8e03978e-40d5-43e8-bc93-6894a57f9324\"",
        ];
        for key in keys {
            let first = send(
                &app,
                request(Method::POST, "/tasks", Some(key), Some("alice"), "{}"),
            )
            .await;
            assert_eq!(
                first.0,
                StatusCode::CREATED,
                "{profile:?} {key}: {:?}",
                first.2
            );
            let retry = send(
                &app,
                request(Method::POST, "/tasks", Some(key), Some("alice"), "{}"),
            )
            .await;
            assert_eq!(
                (retry.0, &retry.2),
                (first.0, &first.2),
                "{profile:?} {key}"
            );
            assert!(retry.1.get("idempotent-replayed").is_some(), "{key}");
        }
        assert_eq!(runs.load(Ordering::SeqCst), keys.len(), "{profile:?}");
    }
}

#[tokio::test]
async fn a_request_without_a_principal_is_401() {
    let app = app(Arc::new(AtomicUsize::new(0)));
    let (status, _, body) =
        send(&app, request(Method::POST, "/tasks", Some(KEY), None, "{}")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        problem(&body)["type"],
        "urn:idempotency:problem:scope-missing"
    );
}

#[tokio::test]
async fn a_different_request_with_the_same_key_is_422_and_stripe_says_400() {
    for (profile, status, code) in [
        (
            Profile::Ietf,
            StatusCode::UNPROCESSABLE_ENTITY,
            "idempotency_key_reused",
        ),
        (
            Profile::Stripe,
            StatusCode::BAD_REQUEST,
            "idempotency_error",
        ),
    ] {
        let runs = Arc::new(AtomicUsize::new(0));
        let app = app_with(|b| b.profile(profile), MemoryStore::default(), runs.clone());
        send(
            &app,
            request(
                Method::POST,
                "/tasks",
                Some(KEY),
                Some("alice"),
                r#"{"title":"a"}"#,
            ),
        )
        .await;
        let (got, _, body) = send(
            &app,
            request(
                Method::POST,
                "/tasks",
                Some(KEY),
                Some("alice"),
                r#"{"title":"b"}"#,
            ),
        )
        .await;
        assert_eq!(got, status);
        let body_json = problem(&body);
        match profile {
            // Stripe's error envelope: {"error": {"type": "idempotency_error", ...}}.
            Profile::Stripe => {
                assert_eq!(body_json["error"]["type"], code);
                assert!(body_json["error"]["message"].is_string());
            }
            _ => assert_eq!(body_json["code"], code),
        }
        assert!(
            !String::from_utf8_lossy(&body).contains("run"),
            "never the other response"
        );
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }
}

#[tokio::test]
async fn another_user_with_the_same_key_runs_separately() {
    let runs = Arc::new(AtomicUsize::new(0));
    let app = app(runs.clone());
    let a = send(
        &app,
        request(
            Method::POST,
            "/tasks",
            Some(KEY),
            Some("alice"),
            r#"{"title":"a"}"#,
        ),
    )
    .await;
    let b = send(
        &app,
        request(
            Method::POST,
            "/tasks",
            Some(KEY),
            Some("bob"),
            r#"{"title":"a"}"#,
        ),
    )
    .await;
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    assert_ne!(a.2, b.2);
    assert!(b.1.get("idempotent-replayed").is_none());
}

type Answer = (StatusCode, axum::http::HeaderMap, Bytes);

/// Starts a slow request (300 ms), and sends its duplicate 50 ms later; returns the first
/// request's task and the duplicate's answer.
async fn duplicate_of_a_running_request(app: &Router) -> (tokio::task::JoinHandle<Answer>, Answer) {
    let first = tokio::spawn({
        let app = app.clone();
        async move {
            send(
                &app,
                request(Method::POST, "/slow", Some(KEY), Some("alice"), ""),
            )
            .await
        }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let duplicate = send(
        app,
        request(Method::POST, "/slow", Some(KEY), Some("alice"), ""),
    )
    .await;
    (first, duplicate)
}

/// A duplicate of a running request gets 409 with a short `Retry-After` (default 1 s, or the
/// configured hint), not the running request's remaining lease: a client that honours it
/// stalled 29-30 s here before. The Stripe profile also says `Stripe-Should-Retry: true`.
#[tokio::test]
async fn a_concurrent_duplicate_gets_409_with_a_short_retry_after() {
    for (hint, profile, expected) in [
        (None, Profile::Ietf, 1),
        (Some(Duration::from_secs(5)), Profile::Ietf, 5),
        (None, Profile::Stripe, 1),
    ] {
        let runs = Arc::new(AtomicUsize::new(0));
        let app = app_with(
            |b| {
                let b = b.lease(Duration::from_secs(30)).profile(profile);
                match hint {
                    Some(hint) => b.in_flight_retry_after(hint),
                    None => b,
                }
            },
            MemoryStore::default(),
            runs.clone(),
        );
        let (first, (status, headers, body)) = duplicate_of_a_running_request(&app).await;
        assert_eq!(status, StatusCode::CONFLICT);
        let retry_after: u64 = headers
            .get(header::RETRY_AFTER)
            .unwrap()
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(retry_after, expected, "{hint:?} {profile:?}");
        match profile {
            Profile::Stripe => {
                assert_eq!(headers.get("stripe-should-retry").unwrap(), "true");
                assert_eq!(
                    serde_json::from_slice::<serde_json::Value>(&body).unwrap()["error"]["code"],
                    "idempotency_key_in_use"
                );
            }
            _ => {
                assert!(headers.get("stripe-should-retry").is_none());
                assert_eq!(problem(&body)["type"], "urn:idempotency:problem:in-flight");
            }
        }
        assert_eq!(first.await.unwrap().0, StatusCode::CREATED);
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }
}

#[tokio::test]
async fn with_a_wait_bound_the_duplicate_gets_the_first_response() {
    let runs = Arc::new(AtomicUsize::new(0));
    let app = app_with(
        |b| b.in_flight_wait(Duration::from_secs(5)),
        MemoryStore::default(),
        runs.clone(),
    );
    let (first, (status, headers, body)) = duplicate_of_a_running_request(&app).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(body, "slow done");
    assert_eq!(headers.get("idempotent-replayed").unwrap(), "true");
    first.await.unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn bodies_over_the_limit_are_413_and_nothing_is_stored() {
    let runs = Arc::new(AtomicUsize::new(0));
    let app = app_with(
        |b| b.max_request_body(16),
        MemoryStore::default(),
        runs.clone(),
    );
    let (status, _, body) = send(
        &app,
        request(
            Method::POST,
            "/tasks",
            Some(KEY),
            Some("alice"),
            &"x".repeat(17),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(
        problem(&body)["type"],
        "urn:idempotency:problem:body-too-large"
    );
    // The same key is still free.
    let (status, _, _) = send(
        &app,
        request(Method::POST, "/tasks", Some(KEY), Some("alice"), "{}"),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A body cut off by a limit an outer layer put on it (tower-http's `RequestBodyLimit` wraps the
/// body in `Limited`) is too large, not unreadable: 413, and nothing runs.
#[tokio::test]
async fn a_body_cut_off_by_an_outer_limit_is_413() {
    let runs = Arc::new(AtomicUsize::new(0));
    let app = app(runs.clone());
    let limited =
        http_body_util::Limited::new(http_body_util::Full::new(Bytes::from("x".repeat(64))), 16);
    let mut req = Request::builder()
        .method(Method::POST)
        .uri("/tasks")
        .header("idempotency-key", KEY)
        .body(Body::new(limited))
        .unwrap();
    req.extensions_mut().insert(User("alice"));
    let (status, _, body) = send(&app, req).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(
        problem(&body)["type"],
        "urn:idempotency:problem:body-too-large"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_5xx_releases_the_key_and_the_retry_runs() {
    let runs = Arc::new(AtomicUsize::new(0));
    let app = app(runs.clone());
    let (status, _, _) = send(
        &app,
        request(Method::POST, "/fail", Some(KEY), Some("alice"), ""),
    )
    .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    let (status, headers, body) = send(
        &app,
        request(Method::POST, "/fail", Some(KEY), Some("alice"), ""),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(body, "worked");
    assert!(headers.get("idempotent-replayed").is_none());
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_panicking_handler_gives_500_and_releases_the_key() {
    let runs = Arc::new(AtomicUsize::new(0));
    let app = app(runs.clone());
    let (status, _, body) = send(
        &app,
        request(Method::POST, "/panic", Some(KEY), Some("alice"), ""),
    )
    .await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        problem(&body)["type"],
        "urn:idempotency:problem:handler-failed"
    );
    // The release runs in the background; the retry may briefly see the claim.
    let mut last = None;
    for _ in 0..100 {
        let (status, _, body) = send(
            &app,
            request(Method::POST, "/panic", Some(KEY), Some("alice"), ""),
        )
        .await;
        if status != StatusCode::CONFLICT {
            last = Some((status, body));
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (status, body) = last.expect("the key was never released");
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(body, "second run");
}

#[tokio::test]
async fn a_disconnected_client_does_not_stop_the_handler_and_the_retry_replays() {
    let runs = Arc::new(AtomicUsize::new(0));
    let app = app(runs.clone());
    // The client gives up after 50 ms; the handler needs 300 ms.
    let gave_up = tokio::time::timeout(
        Duration::from_millis(50),
        app.clone()
            .oneshot(request(Method::POST, "/slow", Some(KEY), Some("alice"), "")),
    )
    .await;
    assert!(
        gave_up.is_err(),
        "the request future must have been dropped mid-handler"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the handler ran to the end");
    let (status, headers, body) = send(
        &app,
        request(Method::POST, "/slow", Some(KEY), Some("alice"), ""),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(body, "slow done");
    assert_eq!(headers.get("idempotent-replayed").unwrap(), "true");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_response_over_the_storage_cap_is_sent_whole_and_replayed_without_its_body() {
    let runs = Arc::new(AtomicUsize::new(0));
    let app = app_with(
        |b| b.max_stored_response_body(1024),
        MemoryStore::default(),
        runs,
    );
    let (status, _, body) = send(
        &app,
        request(Method::POST, "/big", Some(KEY), Some("alice"), ""),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body.len(), 64 * 1024, "the client gets every byte");
    let (status, headers, body) = send(
        &app,
        request(Method::POST, "/big", Some(KEY), Some("alice"), ""),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.is_empty());
    assert_eq!(headers.get("idempotent-replay-body").unwrap(), "omitted");
    assert_eq!(headers.get("idempotent-replayed").unwrap(), "true");
}

/// A store that always fails, or never answers.
struct BrokenStore {
    hang: bool,
    /// Says its pool's every connection is in use.
    pool_full: bool,
}

#[async_trait]
impl IdempotencyStore for BrokenStore {
    fn backend(&self) -> &'static str {
        "broken"
    }
    async fn claim(
        &self,
        _: &Scope,
        _: &IdempotencyKey,
        _: &Fingerprint,
        _: LeaseToken,
        _: Duration,
    ) -> Result<ClaimOutcome, StoreError> {
        if self.hang {
            std::future::pending::<()>().await;
        }
        Err(StoreError::Unavailable {
            backend: "broken",
            source: "connection refused".into(),
        })
    }
    async fn complete(
        &self,
        _: &Scope,
        _: &IdempotencyKey,
        _: LeaseToken,
        _: &StoredResponse,
        _: Duration,
    ) -> Result<FenceOutcome, StoreError> {
        unreachable_store()
    }
    async fn extend(
        &self,
        _: &Scope,
        _: &IdempotencyKey,
        _: LeaseToken,
        _: Duration,
    ) -> Result<FenceOutcome, StoreError> {
        unreachable_store()
    }
    async fn release(
        &self,
        _: &Scope,
        _: &IdempotencyKey,
        _: LeaseToken,
    ) -> Result<FenceOutcome, StoreError> {
        unreachable_store()
    }
    async fn get(&self, _: &Scope, _: &IdempotencyKey) -> Result<Option<Record>, StoreError> {
        unreachable_store()
    }
    fn pool_status(&self) -> Option<idempotency_core::store::PoolStatus> {
        self.pool_full
            .then(|| idempotency_core::store::PoolStatus::new(4, 4, 0, Some(12)))
    }
    async fn purge_expired(&self, _: usize) -> Result<u64, StoreError> {
        unreachable_store()
    }
}

fn unreachable_store<T>() -> Result<T, StoreError> {
    Err(StoreError::Unavailable {
        backend: "broken",
        source: "connection refused".into(),
    })
}

#[tokio::test]
async fn an_unreachable_store_fails_closed_with_503_or_open_when_asked() {
    let runs = Arc::new(AtomicUsize::new(0));
    let closed = app_with(
        |b| b,
        BrokenStore {
            hang: false,
            pool_full: false,
        },
        runs.clone(),
    );
    let (status, headers, body) = send(
        &closed,
        request(Method::POST, "/tasks", Some(KEY), Some("alice"), "{}"),
    )
    .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(headers.get(header::RETRY_AFTER).unwrap(), "1");
    assert_eq!(
        problem(&body)["type"],
        "urn:idempotency:problem:store-unavailable"
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "fail closed: the handler must not run"
    );
    let open = app_with(
        |b| b.fail_open(true),
        BrokenStore {
            hang: false,
            pool_full: false,
        },
        runs.clone(),
    );
    let (status, _, _) = send(
        &open,
        request(Method::POST, "/tasks", Some(KEY), Some("alice"), "{}"),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_hanging_store_is_bounded_by_the_store_timeout() {
    let runs = Arc::new(AtomicUsize::new(0));
    let app = app_with(
        |b| b.store_timeout(Duration::from_millis(200)),
        BrokenStore {
            hang: true,
            pool_full: false,
        },
        runs.clone(),
    );
    let started = std::time::Instant::now();
    let (status, headers, _) = send(
        &app,
        request(Method::POST, "/tasks", Some(KEY), Some("alice"), "{}"),
    )
    .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(headers.get(header::RETRY_AFTER).is_some());
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

/// A memory store full of completed responses, set to refuse new claims: a new key gets 503
/// with `Retry-After` and a problem+json body, its handler never runs, and every key completed
/// before still replays without running again.
#[tokio::test]
async fn a_full_memory_store_refusing_claims_answers_503_and_runs_nothing() {
    use idempotency_memory::WhenFull;
    let runs = Arc::new(AtomicUsize::new(0));
    let store = MemoryStore::builder()
        .max_stored_bytes(16 * 1024)
        .when_full(WhenFull::RefuseNewClaims)
        // The store's own bound, reached by one caller: no per-caller share before it.
        .max_bytes_per_scope(u64::MAX)
        .build();
    let app = app_with(|b| b, store, runs.clone());
    let key = |i: usize| format!("8e03978e-40d5-43e8-bc93-{i:012}");
    let body = "x".repeat(500);
    let mut created = 0;
    let refused = loop {
        let (status, headers, answer) = send(
            &app,
            request(
                Method::POST,
                "/tasks",
                Some(&key(created)),
                Some("alice"),
                &body,
            ),
        )
        .await;
        if status != StatusCode::CREATED {
            break (status, headers, answer);
        }
        created += 1;
        assert!(created < 1000, "the bound never refused a claim");
    };
    let (status, headers, answer) = refused;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(headers.contains_key(header::RETRY_AFTER));
    assert_eq!(
        headers[header::CONTENT_TYPE],
        HeaderValue::from_static("application/problem+json")
    );
    assert_eq!(problem(&answer)["status"], 503);
    assert_eq!(
        runs.load(Ordering::SeqCst),
        created,
        "the refused request ran its handler"
    );
    assert!(created > 3, "only {created} responses fit");
    for i in 0..created {
        let (status, headers, _) = send(
            &app,
            request(Method::POST, "/tasks", Some(&key(i)), Some("alice"), &body),
        )
        .await;
        assert_eq!(status, StatusCode::CREATED, "key {i}");
        assert_eq!(headers["idempotent-replayed"], "true", "key {i}");
    }
    assert_eq!(runs.load(Ordering::SeqCst), created, "a replay ran again");
}

/// A memory store refusing claims at the bound, with per-caller shares (the default, an eighth
/// of the bound): the caller at its share gets 429 `scope-full` with `Retry-After` and its
/// handler does not run, its completed keys still replay, and another caller is served.
#[tokio::test]
async fn a_caller_at_its_share_of_a_refusing_memory_store_gets_429_and_others_go_on() {
    use idempotency_memory::WhenFull;
    let runs = Arc::new(AtomicUsize::new(0));
    let store = MemoryStore::builder()
        .max_stored_bytes(64 * 1024)
        .when_full(WhenFull::RefuseNewClaims)
        .build();
    let app = app_with(|b| b, store, runs.clone());
    let key = |i: usize| format!("8e03978e-40d5-43e8-bc93-{i:012}");
    let body = "x".repeat(500);
    let mut created = 0;
    let (status, headers, answer) = loop {
        let sent = request(
            Method::POST,
            "/tasks",
            Some(&key(created)),
            Some("alice"),
            &body,
        );
        let (status, headers, answer) = send(&app, sent).await;
        if status != StatusCode::CREATED {
            break (status, headers, answer);
        }
        created += 1;
        assert!(created < 1000, "the share never refused a claim");
    };
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(headers[header::RETRY_AFTER], "60");
    assert_eq!(problem(&answer)["status"], 429);
    assert!(
        problem(&answer)["type"]
            .as_str()
            .is_some_and(|t| t.ends_with("scope-full")),
        "{}",
        problem(&answer)
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        created,
        "the refused request ran"
    );
    // Her completed keys replay; another caller's new key runs.
    let again = request(Method::POST, "/tasks", Some(&key(0)), Some("alice"), &body);
    let (status, headers, _) = send(&app, again).await;
    assert_eq!(
        (status, &headers["idempotent-replayed"]),
        (StatusCode::CREATED, &"true".parse().unwrap())
    );
    let other = request(Method::POST, "/tasks", Some(&key(0)), Some("bob"), &body);
    assert_eq!(send(&app, other).await.0, StatusCode::CREATED);
    assert_eq!(runs.load(Ordering::SeqCst), created + 1);
}

/// The default at the bound, `WhenFull::EvictLeastRecentlyUsed`: completed keys are evicted
/// to make room, so the retry of an evicted key runs the handler a second time and the client
/// gets a fresh 201 (no `idempotent-replayed`); the key completed last still replays, and
/// nothing is refused. (Which old key goes is the least recently used to the millisecond; keys
/// completed in the same millisecond go in any order, so the test asks the store which ones it
/// evicted.)
#[tokio::test]
async fn a_full_evicting_memory_store_runs_an_evicted_key_again_and_replays_a_recent_one() {
    let runs = Arc::new(AtomicUsize::new(0));
    let store = MemoryStore::builder().max_stored_bytes(16 * 1024).build();
    let app = app_with(|b| b, store.clone(), runs.clone());
    let key = |i: usize| format!("8e03978e-40d5-43e8-bc93-{i:012}");
    let body = "x".repeat(500);
    let post = |i: usize| request(Method::POST, "/tasks", Some(&key(i)), Some("alice"), &body);
    let mut sent = 0;
    while store.evicted_records() == 0 {
        let (status, headers, _) = send(&app, post(sent)).await;
        assert_eq!(status, StatusCode::CREATED, "key {sent} at the bound");
        assert!(!headers.contains_key("idempotent-replayed"));
        sent += 1;
        assert!(sent < 1000, "the bound never evicted");
    }
    assert_eq!(runs.load(Ordering::SeqCst), sent);
    let scope = Scope::new("alice").unwrap();
    let mut evicted = Vec::new();
    for i in 0..sent {
        let id = IdempotencyKey::parse(key(i).as_bytes(), idempotency_core::KeyFormat::opaque())
            .unwrap();
        if store.get(&scope, &id).await.unwrap().is_none() {
            evicted.push(i);
        }
    }
    assert_eq!(evicted.len() as u64, store.evicted_records());
    assert!(
        !evicted.contains(&(sent - 1)),
        "the key just completed was evicted"
    );
    // The key completed last replays.
    let (status, headers, _) = send(&app, post(sent - 1)).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(
        runs.load(Ordering::SeqCst),
        sent,
        "the recent key ran again"
    );
    // An evicted key's retry runs the handler again and is answered as a new request.
    let (status, headers, _) = send(&app, post(evicted[0])).await;
    assert_eq!(status, StatusCode::CREATED);
    assert!(
        !headers.contains_key("idempotent-replayed"),
        "an evicted key was answered as a replay"
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        sent + 1,
        "the evicted key ran once more"
    );
}

/// What the README's first snippet teaches: with `route_layer`, a path that matches no route
/// stays the router's 404, with or without a key, and nothing is stored for it; with `layer`,
/// the same request got `400 key-missing` (and, with a key, its 404 was stored and replayed).
#[tokio::test]
async fn unmatched_routes_stay_404_under_route_layer() {
    let store = MemoryStore::default();
    let layer = || {
        IdempotencyLayer::builder(store.clone())
            .scope_with(|req| {
                req.extensions
                    .get::<User>()
                    .map(|u| Scope::new(u.0).unwrap())
            })
            .build()
            .expect("valid idempotency layer settings")
    };
    let routes = || Router::new().route("/tasks", post(|| async { StatusCode::CREATED }));
    let route_layered = routes().route_layer(layer());
    let layered = routes().layer(layer());

    let (status, _, _) = send(
        &route_layered,
        request(Method::POST, "/nope", None, Some("alice"), "{}"),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    for _ in 0..2 {
        let (status, headers, _) = send(
            &route_layered,
            request(Method::POST, "/nope", Some(KEY), Some("alice"), "{}"),
        )
        .await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert!(headers.get("idempotent-replayed").is_none());
    }
    let scope = Scope::new("alice").unwrap();
    let key =
        IdempotencyKey::parse(KEY.as_bytes(), idempotency_core::KeyFormat::default()).unwrap();
    assert_eq!(
        store.get(&scope, &key).await.unwrap(),
        None,
        "nothing stored"
    );
    // The matched route is covered.
    let (status, _, _) = send(
        &route_layered,
        request(Method::POST, "/tasks", None, Some("alice"), "{}"),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);

    // What `layer` does instead: the fallback is covered too.
    let (status, _, body) = send(
        &layered,
        request(Method::POST, "/nope", None, Some("alice"), "{}"),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(
        problem(&body)["type"],
        "urn:idempotency:problem:key-missing"
    );
}

/// A principal that cannot form a scope (a user name with a tab) is refused with 401
/// `scope-invalid` through `scope_from_extension` and a `TryFrom` conversion: it never lands in
/// a shared key space, so another user sending the same key gets their own answer.
#[tokio::test]
async fn a_principal_that_cannot_form_a_scope_is_refused_not_shared() {
    #[derive(Clone)]
    struct Name(&'static str);
    impl TryFrom<Name> for Scope {
        type Error = idempotency_core::ScopeError;
        fn try_from(name: Name) -> Result<Scope, Self::Error> {
            Scope::new(name.0)
        }
    }
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let app = Router::new()
        .route(
            "/tasks",
            post(move || {
                let n = counted.fetch_add(1, Ordering::SeqCst) + 1;
                async move { (StatusCode::CREATED, format!("task {n}")) }
            }),
        )
        .route_layer(
            IdempotencyLayer::builder(MemoryStore::default())
                .scope_from_extension::<Name>()
                .build()
                .expect("valid idempotency layer settings"),
        );
    let as_user = |name: &'static str| {
        let mut req = request(Method::POST, "/tasks", Some(KEY), None, "{}");
        req.extensions_mut().insert(Name(name));
        req
    };
    let (status, _, body) = send(&app, as_user("mallory\tx")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        problem(&body)["type"],
        "urn:idempotency:problem:scope-invalid"
    );
    let (status, _, body) = send(&app, as_user("bob\tx")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body:?}");
    // A valid user with the same key runs its own request.
    let (status, headers, body) = send(&app, as_user("alice")).await;
    assert_eq!((status, &body[..]), (StatusCode::CREATED, &b"task 1"[..]));
    assert!(headers.get("idempotent-replayed").is_none());
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A 401 is not stored: the client that fixes its credentials and retries with the same key
/// gets the operation run. And a replay does not carry the first request's id or trace
/// context (the service's middleware gives the replay its own).
#[tokio::test]
async fn auth_failures_are_not_stored_and_replays_carry_no_request_ids() {
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let app = Router::new()
        .route(
            "/tasks",
            post(move |headers: axum::http::HeaderMap| {
                let counted = counted.clone();
                async move {
                    let n = counted.fetch_add(1, Ordering::SeqCst) + 1;
                    let request_id = format!("req-{n}");
                    if headers.get("x-token").is_none_or(|t| t != "good") {
                        return (
                            StatusCode::UNAUTHORIZED,
                            [
                                ("www-authenticate", "Bearer".to_owned()),
                                ("x-request-id", request_id),
                            ],
                            "no".to_owned(),
                        );
                    }
                    (
                        StatusCode::CREATED,
                        [
                            ("traceparent", format!("00-{n:032x}-{n:016x}-01")),
                            ("x-request-id", request_id),
                        ],
                        format!("task {n}"),
                    )
                }
            }),
        )
        .route_layer(
            IdempotencyLayer::builder(MemoryStore::default())
                .scope_with(|_| Some(Scope::new("alice").unwrap()))
                .build()
                .expect("valid idempotency layer settings"),
        );
    let with_token = |token: Option<&'static str>| {
        let mut req = request(Method::POST, "/tasks", Some(KEY), None, "{}");
        if let Some(token) = token {
            req.headers_mut()
                .insert("x-token", HeaderValue::from_static(token));
        }
        req
    };
    let (status, _, _) = send(&app, with_token(Some("expired"))).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, headers, body) = send(&app, with_token(Some("good"))).await;
    assert_eq!((status, &body[..]), (StatusCode::CREATED, &b"task 2"[..]));
    assert_eq!(headers["x-request-id"], "req-2");
    let (status, headers, body) = send(&app, with_token(Some("good"))).await;
    assert_eq!((status, &body[..]), (StatusCode::CREATED, &b"task 2"[..]));
    assert!(headers.get("idempotent-replayed").is_some());
    assert!(headers.get("x-request-id").is_none(), "{headers:?}");
    assert!(headers.get("traceparent").is_none(), "{headers:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// A body that stalls part way is cut at the read deadline with `408 body-timeout`: the
/// handler does not run and nothing holds the key (before, a body stalled 45 s was still
/// read, holding its buffer all along).
#[tokio::test]
async fn a_stalled_body_gets_408_at_the_read_deadline() {
    let runs = Arc::new(AtomicUsize::new(0));
    let app = app_with(
        |b| b.request_body_timeout(Duration::from_millis(300)),
        MemoryStore::default(),
        runs.clone(),
    );
    let stalled = futures_util::stream::unfold(0, |sent| async move {
        if sent == 0 {
            Some((
                Ok::<_, std::io::Error>(Bytes::from_static(b"{\"title\":")),
                1,
            ))
        } else {
            std::future::pending::<()>().await;
            None
        }
    });
    let mut req = Request::builder()
        .method(Method::POST)
        .uri("/tasks")
        .header("idempotency-key", KEY)
        .body(Body::from_stream(stalled))
        .unwrap();
    req.extensions_mut().insert(User("alice"));
    let started = std::time::Instant::now();
    let (status, _, body) = tokio::time::timeout(Duration::from_secs(5), send(&app, req))
        .await
        .expect("answered at the deadline, not when the client gives up");
    assert_eq!(status, StatusCode::REQUEST_TIMEOUT);
    assert_eq!(
        problem(&body)["type"],
        "urn:idempotency:problem:body-timeout"
    );
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    // The key is free: the whole request, sent again, runs.
    let (status, _, _) = send(
        &app,
        request(
            Method::POST,
            "/tasks",
            Some(KEY),
            Some("alice"),
            "{\"title\":1}",
        ),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
}

/// Issue 28 item 3: the bodies held at once are bounded across requests. While one upload is
/// stalled holding 600 of a 1,000-byte budget, a second 600-byte body is answered `503 busy`
/// with `Retry-After` at once, nothing ran; a small body still fits, and once the stalled
/// upload times out its bytes are free again.
#[tokio::test]
async fn bodies_past_the_layer_s_budget_are_answered_busy_at_once() {
    let runs = Arc::new(AtomicUsize::new(0));
    let app = app_with(
        |b| {
            b.max_buffered_request_bytes(1000)
                .request_body_timeout(Duration::from_millis(500))
        },
        MemoryStore::default(),
        runs.clone(),
    );
    let stalled = futures_util::stream::unfold(0, |sent| async move {
        if sent == 0 {
            Some((Ok::<_, std::io::Error>(Bytes::from(vec![b' '; 600])), 1))
        } else {
            std::future::pending::<()>().await;
            None
        }
    });
    let mut upload = Request::builder()
        .method(Method::POST)
        .uri("/tasks")
        .header("idempotency-key", "8e03978e-40d5-43e8-bc93-000000000001")
        .body(Body::from_stream(stalled))
        .unwrap();
    upload.extensions_mut().insert(User("alice"));
    let held = tokio::spawn({
        let app = app.clone();
        async move { send(&app, upload).await.0 }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let big = format!("{{\"title\":\"{}\"}}", "x".repeat(590));
    let second = request(Method::POST, "/tasks", Some(KEY), Some("bob"), &big);
    let (status, headers, body) = send(&app, second).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(headers.contains_key(header::RETRY_AFTER));
    assert_eq!(problem(&body)["type"], "urn:idempotency:problem:busy");
    assert_eq!(runs.load(Ordering::SeqCst), 0, "a refused request ran");
    let small = request(
        Method::POST,
        "/tasks",
        Some(KEY),
        Some("carol"),
        "{\"title\":1}",
    );
    assert_eq!(send(&app, small).await.0, StatusCode::CREATED);
    assert_eq!(held.await.unwrap(), StatusCode::REQUEST_TIMEOUT);
    let retried = request(Method::POST, "/tasks", Some(KEY), Some("bob"), &big);
    assert_eq!(send(&app, retried).await.0, StatusCode::CREATED);
}

/// Issue 28 item 5, through HTTP: the same bytes re-sent as `text/plain` under the key of a JSON
/// request are another request (422), not its retry; re-sent as JSON they replay.
#[tokio::test]
async fn the_same_bytes_as_another_media_type_are_not_a_retry() {
    let runs = Arc::new(AtomicUsize::new(0));
    let app = app(runs.clone());
    let typed = |content_type: &'static str| {
        let mut req = request(
            Method::POST,
            "/tasks",
            Some(KEY),
            Some("alice"),
            "{\"title\":1}",
        );
        req.headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
        req
    };
    assert_eq!(
        send(&app, typed("application/json")).await.0,
        StatusCode::CREATED
    );
    let (status, _, body) = send(&app, typed("text/plain")).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(problem(&body)["type"], "urn:idempotency:problem:key-reused");
    let (status, headers, _) = send(&app, typed("application/json; charset=utf-8")).await;
    assert_eq!(
        (status, &headers["idempotent-replayed"]),
        (StatusCode::CREATED, &HeaderValue::from_static("true"))
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A client tells the library's answers from the handler's without reading the body (issue 45
/// item 6): every refusal the layer makes carries `Idempotency-Refusal` with its slug; a
/// handler's own `409` (a business refusal, stored) carries it neither the first time nor
/// replayed, so an SDK that retries every 409 carrying it never loops on a stored refusal.
#[tokio::test]
async fn a_library_answer_is_marked_and_a_stored_business_409_is_not() {
    let runs = Arc::new(AtomicUsize::new(0));
    let app = app_with(
        |b| b.lease(Duration::from_secs(30)),
        MemoryStore::default(),
        runs.clone(),
    );
    let (first, (status, headers, _)) = duplicate_of_a_running_request(&app).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(headers.get("idempotency-refusal").unwrap(), "in-flight");
    assert!(headers.contains_key(header::RETRY_AFTER));
    assert!(first.await.unwrap().1.get("idempotency-refusal").is_none());
    let (status, headers, _) = send(
        &app,
        request(Method::POST, "/slow", Some(KEY), Some("alice"), "other"),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(headers.get("idempotency-refusal").unwrap(), "key-reused");
    let (status, headers, _) = send(
        &app,
        request(Method::POST, "/tasks", None, Some("alice"), ""),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(headers.get("idempotency-refusal").unwrap(), "key-missing");

    // A handler's own 409, stored: neither its first answer nor its replay is marked, even
    // when the handler set the header itself (it is never stored).
    let refusing = Router::new()
        .route(
            "/orders",
            post(|| async {
                (
                    StatusCode::CONFLICT,
                    [("idempotency-refusal", "in-flight")],
                    "out_of_stock",
                )
            }),
        )
        .layer(
            IdempotencyLayer::builder(MemoryStore::default())
                .scope_with(|req| {
                    req.extensions
                        .get::<User>()
                        .map(|u| Scope::new(u.0).unwrap())
                })
                .build()
                .expect("valid idempotency layer settings"),
        );
    let order = || request(Method::POST, "/orders", Some(KEY), Some("alice"), "");
    let (status, _, body) = send(&refusing, order()).await;
    assert_eq!(
        (status, &body[..]),
        (StatusCode::CONFLICT, &b"out_of_stock"[..])
    );
    let (status, headers, body) = send(&refusing, order()).await;
    assert_eq!(
        (status, &body[..]),
        (StatusCode::CONFLICT, &b"out_of_stock"[..])
    );
    assert_eq!(headers.get("idempotent-replayed").unwrap(), "true");
    assert!(headers.get("idempotency-refusal").is_none(), "{headers:?}");
}

/// A store call that times out is recorded in `idempotency_store_duration_seconds` as the
/// timeout itself (issue 46 item 4): the timer fires a little after it, and a call recorded at
/// 5.001 s landed in the (5, 10] bucket, so the p99 of calls that cannot last past 5 s read
/// 9.85 s.
#[test]
fn a_timed_out_store_call_reads_as_the_timeout() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let app = app_with(
                |b| b.store_timeout(Duration::from_millis(200)),
                BrokenStore {
                    hang: true,
                    pool_full: false,
                },
                Arc::new(AtomicUsize::new(0)),
            );
            let (status, _, _) = send(
                &app,
                request(Method::POST, "/tasks", Some(KEY), Some("alice"), "{}"),
            )
            .await;
            assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        });
    });
    let recorded: Vec<f64> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, ..)| key.key().name() == "idempotency_store_duration_seconds")
        .filter(|(key, ..)| {
            key.key()
                .labels()
                .any(|l| l.key() == "op" && l.value() == "claim")
        })
        .flat_map(|(_, _, _, value)| match value {
            DebugValue::Histogram(values) => values.into_iter().map(|v| v.into_inner()).collect(),
            _ => Vec::new(),
        })
        .collect();
    assert_eq!(recorded, vec![0.2], "the timed-out claim, as its timeout");
}

/// A store call that fails while every connection of the store's pool is in use is said as
/// what it is (issue 45 item 4): `503 store-busy`, not `store-unavailable` (the database may be
/// fine; the application's requests hold the connections).
#[tokio::test]
async fn a_store_call_failing_on_a_full_pool_is_store_busy() {
    for (pool_full, slug) in [(true, "store-busy"), (false, "store-unavailable")] {
        let runs = Arc::new(AtomicUsize::new(0));
        let app = app_with(
            |b| b.store_timeout(Duration::from_millis(100)),
            BrokenStore {
                hang: true,
                pool_full,
            },
            runs.clone(),
        );
        let (status, headers, body) = send(
            &app,
            request(Method::POST, "/tasks", Some(KEY), Some("alice"), "{}"),
        )
        .await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(headers.get("idempotency-refusal").unwrap(), slug);
        assert!(headers.contains_key(header::RETRY_AFTER));
        assert_eq!(
            problem(&body)["type"],
            format!("urn:idempotency:problem:{slug}")
        );
        assert_eq!(runs.load(Ordering::SeqCst), 0);
    }
}
