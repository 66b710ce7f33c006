//! What a handler and an application configure and see, through the real layer on the memory
//! store: the lease extractor, where the key comes from, what the fingerprint covers, the
//! per-response opt-out, how refusals are written, per-route use, `nest`, graceful drain.
#![allow(clippy::unwrap_used)]

use axum::Router;
use axum::body::Body;
use axum::extract::Extension;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, Request, StatusCode, header};
use axum::routing::{get, post};
use bytes::Bytes;
use http_body_util::BodyExt;
use idempotency_core::{FingerprintSpec, KeyClaim, Scope};
use idempotency_memory::MemoryStore;
use idempotency_tower::{Claim, IdempotencyLayer, NotStored, Profile, Refusal, RefusalKind};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tower::ServiceExt;

const KEY: &str = "8e03978e-40d5-43e8-bc93-6894a57f9324";
const OTHER_KEY: &str = "0b7ee5a4-3a46-4c1f-9d0e-6f7f4f4f9a11";

fn builder() -> idempotency_tower::IdempotencyLayerBuilder<MemoryStore, idempotency_tower::ScopeSet>
{
    IdempotencyLayer::builder(MemoryStore::default()).scope_with(|req| {
        req.headers
            .get("x-user")
            .and_then(|v| v.to_str().ok())
            .and_then(|u| Scope::new(u).ok())
    })
}

fn post_req(uri: &str, key: Option<&str>, body: &str) -> Request<Body> {
    let mut b = Request::post(uri)
        .header("x-user", "alice")
        .header(header::CONTENT_TYPE, "application/json");
    if let Some(key) = key {
        b = b.header("idempotency-key", key);
    }
    b.body(Body::from(body.to_owned())).unwrap()
}

async fn send(app: &Router, req: Request<Body>) -> (StatusCode, HeaderMap, String) {
    let response = app.clone().oneshot(req).await.unwrap();
    let (parts, body) = response.into_parts();
    let bytes = body.collect().await.unwrap().to_bytes();
    (
        parts.status,
        parts.headers,
        String::from_utf8_lossy(&bytes).into_owned(),
    )
}

/// A handler that counts its runs and answers `201 run <n>`.
fn counting(runs: &Arc<AtomicUsize>) -> axum::routing::MethodRouter {
    let runs = runs.clone();
    post(move || {
        let runs = runs.clone();
        async move {
            let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
            (StatusCode::CREATED, format!("run {n}"))
        }
    })
}

fn replayed(headers: &HeaderMap) -> bool {
    headers
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true")
}

// 1. The lease: key, scope, fencing token and whether it is held, as an extractor.

#[tokio::test]
async fn a_handler_extracts_its_lease_and_an_uncovered_one_gets_none() {
    let app = Router::new()
        .route(
            "/pay",
            post(|Claim(claim): Claim| async move {
                format!(
                    "{}|{}|{}|{}",
                    claim.key().as_str(),
                    claim.scope().as_str(),
                    claim.token().as_uuid(),
                    claim.is_held()
                )
            })
            .get(|claim: Option<Claim>| async move { format!("lease: {}", claim.is_some()) }),
        )
        .route("/needs-lease", get(|_claim: Claim| async { "never" }))
        .layer(builder().build().expect("valid idempotency layer settings"));

    let (status, _, body) = send(&app, post_req("/pay", Some(KEY), "{}")).await;
    assert_eq!(status, StatusCode::OK);
    let fields: Vec<&str> = body.split('|').collect();
    assert_eq!(fields[0], KEY);
    assert_eq!(fields[1], "alice");
    assert!(uuid::Uuid::parse_str(fields[2]).is_ok(), "{body}");
    assert_eq!(fields[3], "true");
    // The replay carries the same token: it is the first run's response.
    let (_, headers, again) = send(&app, post_req("/pay", Some(KEY), "{}")).await;
    assert!(replayed(&headers));
    assert_eq!(again, body);

    // GET is not covered: no lease, and a handler that requires one says why.
    let get_req = |uri: &str| Request::get(uri).body(Body::empty()).unwrap();
    assert_eq!(send(&app, get_req("/pay")).await.2, "lease: false");
    let (status, headers, body) = send(&app, get_req("/needs-lease")).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(headers[header::CONTENT_TYPE], "application/problem+json");
    let problem: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(problem["code"], "idempotency_claim_unavailable");
}

// 2. Where the key comes from; which parts of a request count.

