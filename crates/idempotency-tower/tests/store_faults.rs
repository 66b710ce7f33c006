//! Faults of the store and of the handler's thread around the side effect, on the memory store
//! wrapped in a fault injector: for each, what the client sees and how many times the side effect
//! ran.
#![allow(clippy::unwrap_used)]

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderValue, Method, Request, StatusCode};
use axum::routing::post;
use bytes::Bytes;
use http_body_util::BodyExt;
use idempotency_conformance::faults::{Fault, FaultyStore, StoreOp};
use idempotency_core::{ClaimMode, ConfigError, Scope};
use idempotency_memory::MemoryStore;
use idempotency_tower::{IdempotencyLayer, IdempotencyLayerBuilder, ScopeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tower::ServiceExt;

type Store = FaultyStore<MemoryStore>;
type Builder = IdempotencyLayerBuilder<Store, ScopeSet>;

#[derive(Clone)]
struct User;

/// An app whose routes count their side effects in `runs`:
/// - `/orders` runs at once;
/// - `/slow` takes 1 s;
/// - `/blocking` blocks its worker thread for 1.5 s (`std::thread::sleep`);
/// - `/streaming` answers its head at once and its body in three chunks 500 ms apart.
fn app(
    store: &Store,
    runs: &Arc<AtomicUsize>,
    configure: impl FnOnce(Builder) -> Builder,
) -> Router {
    let layer = configure(
        IdempotencyLayer::builder(store.clone()).scope_with(|parts| {
            parts
                .extensions
                .get::<User>()
                .map(|_| Scope::new("alice").unwrap())
        }),
    )
    .build()
    .expect("valid idempotency layer settings");
    let counted = |runs: &Arc<AtomicUsize>| {
        let runs = runs.clone();
        move || runs.fetch_add(1, Ordering::SeqCst) + 1
    };
    let (orders, slow, blocking, streaming) =
        (counted(runs), counted(runs), counted(runs), counted(runs));
    Router::new()
        .route(
            "/orders",
            post(move || async move { (StatusCode::CREATED, format!("order {}", orders())) }),
        )
        .route(
            "/slow",
            post(move || async move {
                tokio::time::sleep(Duration::from_secs(1)).await;
                (StatusCode::CREATED, format!("slow {}", slow()))
            }),
        )
        .route(
            "/blocking",
            post(move || async move {
                let n = blocking();
                std::thread::sleep(Duration::from_millis(1500));
                (StatusCode::CREATED, format!("blocking {n}"))
            }),
        )
        .route(
            "/streaming",
            post(move || async move {
                let n = streaming();
                let chunks = futures_util::stream::unfold(0, move |i| async move {
                    if i == 3 {
                        return None;
                    }
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    Some((
                        Ok::<_, std::io::Error>(Bytes::from(format!("{n}.{i} "))),
                        i + 1,
                    ))
                });
                (StatusCode::CREATED, Body::from_stream(chunks))
            }),
        )
        .layer(layer)
}

const KEY: &str = "8e03978e-40d5-43e8-bc93-6894a57f9324";

fn post_to(path: &str) -> Request<Body> {
    let mut request = Request::builder()
        .method(Method::POST)
        .uri(path)
        .header("idempotency-key", KEY)
        .body(Body::from("{}"))
        .unwrap();
    request.extensions_mut().insert(User);
    request
}

async fn send(app: &Router, request: Request<Body>) -> (StatusCode, Bytes) {
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    (
        status,
        response.into_body().collect().await.unwrap().to_bytes(),
    )
}

/// Sends `path` until it is answered with something other than 409, for up to `within`.
async fn until_not_conflict(app: &Router, path: &str, within: Duration) -> (StatusCode, Bytes) {
    let until = Instant::now() + within;
    loop {
        let (status, body) = send(app, post_to(path)).await;
        if status != StatusCode::CONFLICT || Instant::now() > until {
            return (status, body);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The store fails when the response is stored: the client still gets the handler's response,
/// the claim is kept (a retry gets 409, never a second run), and once the store is back the
/// response is stored in the background and replayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_completion_keeps_the_claim_and_stores_the_response_later() {
    for fault in [Fault::Fail, Fault::Hang] {
        let store = FaultyStore::new(MemoryStore::default());
        let runs = Arc::new(AtomicUsize::new(0));
        let app = app(&store, &runs, |b| {
            b.lease(Duration::from_secs(30))
                .store_timeout(Duration::from_millis(200))
        });
        store.set(StoreOp::Complete, fault);
        let (status, body) = send(&app, post_to("/orders")).await;
        assert_eq!((status, &body[..]), (StatusCode::CREATED, &b"order 1"[..]));
        let (status, _) = send(&app, post_to("/orders")).await;
        assert_eq!(
            status,
            StatusCode::CONFLICT,
            "{fault:?}: the side effect exists, so its key must stay claimed"
        );
        store.clear(StoreOp::Complete);
        let (status, body) = until_not_conflict(&app, "/orders", Duration::from_secs(5)).await;
        assert_eq!((status, &body[..]), (StatusCode::CREATED, &b"order 1"[..]));
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{fault:?}: ran twice");
    }
}

/// `fail_open` runs a request unguarded only when the store cannot be reached. A store that
/// answered with a corrupt record (which exists, and may be a completed request) gets 503 and
/// the handler does not run; an unreachable one still fails open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_open_runs_nothing_when_the_store_answered() {
    let store = FaultyStore::new(MemoryStore::default());
    let runs = Arc::new(AtomicUsize::new(0));
    let app = app(&store, &runs, |b| b.fail_open(true));
    // The first request completes; then its record reads as corrupt.
    assert_eq!(send(&app, post_to("/orders")).await.0, StatusCode::CREATED);
    store.set(StoreOp::Claim, Fault::Corrupt);
    let (status, _) = send(&app, post_to("/orders")).await;
    assert_eq!(
        status,
        StatusCode::SERVICE_UNAVAILABLE,
        "a corrupt record is no reason to run the request again"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "ran twice");
    // Unreachable: fail open runs it (the documented trade).
    store.set(StoreOp::Claim, Fault::Fail);
    assert_eq!(send(&app, post_to("/orders")).await.0, StatusCode::CREATED);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// A duplicate that waits for the running request (`in_flight_wait`) longer than one store call
/// may take is answered from the first request, never 503, and fail-open never runs it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_for_a_running_request_is_not_a_store_timeout() {
    for fail_open in [false, true] {
        let store = FaultyStore::new(MemoryStore::default());
        let runs = Arc::new(AtomicUsize::new(0));
        let app = app(&store, &runs, |b| {
            b.in_flight_wait(Duration::from_secs(3))
                .store_timeout(Duration::from_millis(300))
                .fail_open(fail_open)
        });
        let first = tokio::spawn({
            let app = app.clone();
            async move { send(&app, post_to("/slow")).await }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        let (status, body) = send(&app, post_to("/slow")).await;
        assert_eq!(
            (status, &body[..]),
            (StatusCode::CREATED, &b"slow 1"[..]),
            "fail_open({fail_open}): the waiting duplicate must get the first response"
        );
        assert_eq!(first.await.unwrap().0, StatusCode::CREATED);
        assert_eq!(
            runs.load(Ordering::SeqCst),
            1,
            "fail_open({fail_open}): ran twice"
        );
    }
}

/// The claim reaches the store but its answer is delayed by 600 ms; `first` is the client's
/// first request. Then a retry, 500 ms after the answer, must run: the claim nobody saw must not
/// block the key for its 30 s lease.
async fn claim_answer_lost(store_timeout: Duration, first: impl AsyncFnOnce(&Router)) {
    let store = FaultyStore::new(MemoryStore::default());
    let runs = Arc::new(AtomicUsize::new(0));
    let app = app(&store, &runs, |b| {
        b.lease(Duration::from_secs(30))
            .store_timeout(store_timeout)
    });
    store.set(
        StoreOp::Claim,
        Fault::DelayAfter(Duration::from_millis(600)),
    );
    first(&app).await;
    store.clear(StoreOp::Claim);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let (status, body) = send(&app, post_to("/orders")).await;
    assert_eq!(
        (status, &body[..]),
        (StatusCode::CREATED, &b"order 1"[..]),
        "the key must not stay blocked by a claim nobody holds"
    );
}

/// The store takes the claim but its answer comes after the store timeout: the client gets 503,
/// and the claim it never saw is given back at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_whose_answer_timed_out_is_released() {
    claim_answer_lost(Duration::from_millis(200), async |app: &Router| {
        let (status, _) = send(app, post_to("/orders")).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    })
    .await;
}

/// The client goes away while the claim is on its way: the claim it never saw is given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_cut_off_by_a_gone_client_is_released() {
    claim_answer_lost(Duration::from_secs(5), async |app: &Router| {
        let gone =
            tokio::time::timeout(Duration::from_millis(50), send(app, post_to("/orders"))).await;
        assert!(gone.is_err(), "the client left before the answer");
    })
    .await;
}

/// Starts `path` (a handler slower than the 600 ms lease), sends its duplicate after 1 s, and
/// returns the duplicate's status and the first request's answer.
async fn duplicate_after_the_first_lease(path: &str) -> (StatusCode, (StatusCode, Bytes)) {
    let store = FaultyStore::new(MemoryStore::default());
    let runs = Arc::new(AtomicUsize::new(0));
    let app = app(&store, &runs, |b| {
        b.lease(Duration::from_millis(600))
            .store_timeout(Duration::from_millis(200))
    });
    duplicate_after_the_first_lease_on(&app, &runs, path).await
}

async fn duplicate_after_the_first_lease_on(
    app: &Router,
    runs: &Arc<AtomicUsize>,
    path: &str,
) -> (StatusCode, (StatusCode, Bytes)) {
    let before = runs.load(Ordering::SeqCst);
    let first = tokio::spawn({
        let (app, path) = (app.clone(), path.to_owned());
        async move { send(&app, post_to(&path)).await }
    });
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let (duplicate, _) = send(app, post_to(path)).await;
    let first = first.await.unwrap();
    if duplicate == StatusCode::CONFLICT {
        let (status, body) = send(app, post_to(path)).await;
        assert_eq!(
            (status, &body),
            (first.0, &first.1),
            "the retry replays the first answer"
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst) - before, 1, "{path} ran twice");
    (duplicate, first)
}

/// A handler that blocks its worker thread for longer than the lease keeps its key: the
/// heartbeat runs on its own task.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_handler_blocking_its_thread_keeps_its_lease() {
    let (duplicate, first) = duplicate_after_the_first_lease("/blocking").await;
    assert_eq!(
        duplicate,
        StatusCode::CONFLICT,
        "the running request was taken over"
    );
    assert_eq!(first.0, StatusCode::CREATED);
}

/// The same when earlier requests already started the engine's heartbeat driver and it sits
/// idle: registering the blocking request must not leave the driver queued behind the blocked
/// thread (where no other worker could run it).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_handler_blocking_its_thread_keeps_its_lease_after_other_requests() {
    let store = FaultyStore::new(MemoryStore::default());
    let runs = Arc::new(AtomicUsize::new(0));
    let app = app(&store, &runs, |b| {
        b.lease(Duration::from_millis(600))
            .store_timeout(Duration::from_millis(200))
    });
    for i in 0..3 {
        let mut request = post_to("/orders");
        request.headers_mut().insert(
            "idempotency-key",
            HeaderValue::from_str(&format!("8e03978e-40d5-43e8-bc93-6894a57f93{i:02}")).unwrap(),
        );
        assert_eq!(send(&app, request).await.0, StatusCode::CREATED);
    }
    // The driver has started, found nothing due and is waiting.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (duplicate, first) = duplicate_after_the_first_lease_on(&app, &runs, "/blocking").await;
    assert_eq!(
        duplicate,
        StatusCode::CONFLICT,
        "the running request was taken over"
    );
    assert_eq!(first.0, StatusCode::CREATED);
}

