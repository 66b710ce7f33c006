//! The typed API's cost on the memory store: `cargo bench -p idempotency-bench --bench once`.
//!
//! Three ways to run the same work (an async fn returning a small struct): called directly;
//! through `Engine::begin` and `Guard::complete` with a hand-made response (the protocol
//! alone); and through `Engine::once` (the protocol plus fingerprinting the input's JSON and
//! storing the value as JSON). A fresh key per call, and a replay of one key.

use bytes::Bytes;
use criterion::{BatchSize, BenchmarkId, Criterion, criterion_group, criterion_main};
use idempotency::http::{HeaderMap, StatusCode};
use idempotency::{
    Begin, Engine, EngineConfig, Fingerprint, IdempotencyKey, KeyFormat, MemoryStore, Outcome,
    Scope, StoredResponse,
};
use idempotency_bench::bench_runtime;
use std::hint::black_box;

#[derive(serde::Serialize)]
struct CreateTask<'a> {
    user: &'a str,
    title: &'a str,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Created {
    id: u64,
}

const INPUT: CreateTask<'static> = CreateTask {
    user: "6f1c2e0a-5d4b-4c3e-9a8f-1b2c3d4e5f60",
    title: "Buy milk",
};

/// The work: what a consumer would do, minus its side effect.
async fn work() -> Result<Created, std::io::Error> {
    Ok(Created { id: black_box(42) })
}

fn fresh_key() -> IdempotencyKey {
    IdempotencyKey::parse(
        uuid::Uuid::new_v4().to_string().as_bytes(),
        KeyFormat::opaque(),
    )
    .unwrap_or_else(|e| panic!("key: {e}"))
}

fn engine() -> Engine<MemoryStore> {
    Engine::new(MemoryStore::builder().build(), EngineConfig::default())
        .expect("valid engine settings")
}

fn once(c: &mut Criterion) {
    let runtime = bench_runtime();
    let scope = Scope::new("bench").unwrap_or_else(|e| panic!("scope: {e}"));
    let mut group = c.benchmark_group("once");

    group.bench_function(BenchmarkId::new("direct_call", "no_engine"), |b| {
        b.to_async(&runtime)
            .iter(|| async { black_box(work().await) })
    });

    let protocol = engine();
    group.bench_function(BenchmarkId::new("begin_complete", "fresh_key"), |b| {
        b.to_async(&runtime).iter_batched(
            fresh_key,
            |key| {
                let (protocol, scope) = (&protocol, scope.clone());
                async move {
                    let input = serde_json::to_vec(&INPUT).unwrap_or_default();
                    let fingerprint = Fingerprint::of_input(&input);
                    let Ok(Begin::Proceed(guard)) = protocol.begin(scope, key, fingerprint).await
                    else {
                        panic!("a fresh key proceeds")
                    };
                    let created = work().await.unwrap_or(Created { id: 0 });
                    let body = Bytes::from(format!("{{\"id\":{}}}", created.id));
                    let response = StoredResponse::new(StatusCode::OK, HeaderMap::new(), body);
                    black_box(guard.complete(response).await)
                }
            },
            BatchSize::SmallInput,
        )
    });

    let typed = engine();
    group.bench_function(BenchmarkId::new("once", "fresh_key"), |b| {
        b.to_async(&runtime).iter_batched(
            fresh_key,
            |key| {
                let (typed, scope) = (&typed, scope.clone());
                async move {
                    let outcome = typed.once(scope, key, &INPUT, |_ctx| work()).await;
                    assert!(matches!(outcome, Ok(Outcome::Ran { .. })));
                    black_box(outcome)
                }
            },
            BatchSize::SmallInput,
        )
    });

    let replayed = engine();
    let key = fresh_key();
    runtime.block_on(async {
        let first = replayed
            .once(scope.clone(), key.clone(), &INPUT, |_ctx| work())
            .await;
        assert!(matches!(first, Ok(Outcome::Ran { .. })));
    });
    group.bench_function(BenchmarkId::new("once", "replay"), |b| {
        b.to_async(&runtime).iter(|| {
            let (replayed, scope, key) = (&replayed, scope.clone(), key.clone());
            async move {
                let outcome = replayed.once(scope, key, &INPUT, |_ctx| work()).await;
                assert!(matches!(outcome, Ok(Outcome::Replayed(_))));
                black_box(outcome)
            }
        })
    });
    group.finish();
}

criterion_group!(benches, once);
criterion_main!(benches);
