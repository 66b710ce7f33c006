//! Measuring: the mixed workload per store and concurrency, the interleaved comparison, the
//! raw-driver floor, and WAL and size per table mode.

use hdrhistogram::Histogram;
use idempotency::{
    Begin, ClaimOutcome, Completion, Engine, EngineConfig, FenceOutcome, Fingerprint,
    IdempotencyStore, LeaseToken, ReplayTier, Scope, StoredResponse, TableMode,
};
use idempotency_bench::{
    Connected, LEASE, RETENTION, Raw, Servers, Target, bench_fingerprint, bench_response,
    bench_scope, err, fresh_key, median, pg_claim_complete,
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
    let engine = Engine::new(Arc::clone(&connected.store), EngineConfig::default());
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

/// Library claim+complete vs the same statements with the driver directly, interleaved.
pub(crate) async fn floor(
    connected: &Connected,
    servers: &Servers,
    target: Target,
    rounds: usize,
    ops: usize,
) -> Result<Option<Floor>, String> {
    let Some(mut raw) = Raw::open(connected, servers).await? else {
        return Ok(None);
    };
    let scope = bench_scope();
    let fp = bench_fingerprint();
    let response = bench_response();
    let encoded = response.encode();
    let (mut lib_medians, mut raw_medians, mut ping_medians, mut ratios) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        let mut lib = Vec::with_capacity(ops);
        let mut drv = Vec::with_capacity(ops);
        let mut ping = Vec::with_capacity(ops);
        // Alternate which side goes first, so drift within a round does not favour one.
        for side in if round % 2 == 0 { [0, 1, 2] } else { [2, 1, 0] } {
            for _ in 0..ops {
                let t = Instant::now();
                match side {
                    0 => {
                        claim_complete(&*connected.store, &scope, &fp, &response).await?;
                        lib.push(t.elapsed().as_secs_f64() * 1e6);
                    }
                    1 => {
                        raw.claim_complete(fresh_key().as_str(), &encoded).await?;
                        drv.push(t.elapsed().as_secs_f64() * 1e6);
                    }
                    _ => {
                        raw.ping().await?;
                        ping.push(t.elapsed().as_secs_f64() * 1e6);
                    }
                }
            }
        }
        let (l, d) = (median(&mut lib), median(&mut drv));
        lib_medians.push(l);
        raw_medians.push(d);
        ping_medians.push(median(&mut ping));
        ratios.push(l / d);
    }
    Ok(Some(Floor {
        target,
        library_us: median(&mut lib_medians),
        raw_us: median(&mut raw_medians),
        ping_us: median(&mut ping_medians),
        ratio: median(&mut ratios),
    }))
}

/// WAL bytes per claim+complete, and table + index bytes per live row.
pub(crate) async fn pg_volume(
    connected: &Connected,
    mode: TableMode,
    ops: usize,
) -> Result<PgVolume, String> {
    let Some(pg) = &connected.postgres else {
        return Err("not a Postgres target".into());
    };
    let client = pg.pool().get().await.map_err(err)?;
    let scope = bench_scope();
    let fp = bench_fingerprint();
    let response = bench_response();
    let before: String = client
        .query_one("SELECT pg_current_wal_lsn()::text", &[])
        .await
        .map_err(err)?
        .get(0);
    // Give the connection back: the operations below take their own.
    drop(client);
    for _ in 0..ops {
        claim_complete(&*connected.store, &scope, &fp, &response).await?;
    }
    let client = pg.pool().get().await.map_err(err)?;
    let wal: f64 = client
        .query_one(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::text::pg_lsn)::float8",
            &[&before],
        )
        .await
        .map_err(err)?
        .get(0);
    let row = client
        .query_one(
            &format!(
                "SELECT count(*), pg_total_relation_size('{}')::float8 FROM {}",
                pg.table_name().replace('\'', "''"),
                pg.table_name()
            ),
            &[],
        )
        .await
        .map_err(err)?;
    let rows: i64 = row.get(0);
    let size: f64 = row.get(1);
    Ok(PgVolume {
        mode,
        wal_bytes_per_op: wal / ops as f64,
        bytes_per_row: size / rows.max(1) as f64,
        rows,
    })
}

