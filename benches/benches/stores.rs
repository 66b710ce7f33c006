//! Each store step on every reachable store, side by side: `cargo bench -p idempotency-bench
//! --bench stores`. Unreachable stores are skipped with one line each.

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use idempotency::store::{ClaimOutcome, LeaseToken};
use idempotency::{IdempotencyStore, MemoryStore, ReplayTier};
use idempotency_bench::{
    Connected, LEASE, RETENTION, Servers, Target, bench_fingerprint, bench_response, bench_runtime,
    bench_scope, connect, fresh_key,
};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn stores(c: &mut Criterion) {
    let runtime = bench_runtime();
    let servers = Servers::default();
    let mut connected: Vec<(Target, Connected)> = Vec::new();
    for target in Target::ALL {
        match runtime.block_on(connect(target, &servers, 4)) {
            Ok(store) => connected.push((target, store)),
            Err(why) => eprintln!("skipping {}: {why}", target.name()),
        }
    }
    let scope = bench_scope();
    let fp = bench_fingerprint();
    let response = bench_response();

    let mut group = c.benchmark_group("claim_fresh");
    for (target, store) in &connected {
        let store = &store.store;
        group.bench_function(BenchmarkId::from_parameter(target.name()), |b| {
            b.to_async(&runtime).iter_custom(|iters| {
                let scope = scope.clone();
                async move {
                    let mut measured = Duration::ZERO;
                    for _ in 0..iters {
                        let (key, token) = (fresh_key(), LeaseToken::new());
                        let started = Instant::now();
                        let outcome = store.claim(&scope, &key, &fp, token, LEASE).await;
                        measured += started.elapsed();
                        assert!(matches!(outcome, Ok(ClaimOutcome::Claimed)));
                        // Not measured: give the key back so the store does not fill up.
                        let _ = store.release(&scope, &key, token).await;
                    }
                    measured
                }
            })
        });
    }
    group.finish();

    let mut group = c.benchmark_group("complete");
    for (target, store) in &connected {
        let store = &store.store;
        group.bench_function(BenchmarkId::from_parameter(target.name()), |b| {
            b.to_async(&runtime).iter_custom(|iters| {
                let (scope, response) = (scope.clone(), response.clone());
                async move {
                    let mut measured = Duration::ZERO;
                    for _ in 0..iters {
                        let (key, token) = (fresh_key(), LeaseToken::new());
                        let _ = store.claim(&scope, &key, &fp, token, LEASE).await;
                        let started = Instant::now();
                        let done = store
                            .complete(&scope, &key, token, &response, RETENTION)
                            .await;
                        measured += started.elapsed();
                        assert!(done.is_ok());
                    }
                    measured
                }
            })
        });
    }
    group.finish();

    let mut group = c.benchmark_group("replay");
    for (target, store) in &connected {
        let store = &store.store;
        let key = fresh_key();
        let token = LeaseToken::new();
        runtime.block_on(async {
            let _ = store.claim(&scope, &key, &fp, token, LEASE).await;
            let _ = store
                .complete(&scope, &key, token, &response, RETENTION)
                .await;
        });
        group.bench_function(BenchmarkId::from_parameter(target.name()), |b| {
            b.to_async(&runtime).iter(|| async {
                // A retry's claim finds the completed record: the replay path, one round trip.
                let outcome = store
                    .claim(&scope, &key, &fp, LeaseToken::new(), LEASE)
                    .await;
                assert!(matches!(outcome, Ok(ClaimOutcome::Existing(_))));
            })
        });
        if *target == Target::Memory {
            continue;
        }
        // The same replay answered by a local replay tier in front of the store: no round trip
        // once the record is in the tier (its first replay puts it there).
        let tier = ReplayTier::new(Arc::clone(store));
        group.bench_function(BenchmarkId::new("through_tier", target.name()), |b| {
            b.to_async(&runtime).iter(|| async {
                let outcome = tier
                    .claim(&scope, &key, &fp, LeaseToken::new(), LEASE)
                    .await;
                assert!(matches!(outcome, Ok(ClaimOutcome::Existing(_))));
            })
        });
    }
    group.finish();

    let mut group = c.benchmark_group("release");
    for (target, store) in &connected {
        let store = &store.store;
        group.bench_function(BenchmarkId::from_parameter(target.name()), |b| {
            b.to_async(&runtime).iter_custom(|iters| {
                let scope = scope.clone();
                async move {
                    let mut measured = Duration::ZERO;
                    for _ in 0..iters {
                        let (key, token) = (fresh_key(), LeaseToken::new());
                        let _ = store.claim(&scope, &key, &fp, token, LEASE).await;
                        let started = Instant::now();
                        let released = store.release(&scope, &key, token).await;
                        measured += started.elapsed();
                        assert!(released.is_ok());
                    }
                    measured
                }
            })
        });
    }
    group.finish();

    // `MemoryStore::default()` at its bound (64 MiB): each fresh key's completion evicts a
    // record, as in the HTTP fresh-key workload once it is full. With one scope over its share
    // (the default: an eighth of the bound), the scope's own oldest record goes; without shares
    // (`max_bytes_per_scope(u64::MAX)`), the store's least recently used one: the difference is
    // what the per-scope shares cost on this path.
    let mut group = c.benchmark_group("memory_at_bound");
    let stores = [
        ("claim_complete_evict", MemoryStore::default()),
        (
            "claim_complete_evict_no_shares",
            MemoryStore::builder().max_bytes_per_scope(u64::MAX).build(),
        ),
    ];
    for (name, full) in &stores {
        let store_one = |key, token| {
            let (scope, response) = (&scope, &response);
            async move {
                let claimed = full.claim(scope, &key, &fp, token, LEASE).await;
                assert!(matches!(claimed, Ok(ClaimOutcome::Claimed)));
                let completed = full.complete(scope, &key, token, response, RETENTION).await;
                assert!(completed.is_ok());
            }
        };
        runtime.block_on(async {
            while full.evicted_records() == 0 {
                store_one(fresh_key(), LeaseToken::new()).await;
            }
        });
        group.bench_function(*name, |b| {
            b.to_async(&runtime).iter_custom(|iters| async move {
                let mut measured = Duration::ZERO;
                for _ in 0..iters {
                    let (key, token) = (fresh_key(), LeaseToken::new());
                    let started = Instant::now();
                    store_one(key, token).await;
                    measured += started.elapsed();
                }
                measured
            })
        });
    }
    group.finish();

    for (_, store) in &connected {
        runtime.block_on(store.cleanup());
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    targets = stores
}
criterion_main!(benches);
