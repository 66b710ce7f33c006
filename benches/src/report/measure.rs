//! Measuring: the mixed workload per store and concurrency, the interleaved comparison, the
//! raw-driver floor, and WAL and size per table mode.

mod floor;
mod volume;

pub(crate) use floor::*;
pub(crate) use volume::*;

use hdrhistogram::Histogram;
use idempotency::store::LeaseToken;
use idempotency::{Begin, Completion, Engine, EngineConfig, IdempotencyStore, TableMode};
use idempotency_bench::{
    Connected, Target, bench_fingerprint, bench_response, bench_scope, err, fresh_key, median,
};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// One workload cell.
#[derive(Debug)]
pub(crate) struct Cell {
    pub(crate) target: Target,
    pub(crate) concurrency: usize,
    pub(crate) p50_us: u64,
    pub(crate) p95_us: u64,
    pub(crate) p99_us: u64,
    pub(crate) throughput: f64,
    pub(crate) unexpected: usize,
}

/// Library vs raw driver, interleaved at one client.
#[derive(Debug)]
pub(crate) struct Floor {
    pub(crate) target: Target,
    pub(crate) library_us: f64,
    pub(crate) raw_us: f64,
    pub(crate) ping_us: f64,
    pub(crate) ratio: f64,
}

/// Library vs raw driver with many clients at once: each side runs `clients` tasks doing
/// claim+complete of fresh keys on the store's pool of `pool` connections, the library through
/// its API, the raw side with the same prepared statements; interleaved rounds.
#[derive(Debug)]
pub(crate) struct ConcurrentFloor {
    pub(crate) target: Target,
    pub(crate) clients: usize,
    pub(crate) pool: usize,
    pub(crate) rounds: usize,
    pub(crate) ops_per_client: usize,
    /// Median operations/s per side.
    pub(crate) library_ops: f64,
    pub(crate) raw_ops: f64,
    /// Median per-operation latency (µs), median over rounds.
    pub(crate) library_p50_us: f64,
    pub(crate) raw_p50_us: f64,
    /// Median over rounds of (raw ops/s / library ops/s): the library's time per operation
    /// over the floor's.
    pub(crate) ratio: f64,
}

/// The library at `clients` clients over a pool of `pool` connections.
#[derive(Debug)]
pub(crate) struct PoolSweep {
    pub(crate) clients: usize,
    pub(crate) pool: usize,
    pub(crate) rounds: usize,
    /// Medians over rounds.
    pub(crate) ops: f64,
    pub(crate) p50_us: f64,
    pub(crate) p99_us: f64,
}

/// One store's claim+complete latency in the interleaved comparison.
#[derive(Debug)]
pub(crate) struct Compare {
    pub(crate) target: Target,
    pub(crate) concurrency: usize,
    pub(crate) median_us: f64,
    pub(crate) ratio_to_unlogged: f64,
}

/// WAL and size per Postgres mode.
#[derive(Debug)]
pub(crate) struct PgVolume {
    pub(crate) mode: TableMode,
    pub(crate) wal_bytes_per_op: f64,
    pub(crate) bytes_per_row: f64,
    pub(crate) rows: i64,
}

/// Replays of one completed record, asked of the store and answered by a local replay tier in
/// front of it, interleaved at one client.
#[derive(Debug)]
pub(crate) struct TierReplay {
    pub(crate) target: Target,
    /// Median over rounds of each round's median replay, in µs.
    pub(crate) store_us: f64,
    pub(crate) tier_us: f64,
    /// Median over rounds of store / tier.
    pub(crate) speedup: f64,
    /// Of the tier's replays, the share it answered without asking the store.
    pub(crate) local_share: f64,
}