/// Replays of one completed record straight from the store vs through a [`ReplayTier`] in front
/// of it, `ops` each per round, the side that goes first alternating.
pub(crate) async fn tier_replay(
    connected: &Connected,
    target: Target,
    rounds: usize,
    ops: usize,
) -> Result<TierReplay, String> {
    let store = Arc::clone(&connected.store);
    let tier = ReplayTier::new(Arc::clone(&store));
    let (scope, fp, response) = (bench_scope(), bench_fingerprint(), bench_response());
    let (key, token) = (fresh_key(), LeaseToken::new());
    store
        .claim(&scope, &key, &fp, token, LEASE)
        .await
        .map_err(err)?;
    if store
        .complete(&scope, &key, token, &response, RETENTION)
        .await
        .map_err(err)?
        != FenceOutcome::Applied
    {
        return Err("the replayed record could not be completed".into());
    }
    let tiered: &dyn IdempotencyStore = &tier;
    let (mut direct, mut local, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        let mut medians = [0.0; 2];
        for side in if round % 2 == 0 { [0, 1] } else { [1, 0] } {
            let via = if side == 0 { &*store } else { tiered };
            let mut latencies = Vec::with_capacity(ops);
            for _ in 0..ops {
                let started = Instant::now();
                let outcome = via
                    .claim(&scope, &key, &fp, LeaseToken::new(), LEASE)
                    .await
                    .map_err(err)?;
                latencies.push(started.elapsed().as_secs_f64() * 1e6);
                if !matches!(outcome, ClaimOutcome::Existing(_)) {
                    return Err("a replay found no completed record".into());
                }
            }
            medians[side] = median(&mut latencies);
        }
        direct.push(medians[0]);
        local.push(medians[1]);
        ratios.push(medians[0] / medians[1]);
    }
    Ok(TierReplay {
        target,
        store_us: median(&mut direct),
        tier_us: median(&mut local),
        speedup: median(&mut ratios),
        local_share: tier.hits() as f64 / (rounds * ops) as f64,
    })
}

/// One claim and one complete of a fresh key through the library.
pub(crate) async fn claim_complete(
    store: &dyn IdempotencyStore,
    scope: &Scope,
    fp: &Fingerprint,
    response: &StoredResponse,
) -> Result<(), String> {
    let (key, token) = (fresh_key(), LeaseToken::new());
    store
        .claim(scope, &key, fp, token, LEASE)
        .await
        .map_err(err)?;
    match store
        .complete(scope, &key, token, response, RETENTION)
        .await
        .map_err(err)?
    {
        FenceOutcome::Applied => Ok(()),
        FenceOutcome::Stale => Err("a fresh claim's completion was refused as stale".into()),
    }
}

/// How a batch sends its claims and completes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Path {
    /// Through the library's API.
    Library,
    /// The Postgres store's own prepared statements, sent by tokio-postgres on a connection
    /// taken from the store's pool for the whole batch (the raw-driver floor).
    RawOnPool,
}

/// What a batch measured: ops/s over the batch, and every operation's latency (µs, sorted).
struct Batch {
    ops_per_s: f64,
    latencies_us: Vec<f64>,
}

impl Batch {
    fn quantile(&self, q: f64) -> f64 {
        let n = self.latencies_us.len();
        if n == 0 {
            return f64::NAN;
        }
        self.latencies_us[((n as f64 * q) as usize).min(n - 1)]
    }

    fn p50(&self) -> f64 {
        self.quantile(0.5)
    }

    fn p99(&self) -> f64 {
        self.quantile(0.99)
    }
}

