//! What each table mode writes (WAL bytes, size per million keys) and what the replay tier
//! saves.

use super::*;
use idempotency::store::{ClaimOutcome, FenceOutcome, LeaseToken};
use idempotency::{IdempotencyStore, ReplayTier, TableMode};
use idempotency_bench::{
    Connected, LEASE, RETENTION, Target, bench_fingerprint, bench_response, bench_scope, err,
    fresh_key, median,
};
use std::sync::Arc;
use std::time::Instant;

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
