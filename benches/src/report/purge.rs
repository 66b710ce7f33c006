//! Purge at scale: days of churn compressed into a run on a throwaway PostgreSQL server, the
//! hourly purge timed and its WAL counted, and the table's size after the churn (bloat) with
//! autovacuum at its defaults and with the settings the report recommends.
//!
//! Time is compressed: one "hour" is one step of `step` wall time. Each step purges the records
//! that expired (through the store's own `purge_expired`, in batches, as
//! `purge_periodically` and the pg_cron job do) and then inserts the hour's new completed
//! records, which expire 24 steps later. The table so holds about `live_rows` records, and a
//! day of steps replaces all of them. The server is a throwaway one so that its autovacuum can
//! wake every second (`autovacuum_naptime=1s`, its minimum): at the default minute it would
//! wake once per compressed day, not 60 times per hour as in production. It runs with
//! `fsync=off`, so that disk flushes of a shared machine do not stall the compressed hours.

use idempotency::postgres::deadpool_postgres;
use idempotency::{IdempotencyStore, PostgresStore, TableMode};
use idempotency_bench::{bench_response, err};
use idempotency_testkit::TempPostgres;
use std::time::{Duration, Instant};

/// Steps per compressed day: one per hour, the pg_cron job's default schedule.
const HOURS: u32 = 24;
/// Rows per purge statement (the default batch of `purge_periodically`).
pub(crate) const BATCH: usize = 10_000;

/// Per-table autovacuum settings the report recommends, as `ALTER TABLE ... SET (...)` options:
/// what migration `0003_tune_autovacuum` sets (a test checks that they agree).
pub(crate) const RECOMMENDED: &str =
    "autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000";

/// Undoes [`RECOMMENDED`]: the server's defaults.
const DEFAULTS: &str = "autovacuum_vacuum_scale_factor, autovacuum_vacuum_threshold";

/// One run of the churn.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Variant {
    pub(crate) mode: TableMode,
    /// Whether the table has [`RECOMMENDED`] (else the server's defaults).
    pub(crate) recommended: bool,
}

impl Variant {
    pub(crate) const ALL: [Variant; 3] = [
        Variant {
            mode: TableMode::Unlogged,
            recommended: false,
        },
        Variant {
            mode: TableMode::Unlogged,
            recommended: true,
        },
        Variant {
            mode: TableMode::Logged,
            recommended: true,
        },
    ];

    pub(crate) fn autovacuum(&self) -> &'static str {
        if self.recommended {
            "recommended"
        } else {
            "defaults"
        }
    }
}

/// What a run measured.
#[derive(Debug)]
pub(crate) struct PurgeRun {
    pub(crate) variant: Variant,
    /// Rows inserted over the run, the initial fill included.
    pub(crate) rows_inserted: u64,
    pub(crate) rows_purged: u64,
    /// Purged rows per second of purge statements.
    pub(crate) purge_rows_per_s: f64,
    /// WAL written while the purges ran, per purged row.
    pub(crate) wal_bytes_per_purged_row: f64,
    /// The slowest hourly purge (all its batches).
    pub(crate) slowest_purge_ms: f64,
    /// Table + TOAST + index bytes right after the initial fill (no dead rows), and at the end.
    pub(crate) fresh_bytes: i64,
    pub(crate) end_bytes: i64,
    pub(crate) end_index_bytes: i64,
    pub(crate) fresh_index_bytes: i64,
    pub(crate) live_rows_at_end: i64,
    pub(crate) dead_rows_at_end: i64,
    pub(crate) autovacuums: i64,
    /// Steps whose work did not fit in their wall time (the run fell behind the compression).
    pub(crate) late_steps: u32,
}

/// Settings of the churn.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Churn {
    pub(crate) live_rows: u64,
    pub(crate) days: u32,
    pub(crate) step: Duration,
}

impl Churn {
    pub(crate) fn rows_per_hour(&self) -> u64 {
        self.live_rows / u64::from(HOURS)
    }
}

/// Runs every variant, one after the other, on one throwaway server.
pub(crate) async fn measure(churn: Churn) -> Result<Vec<PurgeRun>, String> {
    // fsync off: a throwaway server, and a shared machine's disk flushes stalled whole compressed
    // hours (each purge commits once per 10,000 rows, so it barely changes what is measured).
    let server = TempPostgres::start(&["autovacuum_naptime=1s", "fsync=off"])
        .map_err(|e| format!("could not start a throwaway PostgreSQL: {e}"))?;
    let url = server.url("postgres");
    let mut runs = Vec::new();
    for (i, variant) in Variant::ALL.into_iter().enumerate() {
        runs.push(run(&url, &format!("purge_{i}"), variant, churn).await?);
    }
    Ok(runs)
}

