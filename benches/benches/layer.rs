//! A full request through the layer, against the same handler without it:
//! `cargo bench -p idempotency-bench --bench layer`. The difference is the layer's added
//! latency: key parsing, body buffering, fingerprint, claim and complete (or the replay).

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::routing::post;
use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use http_body_util::BodyExt;
use idempotency::{IdempotencyLayer, IdempotencyStore, Scope};
use idempotency_bench::{Servers, Target, bench_runtime, connect};
use std::sync::Arc;
use std::time::Duration;
use tower::ServiceExt;

const BODY: &str = r#"{"title":"Buy milk"}"#;
const USER: &str = "6f1c2e0a-5d4b-4c3e-9a8f-1b2c3d4e5f60";

#[derive(Clone)]
struct User;

impl From<User> for Scope {
    fn from(_: User) -> Scope {
        Scope::new(USER).unwrap_or_else(|_| unreachable!("a UUID is a valid scope"))
    }
}

fn handler() -> Router {
    Router::new().route(
        "/tasks",
        post(|body: axum::body::Bytes| async move {
            (
                StatusCode::CREATED,
                [
                    ("content-type", "application/json"),
                    ("location", "/tasks/1"),
                ],
                format!(r#"{{"id":1,"request":{}}}"#, String::from_utf8_lossy(&body)),
            )
        }),
    )
}

fn request(key: &str) -> Request<Body> {
    let mut request = Request::post("/tasks")
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(Body::from(BODY))
        .unwrap_or_else(|e| panic!("request: {e}"));
    request.extensions_mut().insert(User);
    request
}

async fn send(app: &Router, request: Request<Body>) {
    let response = app
        .clone()
        .oneshot(request)
        .await
        .unwrap_or_else(|e| match e {});
    assert!(response.status().is_success());
    let _ = response.into_body().collect().await;
}

fn layer(c: &mut Criterion) {
    let runtime = bench_runtime();
    let servers = Servers::default();
    let mut group = c.benchmark_group("request");
    let bare = handler();
    group.bench_function(BenchmarkId::new("bare_handler", "no_layer"), |b| {
        b.to_async(&runtime)
            .iter(|| send(&bare, request(&uuid::Uuid::new_v4().to_string())))
    });
    for target in Target::ALL {
        let connected = match runtime.block_on(connect(target, &servers, 4)) {
            Ok(c) => c,
            Err(why) => {
                eprintln!("skipping {}: {why}", target.name());
                continue;
            }
        };
        let store: Arc<dyn IdempotencyStore> = Arc::clone(&connected.store);
        let app = handler().layer(
            IdempotencyLayer::builder(store)
                .scope_from_extension::<User>()
                .build()
                .expect("valid idempotency layer settings"),
        );
        group.bench_function(BenchmarkId::new("first_request", target.name()), |b| {
            b.to_async(&runtime)
                .iter(|| send(&app, request(&uuid::Uuid::new_v4().to_string())))
        });
        let key = uuid::Uuid::new_v4().to_string();
        runtime.block_on(send(&app, request(&key)));
        group.bench_function(BenchmarkId::new("replay", target.name()), |b| {
            b.to_async(&runtime).iter(|| send(&app, request(&key)))
        });
        runtime.block_on(connected.cleanup());
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    targets = layer
}
criterion_main!(benches);
