//! The report's sections on the purge, the replay tier, the raw floor under concurrency and per
//! pool size, and the HTTP comparisons.

use super::super::measure::{ConcurrentFloor, PoolSweep, TierReplay};
use super::super::purge::{self, Churn, PurgeRun};
use idempotency_bench::http::{self, HttpCompare};
use std::fmt::{self, Write as _};

/// Purge at scale: the text and the table (also printed by `idempotency-bench purge`).
pub(crate) fn purge_section(w: &mut String, runs: &[PurgeRun], churn: &Churn) -> fmt::Result {
    writeln!(
        w,
        "{} live records of a 24-hour retention, churned for {} compressed days (one hour = {} ms of wall time) on a \
         throwaway PostgreSQL with `autovacuum_naptime=1s` and `fsync=off`: each hour purges what expired through the store's \
         `purge_expired` ({} rows per statement) and inserts the hour's {} new completed records. Sizes are \
         `pg_total_relation_size` (table, TOAST, indexes) right after the first day was inserted (no dead rows) and at the \
         end. WAL is counted around the purges only. \"recommended\" is `ALTER TABLE ... SET ({})`, what migration 0003 applies; \"defaults\" resets \
         them to the server's.\n",
        churn.live_rows,
        churn.days,
        churn.step.as_millis(),
        purge::BATCH,
        churn.rows_per_hour(),
        purge::RECOMMENDED
    )?;
    writeln!(
        w,
        "| table | autovacuum | rows inserted / purged | purged rows/s | slowest hourly purge ms | WAL B / purged row | \
         size fresh MiB | size at end MiB | end / fresh | indexes end / fresh | live / dead rows at end | autovacuums | late hours |"
    )?;
    writeln!(
        w,
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    )?;
    let mib = |b: i64| b as f64 / 1048576.0;
    for r in runs {
        writeln!(
            w,
            "| {} | {} | {} / {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.2} | {:.2} | {} / {} | {} | {} |",
            r.variant.mode.name(),
            r.variant.autovacuum(),
            r.rows_inserted,
            r.rows_purged,
            r.purge_rows_per_s,
            r.slowest_purge_ms,
            r.wal_bytes_per_purged_row,
            mib(r.fresh_bytes),
            mib(r.end_bytes),
            r.end_bytes as f64 / r.fresh_bytes.max(1) as f64,
            r.end_index_bytes as f64 / r.fresh_index_bytes.max(1) as f64,
            r.live_rows_at_end,
            r.dead_rows_at_end,
            r.autovacuums,
            r.late_steps
        )?;
    }
    Ok(())
}

/// Replays from the store vs from the local replay tier.
pub(super) fn tier_section(
    w: &mut String,
    tiers: &[TierReplay],
    rounds: usize,
    ops: usize,
) -> fmt::Result {
    if tiers.is_empty() {
        return Ok(());
    }
    writeln!(
        w,
        "\n### Replays through the local replay tier\n\nOne client replays one completed record, {rounds} interleaved rounds of \
         {ops} replays per side: asked of the store (one round trip), and through `ReplayTier` in front of the same store \
         (the record is kept in process after its first replay). Medians of the per-round medians, and the median of the \
         per-round ratios.\n"
    )?;
    writeln!(
        w,
        "| store | replay from the store µs | replay from the tier µs | store / tier | answered by the tier |"
    )?;
    writeln!(w, "| --- | ---: | ---: | ---: | ---: |")?;
    for t in tiers {
        writeln!(
            w,
            "| {} | {:.0} | {:.1} | {:.0}x | {:.1}% |",
            t.target.name(),
            t.store_us,
            t.tier_us,
            t.speedup,
            t.local_share * 100.0
        )?;
    }
    Ok(())
}