#[tokio::test]
async fn key_with_takes_the_key_from_where_the_application_says() {
    let runs = Arc::new(AtomicUsize::new(0));
    let app = Router::new().route("/orders", counting(&runs)).layer(
        builder()
            .key_with(|parts| {
                parts
                    .uri
                    .query()?
                    .split('&')
                    .find_map(|pair| pair.strip_prefix("request_id=").map(str::to_owned))
            })
            .build()
            .expect("valid idempotency layer settings"),
    );
    let uri = format!("/orders?request_id={KEY}");
    assert_eq!(send(&app, post_req(&uri, None, "{}")).await.2, "run 1");
    let (_, headers, body) = send(&app, post_req(&uri, None, "{}")).await;
    assert!(replayed(&headers));
    assert_eq!(body, "run 1");
    // The header is not where the key is any more: without the parameter, the key is missing.
    let (status, _, body) = send(&app, post_req("/orders", Some(OTHER_KEY), "{}")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body.contains("idempotency_key_missing"), "{body}");
    // And it is validated like a header key (here: longer than 255 bytes).
    let too_long = format!("/orders?request_id={}", "k".repeat(256));
    let (status, _, body) = send(&app, post_req(&too_long, None, "{}")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body.contains("idempotency_key_invalid"), "{body}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn fingerprint_with_counts_chosen_headers_and_ignores_chosen_fields() {
    let runs = Arc::new(AtomicUsize::new(0));
    let spec = FingerprintSpec::new()
        .header(HeaderName::from_static("api-version"))
        .ignore_json("/sent_at")
        .unwrap();
    let app = Router::new().route("/orders", counting(&runs)).layer(
        builder()
            .fingerprint_with(spec)
            .build()
            .expect("valid idempotency layer settings"),
    );
    let versioned = |version: &str, body: &str| {
        let mut r = post_req("/orders", Some(KEY), body);
        r.headers_mut()
            .insert("api-version", HeaderValue::from_str(version).unwrap());
        r
    };
    let first = send(&app, versioned("2024-01", r#"{"item":"tea","sent_at":1}"#)).await;
    assert_eq!(first.2, "run 1");
    // A retry whose volatile field changed is the same request.
    let retry = send(&app, versioned("2024-01", r#"{"sent_at":2,"item":"tea"}"#)).await;
    assert!(replayed(&retry.1), "{retry:?}");
    assert_eq!(retry.2, "run 1");
    // Another API version is another request.
    let other = send(&app, versioned("2025-06", r#"{"item":"tea","sent_at":1}"#)).await;
    assert_eq!(other.0, StatusCode::UNPROCESSABLE_ENTITY);
    // So is another item.
    let other = send(
        &app,
        versioned("2024-01", r#"{"item":"coffee","sent_at":1}"#),
    )
    .await;
    assert_eq!(other.0, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn fingerprint_with_keep_counts_only_the_kept_fields() {
    let runs = Arc::new(AtomicUsize::new(0));
    let spec = FingerprintSpec::new().keep_json("/amount").unwrap();
    let app = Router::new().route("/charges", counting(&runs)).layer(
        builder()
            .fingerprint_with(spec)
            .build()
            .expect("valid idempotency layer settings"),
    );
    send(
        &app,
        post_req("/charges", Some(KEY), r#"{"amount":5,"note":"a"}"#),
    )
    .await;
    let retry = send(
        &app,
        post_req("/charges", Some(KEY), r#"{"amount":5,"note":"b"}"#),
    )
    .await;
    assert!(replayed(&retry.1));
    let other = send(
        &app,
        post_req("/charges", Some(KEY), r#"{"amount":6,"note":"a"}"#),
    )
    .await;
    assert_eq!(other.0, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

// 3. A response the handler says not to store: the key is released, the fixed request runs.

#[tokio::test]
async fn a_response_marked_not_stored_releases_the_key_and_the_fixed_request_runs() {
    for marker in ["extension", "cache-control"] {
        let runs = Arc::new(AtomicUsize::new(0));
        let counter = runs.clone();
        let app = Router::new()
            .route(
                "/tasks",
                post(move |body: String| {
                    let runs = counter.clone();
                    async move {
                        runs.fetch_add(1, Ordering::SeqCst);
                        if body.contains("\"title\":\"\"") {
                            // A validation error the client fixes and resends with the same key.
                            let mut response = axum::response::IntoResponse::into_response((
                                StatusCode::UNPROCESSABLE_ENTITY,
                                "title is empty",
                            ));
                            if marker == "extension" {
                                response.extensions_mut().insert(NotStored);
                            } else {
                                response.headers_mut().insert(
                                    header::CACHE_CONTROL,
                                    HeaderValue::from_static("private, No-Store"),
                                );
                            }
                            return response;
                        }
                        axum::response::IntoResponse::into_response((
                            StatusCode::CREATED,
                            "created",
                        ))
                    }
                }),
            )
            .layer(builder().build().expect("valid idempotency layer settings"));
        let (status, headers, _) =
            send(&app, post_req("/tasks", Some(KEY), r#"{"title":""}"#)).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{marker}");
        assert!(!replayed(&headers));
        // The same request again runs again (nothing was stored)...
        let (status, headers, _) =
            send(&app, post_req("/tasks", Some(KEY), r#"{"title":""}"#)).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{marker}");
        assert!(
            !replayed(&headers),
            "{marker}: a not-stored response is never replayed"
        );
        // ...and the fixed body, with the same key, is not "key reused": it runs and is stored.
        let (status, _, body) = send(&app, post_req("/tasks", Some(KEY), r#"{"title":"x"}"#)).await;
        assert_eq!(
            (status, body.as_str()),
            (StatusCode::CREATED, "created"),
            "{marker}"
        );
        let (_, headers, _) = send(&app, post_req("/tasks", Some(KEY), r#"{"title":"x"}"#)).await;
        assert!(replayed(&headers), "{marker}");
        assert_eq!(runs.load(Ordering::SeqCst), 3, "{marker}");
    }
}

#[tokio::test]
async fn not_stored_works_as_an_axum_response_part() {
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = runs.clone();
    let app = Router::new()
        .route(
            "/x",
            post(move || {
                let runs = counter.clone();
                async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    (StatusCode::BAD_REQUEST, Extension(NotStored), "fix it")
                }
            }),
        )
        .layer(builder().build().expect("valid idempotency layer settings"));
    send(&app, post_req("/x", Some(KEY), "{}")).await;
    let (_, headers, _) = send(&app, post_req("/x", Some(KEY), "{}")).await;
    assert!(!replayed(&headers));
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

// 4. How refusals are written, and the replay marker.

#[tokio::test]
async fn the_stripe_profile_answers_with_stripes_error_envelope() {
    let runs = Arc::new(AtomicUsize::new(0));
    let app = Router::new().route("/charges", counting(&runs)).layer(
        builder()
            .profile(Profile::Stripe)
            .build()
            .expect("valid idempotency layer settings"),
    );
    let (status, headers, body) = send(&app, post_req("/charges", Some("not a uuid"), "{}")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(headers[header::CONTENT_TYPE], "application/json");
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(json["error"]["type"], "idempotency_error");
    assert!(json["error"]["message"].as_str().unwrap().len() > 10);
    // Unauthenticated: not an idempotency error.
    let mut anonymous = post_req("/charges", Some(KEY), "{}");
    anonymous.headers_mut().remove("x-user");
    let (status, _, body) = send(&app, anonymous).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(json["error"]["type"], "invalid_request_error");
}

#[tokio::test]
async fn refusals_go_through_the_applications_renderer_and_keep_retry_after() {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    let gate = Arc::new(tokio::sync::Notify::new());
    let started = Arc::new(tokio::sync::Notify::new());
    let (release, start) = (gate.clone(), started.clone());
    let app = Router::new()
        .route(
            "/slow",
            post(move || {
                let (gate, started) = (release.clone(), start.clone());
                async move {
                    started.notify_one();
                    gate.notified().await;
                    "done"
                }
            }),
        )
        .layer(
            builder()
                .render_refusals(move |refusal: &Refusal| {
                    log.lock().unwrap().push(refusal.kind());
                    http::Response::builder()
                        .status(refusal.status())
                        .header("content-type", "text/plain")
                        .body(Bytes::from(format!(
                            "{}: {}",
                            refusal.code(),
                            refusal.detail()
                        )))
                        .unwrap()
                })
                .replay_header(HeaderName::from_static("x-replayed"))
                .build()
                .expect("valid idempotency layer settings"),
        );
    let (status, _, body) = send(&app, post_req("/slow", None, "{}")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body.starts_with("idempotency_key_missing: "), "{body}");

    let first = tokio::spawn({
        let app = app.clone();
        async move { send(&app, post_req("/slow", Some(KEY), "{}")).await }
    });
    // Once the first request holds the key and runs, send the duplicate.
    started.notified().await;
    let conflict = send(&app, post_req("/slow", Some(KEY), "{}")).await;
    assert_eq!(conflict.0, StatusCode::CONFLICT);
    assert!(
        conflict.2.starts_with("idempotency_key_in_flight: "),
        "{}",
        conflict.2
    );
    // The renderer did not set Retry-After; the layer did.
    assert!(conflict.1.contains_key(header::RETRY_AFTER));
    gate.notify_one();
    assert_eq!(first.await.unwrap().2, "done");
    let (_, headers, body) = send(&app, post_req("/slow", Some(KEY), "{}")).await;
    assert_eq!(body, "done");
    assert_eq!(headers["x-replayed"], "true");
    assert!(!headers.contains_key("idempotent-replayed"));
    let seen = seen.lock().unwrap();
    assert_eq!(seen.first(), Some(&RefusalKind::KeyMissing));
    assert!(seen.contains(&RefusalKind::InFlight));
}

// 5. Routing: per route, route_layer, ServiceBuilder, a coverage predicate, nest.

#[tokio::test]
async fn the_layer_works_per_route_with_route_layer_and_in_a_service_builder() {
    let runs = Arc::new(AtomicUsize::new(0));
    let app = Router::new()
        // One route only: MethodRouter::layer.
        .route(
            "/one",
            counting(&runs).layer(builder().build().expect("valid idempotency layer settings")),
        )
        // Not covered.
        .route("/free", counting(&runs));
    send(&app, post_req("/one", Some(KEY), "{}")).await;
    assert!(replayed(
        &send(&app, post_req("/one", Some(KEY), "{}")).await.1
    ));
    send(&app, post_req("/free", Some(KEY), "{}")).await;
    assert!(!replayed(
        &send(&app, post_req("/free", Some(KEY), "{}")).await.1
    ));
    assert_eq!(runs.load(Ordering::SeqCst), 3);

    // route_layer: only matched routes are covered; an unknown path is still 404, not 400.
    let runs = Arc::new(AtomicUsize::new(0));
    let app = Router::new()
        .route("/one", counting(&runs))
        .route_layer(builder().build().expect("valid idempotency layer settings"));
    assert_eq!(
        send(&app, post_req("/nowhere", None, "{}")).await.0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        send(&app, post_req("/one", None, "{}")).await.0,
        StatusCode::BAD_REQUEST
    );
    send(&app, post_req("/one", Some(KEY), "{}")).await;
    assert!(replayed(
        &send(&app, post_req("/one", Some(KEY), "{}")).await.1
    ));
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // In a ServiceBuilder stack with other layers.
    let runs = Arc::new(AtomicUsize::new(0));
    let app = Router::new().route("/one", counting(&runs)).layer(
        tower::ServiceBuilder::new()
            .layer(tower::limit::ConcurrencyLimitLayer::new(64))
            .layer(builder().build().expect("valid idempotency layer settings")),
    );
    send(&app, post_req("/one", Some(KEY), "{}")).await;
    assert!(replayed(
        &send(&app, post_req("/one", Some(KEY), "{}")).await.1
    ));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn cover_if_leaves_other_requests_untouched() {
    let runs = Arc::new(AtomicUsize::new(0));
    let app = Router::new()
        .route("/payments", counting(&runs))
        .route("/webhooks", counting(&runs))
        .layer(
            builder()
                .cover_if(|parts| parts.uri.path().starts_with("/payments"))
                .build()
                .expect("valid idempotency layer settings"),
        );
    // Not covered: no key needed, every request runs.
    assert_eq!(
        send(&app, post_req("/webhooks", None, "{}")).await.0,
        StatusCode::CREATED
    );
    send(&app, post_req("/webhooks", Some(KEY), "{}")).await;
    send(&app, post_req("/webhooks", Some(KEY), "{}")).await;
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    // Covered.
    assert_eq!(
        send(&app, post_req("/payments", None, "{}")).await.0,
        StatusCode::BAD_REQUEST
    );
    send(&app, post_req("/payments", Some(KEY), "{}")).await;
    assert!(replayed(
        &send(&app, post_req("/payments", Some(KEY), "{}")).await.1
    ));
    assert_eq!(runs.load(Ordering::SeqCst), 4);
}

#[tokio::test]
async fn under_nest_the_fingerprint_sees_the_path_the_client_sent() {
    // The same inner router under two prefixes, the layer inside the nest. The request to
    // /v2/tasks with the key used on /v1/tasks is another request, never /v1's response.
    let runs = Arc::new(AtomicUsize::new(0));
    let tasks = Router::new()
        .route("/tasks", counting(&runs))
        .layer(builder().build().expect("valid idempotency layer settings"));
    let app = Router::new().nest("/v1", tasks.clone()).nest("/v2", tasks);
    assert_eq!(
        send(&app, post_req("/v1/tasks", Some(KEY), "{}")).await.2,
        "run 1"
    );
    let (status, headers, body) = send(&app, post_req("/v2/tasks", Some(KEY), "{}")).await;
    assert!(!replayed(&headers), "/v2 got /v1's response: {body}");
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(replayed(
        &send(&app, post_req("/v1/tasks", Some(KEY), "{}")).await.1
    ));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

// 6. Graceful shutdown: drain waits for a handler whose client left.

#[tokio::test]
async fn drain_waits_for_a_handler_whose_client_left_and_its_response_is_stored() {
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = runs.clone();
    let layer = builder().build().expect("valid idempotency layer settings");
    let drain = layer.drain();
    let app = Router::new()
        .route(
            "/slow",
            post(move || {
                let runs = counter.clone();
                async move {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    runs.fetch_add(1, Ordering::SeqCst);
                    (StatusCode::CREATED, "slow done")
                }
            }),
        )
        .layer(layer);
    // The client gives up after 50 ms: its request future is dropped mid-handler.
    let gave_up = tokio::time::timeout(
        Duration::from_millis(50),
        send(&app, post_req("/slow", Some(KEY), "{}")),
    )
    .await;
    assert!(gave_up.is_err());
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "the handler is still running"
    );
    assert!(drain.running() >= 1, "the detached handler is tracked");
    tokio::time::timeout(Duration::from_secs(10), drain.drained())
        .await
        .expect("the detached handler finishes");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(drain.running(), 0);
    // Its response was stored before drain returned: the retry replays it.
    let (status, headers, body) = send(&app, post_req("/slow", Some(KEY), "{}")).await;
    assert_eq!((status, body.as_str()), (StatusCode::CREATED, "slow done"));
    assert!(replayed(&headers));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

// A bare hyper service, with hyper's own `Incoming` body and the lease as a request extension.

#[tokio::test]
async fn the_layer_serves_a_bare_hyper_service_with_incoming_bodies() {
    use http_body_util::Full;
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use idempotency_tower::RequestBody;

    let runs = Arc::new(AtomicUsize::new(0));
    let counter = runs.clone();
    let service = tower::ServiceBuilder::new()
        .layer(
            IdempotencyLayer::builder(MemoryStore::default())
                .unscoped()
                .build()
                .expect("valid idempotency layer settings"),
        )
        .service_fn(move |request: http::Request<RequestBody>| {
            let runs = counter.clone();
            async move {
                let claim = request.extensions().get::<KeyClaim>().cloned();
                let body = request.into_body().collect().await?.to_bytes();
                let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
                let text = format!(
                    "run {n} key {} body {}",
                    claim
                        .map(|l| l.key().as_str().to_owned())
                        .unwrap_or_default(),
                    String::from_utf8_lossy(&body)
                );
                Ok::<_, idempotency_tower::BoxError>(http::Response::new(Full::new(Bytes::from(
                    text,
                ))))
            }
        });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let service = hyper_util::service::TowerToHyperService::new(service.clone());
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service),
            );
        }
    });

    let client = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .build_http::<Full<Bytes>>();
    let call = |key: &str| {
        let request = http::Request::post(format!("http://{address}/anything"))
            .header("idempotency-key", key)
            .body(Full::new(Bytes::from_static(b"hello")))
            .unwrap();
        let client = client.clone();
        async move {
            let response = client.request(request).await.unwrap();
            let replayed = replayed(response.headers());
            let body = response.into_body().collect().await.unwrap().to_bytes();
            (replayed, String::from_utf8_lossy(&body).into_owned())
        }
    };
    assert_eq!(
        call(KEY).await,
        (false, format!("run 1 key {KEY} body hello"))
    );
    assert_eq!(
        call(KEY).await,
        (true, format!("run 1 key {KEY} body hello"))
    );
    assert_eq!(
        call(OTHER_KEY).await.1,
        format!("run 2 key {OTHER_KEY} body hello")
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn an_unknown_method_to_the_layer_is_passed_through() {
    // The layer covers POST, PATCH and DELETE by default; `methods` changes that.
    let runs = Arc::new(AtomicUsize::new(0));
    let app = Router::new().route("/x", counting(&runs)).layer(
        builder()
            .methods([Method::PATCH])
            .build()
            .expect("valid idempotency layer settings"),
    );
    send(&app, post_req("/x", Some(KEY), "{}")).await;
    assert!(!replayed(
        &send(&app, post_req("/x", Some(KEY), "{}")).await.1
    ));
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}