async fn run(url: &str, schema: &str, variant: Variant, churn: Churn) -> Result<PurgeRun, String> {
    let store = PostgresStore::builder(url)
        .schema(schema)
        .table_mode(variant.mode)
        .pool_size(2)
        .build()
        .await
        .map_err(err)?;
    store.migrate().await.map_err(err)?;
    let table = store.table_name();
    let client = store.pool().get().await.map_err(err)?;
    let settings = if variant.recommended {
        format!("ALTER TABLE {table} SET ({RECOMMENDED})")
    } else {
        format!("ALTER TABLE {table} RESET ({DEFAULTS})")
    };
    client.batch_execute(&settings).await.map_err(err)?;
    let insert = client
        .prepare(&format!(
            "INSERT INTO {table} (user_id, key, request_hash, status_code, response, created_at, expires_at) \
             SELECT 'user-' || (g % 100000), gen_random_uuid()::text, \
                    '\\x01'::bytea || sha256(gen_random_uuid()::text::bytea), 201, $1, now(), \
                    now() + make_interval(secs => $2::float8 * (1 + g % $3::bigint)) \
             FROM generate_series(1, $4::bigint) g"
        ))
        .await
        .map_err(err)?;
    let step_secs = churn.step.as_secs_f64();
    let response = bench_response().encode().to_vec();
    // The initial fill: a day of records, expiring one hour's worth per step.
    client
        .execute(
            &insert,
            &[
                &response,
                &step_secs,
                &i64::from(HOURS),
                &(churn.live_rows as i64),
            ],
        )
        .await
        .map_err(err)?;
    client
        .batch_execute(&format!("ANALYZE {table}"))
        .await
        .map_err(err)?;
    let (fresh_bytes, fresh_index_bytes) = sizes(&client, &table).await?;
    let (mut purged, mut purge_time, mut wal, mut slowest) = (0u64, Duration::ZERO, 0f64, 0f64);
    let mut inserted = churn.live_rows;
    let mut late_steps = 0;
    let start = Instant::now();
    for step in 1..=churn.days * HOURS {
        let due = start + churn.step * step;
        tokio::time::sleep_until(due.into()).await;
        let before = lsn(&client).await?;
        let began = Instant::now();
        loop {
            let n = store.purge_expired(BATCH).await.map_err(err)?;
            purged += n;
            if n < BATCH as u64 {
                break;
            }
        }
        let took = began.elapsed();
        purge_time += took;
        slowest = slowest.max(took.as_secs_f64() * 1e3);
        wal += client
            .query_one(
                "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::text::pg_lsn)::float8",
                &[&before],
            )
            .await
            .map_err(err)?
            .get::<_, f64>(0);
        // The hour's new records, kept for a day.
        let hour = churn.rows_per_hour();
        client
            .execute(
                &insert,
                &[
                    &response,
                    &(step_secs * f64::from(HOURS)),
                    &1i64,
                    &(hour as i64),
                ],
            )
            .await
            .map_err(err)?;
        inserted += hour;
        if Instant::now() > due + churn.step {
            late_steps += 1;
        }
    }
    let (end_bytes, end_index_bytes) = sizes(&client, &table).await?;
    let stats = client
        .query_one(
            "SELECT n_live_tup, n_dead_tup, autovacuum_count FROM pg_stat_user_tables \
             WHERE relid = $1::text::regclass",
            &[&table],
        )
        .await
        .map_err(err)?;
    Ok(PurgeRun {
        variant,
        rows_inserted: inserted,
        rows_purged: purged,
        purge_rows_per_s: purged as f64 / purge_time.as_secs_f64().max(1e-9),
        wal_bytes_per_purged_row: wal / purged.max(1) as f64,
        slowest_purge_ms: slowest,
        fresh_bytes,
        end_bytes,
        fresh_index_bytes,
        end_index_bytes,
        live_rows_at_end: stats.get(0),
        dead_rows_at_end: stats.get(1),
        autovacuums: stats.get(2),
        late_steps,
    })
}

/// The server's current WAL position.
async fn lsn(client: &deadpool_postgres::Object) -> Result<String, String> {
    client
        .query_one("SELECT pg_current_wal_lsn()::text", &[])
        .await
        .map(|row| row.get(0))
        .map_err(err)
}

/// Total (table, TOAST, indexes) and index bytes of `table`.
async fn sizes(client: &deadpool_postgres::Object, table: &str) -> Result<(i64, i64), String> {
    let row = client
        .query_one(
            "SELECT pg_total_relation_size($1::text::regclass), pg_indexes_size($1::text::regclass)",
            &[&table],
        )
        .await
        .map_err(err)?;
    Ok((row.get(0), row.get(1)))
}

#[cfg(test)]
mod tests {
    /// The report measures the settings the migration applies.
    #[test]
    fn the_recommended_settings_are_the_migration_s() {
        let migration = include_str!("../../../migrations/0003_tune_autovacuum.sql");
        for setting in super::RECOMMENDED.split(", ") {
            assert!(
                migration.contains(setting),
                "migration 0003 lacks `{setting}`"
            );
        }
        for name in super::DEFAULTS.split(", ") {
            assert!(super::RECOMMENDED.contains(name));
        }
    }
}