/// A layer built once and used on a second runtime after the first one shut down (tests, or a
/// server restarted in-process): the heartbeat driver died with the first runtime, and the
/// next request starts a new one, so a slow request there still keeps its key.
#[test]
fn the_heartbeat_survives_the_runtime_that_started_it() {
    let store = FaultyStore::new(MemoryStore::default());
    let runs = Arc::new(AtomicUsize::new(0));
    let app = app(&store, &runs, |b| {
        b.lease(Duration::from_millis(600))
            .store_timeout(Duration::from_millis(200))
    });
    let runtime = || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    };
    let first = runtime();
    first.block_on(async {
        let mut request = post_to("/orders");
        request.headers_mut().insert(
            "idempotency-key",
            HeaderValue::from_static("8e03978e-40d5-43e8-bc93-6894a57f9300"),
        );
        assert_eq!(send(&app, request).await.0, StatusCode::CREATED);
    });
    drop(first);
    let (duplicate, first) =
        runtime().block_on(duplicate_after_the_first_lease_on(&app, &runs, "/blocking"));
    assert_eq!(
        duplicate,
        StatusCode::CONFLICT,
        "the running request was taken over"
    );
    assert_eq!(first.0, StatusCode::CREATED);
}

/// The same when the first runtime shuts down before any of its workers polled the heartbeat
/// driver that its request started (a runtime dropped under load right after serving): the
/// driver's task is dropped unpolled, and the next runtime's requests still get a driver.
#[test]
fn the_heartbeat_survives_a_runtime_that_never_ran_its_driver() {
    let store = FaultyStore::new(MemoryStore::default());
    let runs = Arc::new(AtomicUsize::new(0));
    let app = app(&store, &runs, |b| {
        b.lease(Duration::from_millis(600))
            .store_timeout(Duration::from_millis(200))
    });
    // A runtime nobody drives: the request runs on this thread, so the driver task it spawns
    // is never polled before the runtime goes away.
    let first = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    {
        let _entered = first.enter();
        let mut request = post_to("/orders");
        request.headers_mut().insert(
            "idempotency-key",
            HeaderValue::from_static("8e03978e-40d5-43e8-bc93-6894a57f9300"),
        );
        assert_eq!(poll_here(send(&app, request)).0, StatusCode::CREATED);
    }
    drop(first);
    let (duplicate, first) = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(duplicate_after_the_first_lease_on(&app, &runs, "/blocking"));
    assert_eq!(
        duplicate,
        StatusCode::CONFLICT,
        "the running request was taken over"
    );
    assert_eq!(first.0, StatusCode::CREATED);
}