/// `clients` tasks at once, each doing `ops` claim+complete operations of fresh keys on `path`.
async fn batch(
    connected: &Connected,
    path: Path,
    clients: usize,
    ops: usize,
) -> Result<Batch, String> {
    let pg = match path {
        Path::Library => None,
        Path::RawOnPool => Some(
            connected
                .postgres
                .clone()
                .ok_or("the raw-driver floor on a pool needs a Postgres target")?,
        ),
    };
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..clients {
        let store = Arc::clone(&connected.store);
        let pg = pg.clone();
        tasks.spawn(async move {
            let (scope, fp, response) = (bench_scope(), bench_fingerprint(), bench_response());
            let mut latencies = Vec::with_capacity(ops);
            if let Some(pg) = pg {
                let encoded = response.encode();
                let client = pg.pool().get().await.map_err(err)?;
                let claim = client
                    .prepare_cached(pg.statements().claim)
                    .await
                    .map_err(err)?;
                let complete = client
                    .prepare_cached(pg.statements().complete)
                    .await
                    .map_err(err)?;
                for _ in 0..ops {
                    let t = Instant::now();
                    pg_claim_complete(&client, &claim, &complete, fresh_key().as_str(), &encoded)
                        .await?;
                    latencies.push(t.elapsed().as_secs_f64() * 1e6);
                }
            } else {
                for _ in 0..ops {
                    let t = Instant::now();
                    claim_complete(&*store, &scope, &fp, &response).await?;
                    latencies.push(t.elapsed().as_secs_f64() * 1e6);
                }
            }
            Ok::<_, String>(latencies)
        });
    }
    let mut latencies_us = Vec::with_capacity(clients * ops);
    while let Some(done) = tasks.join_next().await {
        latencies_us.extend(done.map_err(err)??);
    }
    let ops_per_s = latencies_us.len() as f64 / started.elapsed().as_secs_f64();
    latencies_us.sort_by(f64::total_cmp);
    Ok(Batch {
        ops_per_s,
        latencies_us,
    })
}

/// The library against the raw driver at `clients` clients, both on the store's pool of
/// `pool` connections.
pub(crate) async fn concurrent_floor(
    connected: &Connected,
    target: Target,
    clients: usize,
    pool: usize,
    rounds: usize,
    ops: usize,
) -> Result<ConcurrentFloor, String> {
    let (mut lib_ops, mut raw_ops, mut lib_p50, mut raw_p50, mut ratios) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    // Warm both sides (every connection opened, statements prepared) before measuring.
    batch(connected, Path::Library, clients, 5).await?;
    batch(connected, Path::RawOnPool, clients, 5).await?;
    for round in 0..rounds {
        let (l, r) = if round % 2 == 0 {
            let l = batch(connected, Path::Library, clients, ops).await?;
            (l, batch(connected, Path::RawOnPool, clients, ops).await?)
        } else {
            let r = batch(connected, Path::RawOnPool, clients, ops).await?;
            (batch(connected, Path::Library, clients, ops).await?, r)
        };
        lib_ops.push(l.ops_per_s);
        raw_ops.push(r.ops_per_s);
        lib_p50.push(l.p50());
        raw_p50.push(r.p50());
        ratios.push(r.ops_per_s / l.ops_per_s);
    }
    Ok(ConcurrentFloor {
        target,
        clients,
        pool,
        rounds,
        ops_per_client: ops,
        library_ops: median(&mut lib_ops),
        raw_ops: median(&mut raw_ops),
        library_p50_us: median(&mut lib_p50),
        raw_p50_us: median(&mut raw_p50),
        ratio: median(&mut ratios),
    })
}

/// The library at `clients` clients over each of `pools` (connected stores of those pool
/// sizes), interleaved: each round runs every pool once, in a rotating order.
pub(crate) async fn pool_sweep(
    pools: &[(usize, Connected)],
    clients: usize,
    rounds: usize,
    ops: usize,
) -> Result<Vec<PoolSweep>, String> {
    let mut figures: Vec<(Vec<f64>, Vec<f64>, Vec<f64>)> =
        pools.iter().map(|_| Default::default()).collect();
    for (_, c) in pools {
        batch(c, Path::Library, clients, 5).await?;
    }
    for round in 0..rounds {
        for i in 0..pools.len() {
            let i = (i + round) % pools.len();
            let b = batch(&pools[i].1, Path::Library, clients, ops).await?;
            figures[i].0.push(b.ops_per_s);
            figures[i].1.push(b.p50());
            figures[i].2.push(b.p99());
        }
    }
    Ok(pools
        .iter()
        .zip(figures)
        .map(|((pool, _), (mut o, mut p50, mut p99))| PoolSweep {
            clients,
            pool: *pool,
            rounds,
            ops: median(&mut o),
            p50_us: median(&mut p50),
            p99_us: median(&mut p99),
        })
        .collect())
}
