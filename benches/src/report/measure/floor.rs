//! The raw-driver floor: the same statements sent without the store, alone, concurrent, and
//! per pool size.

use super::*;
use idempotency::store::{FenceOutcome, Fingerprint, LeaseToken, StoredResponse};
use idempotency::{IdempotencyStore, Scope};
use idempotency_bench::{
    Connected, LEASE, RETENTION, Raw, Servers, Target, bench_fingerprint, bench_response,
    bench_scope, err, fresh_key, median, pg_claim_complete,
};
use std::sync::Arc;
use std::time::Instant;

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
pub(super) enum Path {
    /// Through the library's API.
    Library,
    /// The Postgres store's own prepared statements, sent by tokio-postgres on a connection
    /// taken from the store's pool for the whole batch (the raw-driver floor).
    RawOnPool,
}

/// What a batch measured: ops/s over the batch, and every operation's latency (µs, sorted).
pub(super) struct Batch {
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

    pub(super) fn p50(&self) -> f64 {
        self.quantile(0.5)
    }

    fn p99(&self) -> f64 {
        self.quantile(0.99)
    }
}

/// `clients` tasks at once, each doing `ops` claim+complete operations of fresh keys on `path`.
pub(super) async fn batch(
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