/// Runs `future` to completion on this thread, outside any runtime's scheduler.
fn poll_here<F: std::future::Future>(future: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Arc::new(Unpark(std::thread::current())).into();
    let mut context = std::task::Context::from_waker(&waker);
    let mut future = std::pin::pin!(future);
    loop {
        if let std::task::Poll::Ready(output) = future.as_mut().poll(&mut context) {
            return output;
        }
        std::thread::park();
    }
}

/// Extensions that reach the store but whose answers come after the store timeout (a slow
/// link) are errors to the heartbeat, though the store's lease was extended each time. The
/// heartbeat keeps trying after the lease ran out by this process's clock, its next extension
/// lands, and the request keeps its key: a retry gets 409 and the handler runs once. (Before,
/// the heartbeat gave up at the local deadline, the store's lease then ran out while the
/// request was still sending its body, and the retry ran it a second time.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heartbeat_whose_answers_time_out_keeps_trying_after_the_local_deadline() {
    let store = FaultyStore::new(MemoryStore::default());
    let runs = Arc::new(AtomicUsize::new(0));
    let app = app(&store, &runs, |b| {
        b.lease(Duration::from_millis(600))
            .store_timeout(Duration::from_millis(200))
    });
    store.set(
        StoreOp::Extend,
        Fault::DelayAfter(Duration::from_millis(300)),
    );
    let first = tokio::spawn({
        let app = app.clone();
        async move { send(&app, post_to("/streaming")).await }
    });
    tokio::time::sleep(Duration::from_millis(900)).await;
    store.clear(StoreOp::Extend);
    tokio::time::sleep(Duration::from_millis(400)).await;
    let (duplicate, _) = send(&app, post_to("/streaming")).await;
    assert_eq!(
        duplicate,
        StatusCode::CONFLICT,
        "the running request was taken over"
    );
    let (status, body) = first.await.unwrap();
    assert_eq!(
        (status, &body[..]),
        (StatusCode::CREATED, &b"1.0 1.1 1.2 "[..])
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "ran twice");
}