/// Runs the mixed workload: 70% fresh requests (claim + complete), 20% retries of completed
/// requests (replay), 10% duplicates of a request still in flight (409).
pub(crate) async fn workload(
    connected: &Connected,
    concurrency: usize,
    requests: usize,
) -> Result<(Histogram<u64>, f64, usize), String> {
    let engine = Engine::new(Arc::clone(&connected.store), EngineConfig::default())
        .expect("valid engine settings");
    let scope = bench_scope();
    let fp = bench_fingerprint();
    let response = bench_response();
    let mut replay_keys = Vec::new();
    for _ in 0..100 {
        let key = fresh_key();
        match engine
            .begin(scope.clone(), key.clone(), fp)
            .await
            .map_err(err)?
        {
            Begin::Proceed(guard) => match guard.complete(response.clone()).await {
                Completion::Stored => {}
                other => return Err(format!("setup completion: {other:?}")),
            },
            other => return Err(format!("setup claim: {other:?}")),
        }
        replay_keys.push(key);
    }
    let mut held_keys = Vec::new();
    for _ in 0..10 {
        let key = fresh_key();
        connected
            .store
            .claim(
                &scope,
                &key,
                &fp,
                LeaseToken::new(),
                Duration::from_secs(600),
            )
            .await
            .map_err(err)?;
        held_keys.push(key);
    }
    let replay_keys = Arc::new(replay_keys);
    let held_keys = Arc::new(held_keys);
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (engine, scope, response) = (engine.clone(), scope.clone(), response.clone());
        let (replay_keys, held_keys, next) = (replay_keys.clone(), held_keys.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            let mut histogram = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).map_err(err)?;
            let mut unexpected = 0usize;
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= requests {
                    break;
                }
                let t = Instant::now();
                let ok = match i % 10 {
                    0..=6 => match engine.begin(scope.clone(), fresh_key(), fp).await {
                        Ok(Begin::Proceed(guard)) => {
                            guard.complete(response.clone()).await == Completion::Stored
                        }
                        _ => false,
                    },
                    7 | 8 => matches!(
                        engine
                            .begin(
                                scope.clone(),
                                replay_keys[i % replay_keys.len()].clone(),
                                fp
                            )
                            .await,
                        Ok(Begin::Replay(_))
                    ),
                    _ => matches!(
                        engine
                            .begin(scope.clone(), held_keys[i % held_keys.len()].clone(), fp)
                            .await,
                        Ok(Begin::InFlight { .. })
                    ),
                };
                let micros = t.elapsed().as_micros().max(1) as u64;
                let _ = histogram.record(micros.min(60_000_000));
                if !ok {
                    unexpected += 1;
                }
            }
            Ok::<_, String>((histogram, unexpected))
        }));
    }
    let mut total = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).map_err(err)?;
    let mut unexpected = 0;
    for task in tasks {
        let (h, u) = task.await.map_err(err)??;
        total.add(h).map_err(err)?;
        unexpected += u;
    }
    let throughput = requests as f64 / started.elapsed().as_secs_f64();
    Ok((total, throughput, unexpected))
}

/// Claim+complete of fresh keys on every store, interleaved round by round (the order rotates
/// each round), at `concurrency` clients; per-round medians, and per-round ratios to UNLOGGED.
pub(crate) async fn interleaved(
    connected: &[(Target, Connected)],
    concurrency: usize,
    rounds: usize,
    ops: usize,
) -> Result<Vec<Compare>, String> {
    let mut medians: Vec<Vec<f64>> = vec![Vec::new(); connected.len()];
    let unlogged = connected
        .iter()
        .position(|(t, _)| *t == Target::Postgres(TableMode::Unlogged));
    let mut ratios: Vec<Vec<f64>> = vec![Vec::new(); connected.len()];
    for round in 0..rounds {
        let mut this_round = vec![f64::NAN; connected.len()];
        for step in 0..connected.len() {
            let index = (step + round) % connected.len();
            this_round[index] = batch(
                &connected[index].1,
                Path::Library,
                concurrency,
                ops.div_ceil(concurrency),
            )
            .await?
            .p50();
        }
        for (i, m) in this_round.iter().enumerate() {
            medians[i].push(*m);
            if let Some(u) = unlogged {
                ratios[i].push(m / this_round[u]);
            }
        }
    }
    Ok(connected
        .iter()
        .enumerate()
        .map(|(i, (target, _))| Compare {
            target: *target,
            concurrency,
            median_us: median(&mut medians[i]),
            ratio_to_unlogged: median(&mut ratios[i]),
        })
        .collect())
}