/// The library against the raw driver with many clients.
pub(super) fn concurrent_floor_section(w: &mut String, floors: &[ConcurrentFloor]) -> fmt::Result {
    let Some(first) = floors.first() else {
        return Ok(());
    };
    writeln!(
        w,
        "\n### With many clients\n\nEach side runs N tasks at once, each doing claim+complete of fresh keys on the store's pool of \
         N connections: the library through its API, the raw side with the store's own prepared statements sent by \
         tokio-postgres on a connection taken from that pool for the whole round. {} interleaved rounds of \
         {} operations per task; medians over the rounds. The ratio is the raw side's operations/s over the library's \
         in the same round (the library's time per operation over the floor's).\n",
        first.rounds, first.ops_per_client
    )?;
    writeln!(
        w,
        "| store | clients | pool | library ops/s | raw ops/s | library p50 µs | raw p50 µs | library / raw |"
    )?;
    writeln!(
        w,
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    )?;
    for f in floors {
        writeln!(
            w,
            "| {} | {} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.2} |",
            f.target.name(),
            f.clients,
            f.pool,
            f.library_ops,
            f.raw_ops,
            f.library_p50_us,
            f.raw_p50_us,
            f.ratio
        )?;
    }
    Ok(())
}

/// The library at many clients over pools of different sizes.
pub(super) fn pool_sweep_section(w: &mut String, sweep: &[PoolSweep]) -> fmt::Result {
    let Some(first) = sweep.first() else {
        return Ok(());
    };
    writeln!(
        w,
        "\n### Pool size for many clients\n\n{} clients doing claim+complete of fresh keys through the library on \
         PostgreSQL UNLOGGED, over pools of different sizes (all connected at once, {} interleaved rounds rotating the \
         order). Ratio: operations/s over the best pool's.\n",
        first.clients, first.rounds
    )?;
    writeln!(w, "| pool | ops/s | p50 µs | p99 µs | ops/s vs best |")?;
    writeln!(w, "| ---: | ---: | ---: | ---: | ---: |")?;
    let best = sweep.iter().map(|p| p.ops).fold(f64::NAN, f64::max);
    for p in sweep {
        writeln!(
            w,
            "| {} | {:.0} | {:.0} | {:.0} | {:.2} |",
            p.pool,
            p.ops,
            p.p50_us,
            p.p99_us,
            p.ops / best
        )?;
    }
    Ok(())
}

/// The layer through real HTTP.
pub(super) fn http_section(w: &mut String, http: &[HttpCompare], seconds: f64) -> fmt::Result {
    let Some(first) = http.first() else {
        return Ok(());
    };
    writeln!(
        w,
        "\n## The layer through HTTP\n\nA task API (POST creates a task in a `Mutex<HashMap>`), served by a child process \
         with and without `IdempotencyLayer` on `MemoryStore::default()`, driven by this process over {} keep-alive \
         loopback connections; client and server share the machine's cores. {} interleaved rounds of {seconds} s per \
         variant (alternating which goes first); medians of the per-round figures and of the per-round ratios. \
         Fresh keys: every request has a new key (claim, handler, capture, complete). Replay: every request repeats \
         one completed key. Server CPU per request is the server process's user+system time over the requests it \
         answered.\n",
        first.connections, first.rounds
    )?;
    w.push_str(&http::markdown_table(http));
    Ok(())
}

/// Through HTTP on PostgreSQL: the text, the chart and the table.
pub(super) fn http_pg_section(
    w: &mut String,
    rows: &[idempotency_bench::http_pg::PgRow],
    chart: Option<&str>,
) -> fmt::Result {
    if rows.is_empty() {
        return Ok(());
    }
    writeln!(
        w,
        "\n## Through HTTP on PostgreSQL: what a service sees\n\nOne create-task handler (an `INSERT` into a LOGGED \
         table), each variant served by its own child process on a 32-connection pool, driven with fresh keys over \
         loopback keep-alive connections; client, server and database share the machine's cores. Bare in autocommit, \
         bare in its own transaction (the reference), the one-transaction and the speculative modes' SQL written by \
         hand without the library, and behind the layer in the lease mode, the one-transaction mode and the \
         speculative one-transaction mode with an UNLOGGED and a LOGGED key table. Rounds interleaved with the order \
         rotated; medians, and medians of the per-round ratios to the bare transaction. WAL is \
         `pg_current_wal_insert_lsn()` before and after a round; CPU per request from `/proc` (the server process; \
         all `postgres` processes); CPU steal is the share of the machine's CPU time the hypervisor gave to others \
         during the variant's rounds (`/proc/stat`).\n"
    )?;
    if let Some(chart) = chart {
        writeln!(w, "![requests/s and WAL per request by mode]({chart})\n")?;
    }
    w.push_str(&idempotency_bench::http_pg::markdown_table(rows));
    Ok(())
}