/// A response whose body takes longer than the lease to arrive keeps its key until the body is
/// stored: the heartbeat covers the whole request, not only the handler's head.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_response_body_keeps_its_lease_until_stored() {
    let (duplicate, first) = duplicate_after_the_first_lease("/streaming").await;
    assert_eq!(
        duplicate,
        StatusCode::CONFLICT,
        "the running request was taken over"
    );
    assert_eq!(
        (first.0, &first.1[..]),
        (StatusCode::CREATED, &b"1.0 1.1 1.2 "[..])
    );
}

/// The handler finds its claim in the request extensions: its key, its fencing token (which the
/// store accepts), and a future that resolves when the lease is lost, here because the store
/// refuses every heartbeat.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_sees_its_token_and_when_its_lease_is_lost() {
    use axum::Extension;
    use idempotency_core::{IdempotencyStore, KeyClaim};
    let store = FaultyStore::new(MemoryStore::default());
    let layer = IdempotencyLayer::builder(store.clone())
        .scope_with(|_| Some(Scope::new("alice").unwrap()))
        .lease(Duration::from_millis(600))
        .store_timeout(Duration::from_millis(200))
        .build()
        .expect("valid idempotency layer settings");
    let inner = store.inner().clone();
    let seen = Arc::new(std::sync::Mutex::new(String::new()));
    let app = Router::new()
        .route(
            "/watch",
            post({
                let seen = seen.clone();
                move |Extension(claim): Extension<KeyClaim>| async move {
                    assert_eq!(claim.key().as_str(), KEY);
                    assert!(claim.is_held());
                    let by_token = inner
                        .extend(claim.scope(), claim.key(), claim.token(), Duration::from_millis(600))
                        .await
                        .unwrap();
                    let started = Instant::now();
                    let what = tokio::select! {
                        () = claim.lost() => {
                            assert!(!claim.is_held());
                            format!("{by_token:?}; lost after {} ms", started.elapsed().as_millis() / 100 * 100)
                        }
                        () = tokio::time::sleep(Duration::from_secs(5)) => "kept".to_owned(),
                    };
                    *seen.lock().unwrap() = what.clone();
                    what
                }
            }),
        )
        .layer(layer);
    store.set(StoreOp::Extend, Fault::Fail);
    let (status, body) = send(&app, post_to("/watch")).await;
    let what = seen.lock().unwrap().clone();
    assert!(what.starts_with("Applied; lost after "), "{what}");
    // Its lease lost, its response is not what the key stands for: the client is told to retry.
    assert_eq!(
        status,
        StatusCode::CONFLICT,
        "{}",
        String::from_utf8_lossy(&body)
    );
    assert!(
        store.calls(StoreOp::Extend) > 0,
        "the heartbeat must have tried"
    );
}

/// A short lease alone builds: the store timeout left unset shrinks to a third of it. A store
/// timeout set explicitly that one hung heartbeat could outlast is refused at build.
#[test]
fn a_short_lease_shrinks_an_unset_store_timeout_and_refuses_a_set_one() {
    let builder = || {
        IdempotencyLayer::builder(MemoryStore::default())
            .scope_with(|_| Some(Scope::new("alice").unwrap()))
            .lease(Duration::from_secs(6))
    };
    let layer = builder().build().expect("valid idempotency layer settings");
    assert_eq!(
        layer.engine().config().store_timeout,
        Duration::from_secs(2)
    );
    let long = IdempotencyLayer::builder(MemoryStore::default())
        .scope_with(|_| Some(Scope::new("alice").unwrap()))
        .build()
        .expect("valid idempotency layer settings");
    assert_eq!(long.engine().config().store_timeout, Duration::from_secs(5));
    let refused = builder()
        .store_timeout(Duration::from_secs(5))
        .build()
        .expect_err("a set store timeout the lease cannot hold is refused");
    assert_eq!(
        refused,
        ConfigError::LeaseTooShort {
            lease: Duration::from_secs(6),
            store_timeout: Duration::from_secs(5)
        }
    );
    assert!(
        refused.to_string().contains("at least 3 store timeouts"),
        "{refused}"
    );
}

/// Every misconfiguration is refused by `build()`, with what was set and what to do, never
/// answered per request: a one-transaction mode on a store that cannot hold a key in a
/// transaction (before: a log line, then 503 for every covered request), and the speculative
/// mode with a wait (before: it silently ran as the one-transaction mode). A built layer says
/// which mode it runs.
#[test]
fn misconfigurations_are_refused_when_the_layer_is_built() {
    let builder = || {
        IdempotencyLayer::builder(MemoryStore::default())
            .scope_with(|_| Some(Scope::new("alice").unwrap()))
    };
    for mode in [
        ClaimMode::OneTransaction,
        ClaimMode::OneTransactionSpeculative,
    ] {
        let refused = builder()
            .claim_mode(mode)
            .build()
            .expect_err("the memory store cannot hold a key in a transaction");
        assert_eq!(
            refused,
            ConfigError::OneTransactionUnsupported {
                mode,
                backend: "memory"
            }
        );
        assert!(
            refused.to_string().contains("use ClaimMode::Lease"),
            "{refused}"
        );
    }
    let waiting = builder()
        .claim_mode(ClaimMode::OneTransactionSpeculative)
        .in_flight_wait(Duration::from_secs(2))
        .build()
        .expect_err("the speculative mode cannot wait");
    assert_eq!(
        waiting,
        ConfigError::SpeculativeCannotWait {
            wait: Duration::from_secs(2)
        }
    );
    let layer = builder().build().expect("the defaults are valid");
    assert_eq!(layer.claim_mode(), ClaimMode::Lease);
}
