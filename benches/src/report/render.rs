//! Rendering: the Markdown report as a function of the results.

mod http_verdict;
mod sections;

use http_verdict::http_verdict;
pub(crate) use sections::purge_section;
use sections::*;

use super::Model;
use super::Results;
use super::measure::{Cell, PgVolume};
use idempotency::TableMode;
use idempotency_bench::Target;
use std::fmt::{self, Write as _};

/// The report, in Markdown.
pub(crate) fn markdown(results: &Results) -> Result<String, fmt::Error> {
    let Results {
        settings,
        environment: env,
        cells,
        compares,
        pooler,
        floors,
        concurrent_floors,
        pool_sweep,
        volumes,
        tier_replays,
        http,
        http_pg,
        http_pg_chart,
        purges,
        drivers,
        replica_wait,
        churn,
        chaos,
        chaos_secs,
        skipped,
        fsync_after_us,
        chart_file,
    } = results;
    let mut md = String::new();
    let w = &mut md;
    writeln!(w, "# ADR 009 re-evaluated: measured on this machine\n")?;
    writeln!(
        w,
        "Written by `cargo run --release -p idempotency-bench -- report{}` on {}. Every number below was \
         measured in this one run; rerun the command against your own database (`--postgres URL --redis URL`) \
         before trusting any of them, and on Aurora in particular (AWS: the UNLOGGED saving \"may not be as \
         significant\" there).{}\n",
        if settings.quick { " --quick" } else { "" },
        env.date,
        if settings.quick {
            " A quick run: fewer requests and rounds, no purge at scale, no pool sweep and no chaos runs, so its figures spread more \
             than the full report's."
        } else {
            ""
        }
    )?;
    writeln!(w, "## Machine and settings\n")?;
    writeln!(w, "- Machine: {}", env.machine)?;
    if let Some(pg) = &env.postgres {
        writeln!(w, "- PostgreSQL: {}", pg.version)?;
        writeln!(
            w,
            "  - `synchronous_commit = {}` (server default; the async-commit mode sets `off` on its own connections), `fsync = {}`, `wal_level = {}`, `shared_buffers = {}`",
            pg.synchronous_commit, pg.fsync, pg.wal_level, pg.shared_buffers
        )?;
    }
    let fmt_fsync =
        |v: Option<f64>| v.map_or("not measured".to_owned(), |us| format!("{us:.0} µs"));
    writeln!(
        w,
        "- fsync (`pg_test_fsync`, one 8 kB `fdatasync`, in `{}`): {} before the runs, {} after. A LOGGED commit waits for one; this time swings by 10x and more over minutes on shared machines.",
        env.fsync_dir.display(),
        fmt_fsync(env.fsync_before_us),
        fmt_fsync(*fsync_after_us)
    )?;
    if let Some(redis) = &env.redis {
        writeln!(
            w,
            "- Redis {}: `save \"{}\"`, `appendonly {}` (persistence decides what a restart keeps)",
            redis.version, redis.save, redis.appendonly
        )?;
    }
    writeln!(
        w,
        "- Servers on loopback; client and servers share the machine's cores."
    )?;
    for s in skipped {
        writeln!(w, "- Skipped (unreachable): {s}")?;
    }
    writeln!(
        w,
        "\n## Latency and throughput\n\n{} requests per cell through the engine (what the layer calls): 70% fresh requests \
         (claim + complete), 20% retries of completed requests (replay), 10% duplicates of a request still in flight (409). \
         Latency in microseconds per request.\n",
        settings.requests
    )?;
    writeln!(
        w,
        "| store | clients | p50 µs | p95 µs | p99 µs | requests/s | unexpected outcomes |"
    )?;
    writeln!(w, "| --- | ---: | ---: | ---: | ---: | ---: | ---: |")?;
    for c in cells {
        writeln!(
            w,
            "| {} | {} | {} | {} | {} | {:.0} | {} |",
            c.target.name(),
            c.concurrency,
            c.p50_us,
            c.p95_us,
            c.p99_us,
            c.throughput,
            c.unexpected
        )?;
    }
    writeln!(w, "\n![p50 latency by concurrency]({})\n", chart_file)?;
    writeln!(
        w,
        "## UNLOGGED vs LOGGED vs async commit, interleaved\n\nClaim + complete of fresh keys on every store, in rounds whose \
         order rotates ({} rounds of {} operations per store at one client, {} at eight), so a change of fsync time or loopback \
         latency during the run hits every store alike. Medians of the per-round medians, and the median of the per-round ratios \
         to UNLOGGED.\n",
        settings.floor_rounds,
        settings.floor_ops,
        settings.floor_ops * 4
    )?;
    writeln!(w, "| store | clients | median µs | ratio to UNLOGGED |")?;
    writeln!(w, "| --- | ---: | ---: | ---: |")?;
    for c in compares {
        writeln!(
            w,
            "| {} | {} | {:.0} | {:.2} |",
            c.target.name(),
            c.concurrency,
            c.median_us,
            c.ratio_to_unlogged
        )?;
    }
    writeln!(
        w,
        "\n## Behind a connection pooler\n\nTransaction-mode poolers (PgBouncer, RDS Proxy) lend a server connection per \
         transaction, so the store sends its statements unnamed (`prepared_statements=false`): parsed and planned on every \
         call instead of once per connection. Claim + complete of fresh keys on UNLOGGED, interleaved as above; ratios to \
         prepared statements sent directly.\n"
    )?;
    writeln!(
        w,
        "| path | clients | median µs | ratio to prepared, direct |"
    )?;
    writeln!(w, "| --- | ---: | ---: | ---: |")?;
    for c in pooler {
        writeln!(
            w,
            "| {} | {} | {:.0} | {:.2} |",
            c.target.name(),
            c.concurrency,
            c.median_us,
            c.ratio_to_unlogged
        )?;
    }
    if !pooler.iter().any(|c| c.target == Target::PgBouncer) {
        writeln!(w, "\nPgBouncer was not measured: pass `--pgbouncer URL`.")?;
    }
    if !drivers.is_empty() {
        super::drivers::section(w, drivers, settings.floor_rounds, settings.floor_ops)?;
    }
    if let Some(cost) = replica_wait {
        super::replicas::section(w, cost, settings.floor_rounds, settings.floor_ops)?;
    }
    writeln!(
        w,
        "\n## The floor: library vs the same statements sent directly\n\nOne client, {} interleaved rounds of {} operations per side \
         (library, raw driver, and a trivial round trip, alternating order). An operation is a claim and a complete of a fresh key: \
         the library through its pool and types, the raw side with one prepared tokio-postgres connection or one redis connection \
         running the same SQL or Lua. Medians of the per-round medians, and the median of the per-round ratios.\n",
        settings.floor_rounds, settings.floor_ops
    )?;
    writeln!(
        w,
        "| store | library µs | raw driver µs | library / raw | `SELECT 1` / `PING` µs |"
    )?;
    writeln!(w, "| --- | ---: | ---: | ---: | ---: |")?;
    for f in floors {
        writeln!(
            w,
            "| {} | {:.0} | {:.0} | {:.2} | {:.0} |",
            f.target.name(),
            f.library_us,
            f.raw_us,
            f.ratio,
            f.ping_us
        )?;
    }
    tier_section(w, tier_replays, settings.floor_rounds, settings.floor_ops)?;
    concurrent_floor_section(w, concurrent_floors)?;
    pool_sweep_section(w, pool_sweep)?;
    writeln!(
        w,
        "\n## PostgreSQL: WAL and size\n\nWAL from `pg_current_wal_lsn()` before and after {} claim+complete operations at one client \
         (the server is shared, so other activity adds to it); size is `pg_total_relation_size` (table, TOAST, primary key and \
         `expires_at` index) over the live rows.\n",
        settings.wal_ops
    )?;
    writeln!(
        w,
        "| mode | WAL bytes / operation | bytes / live row | per million live keys | rows measured |"
    )?;
    writeln!(w, "| --- | ---: | ---: | ---: | ---: |")?;
    for v in volumes {
        writeln!(
            w,
            "| {} | {:.0} | {:.0} | {:.0} MiB | {} |",
            v.mode.name(),
            v.wal_bytes_per_op,
            v.bytes_per_row,
            v.bytes_per_row * 1e6 / 1048576.0,
            v.rows
        )?;
    }
    http_section(w, http, settings.http_seconds)?;
    http_pg_section(w, http_pg, http_pg_chart.as_deref())?;
    if !purges.is_empty() {
        writeln!(w, "\n## PostgreSQL: purge at scale\n")?;
        purge_section(w, purges, churn)?;
    }
    if !chaos.is_empty() {
        super::chaos::section(w, chaos, *chaos_secs)?;
    }
    capacity(w, &settings.model, cells, volumes)?;
    verdict(w, results)?;
    Ok(md)
}

pub(crate) fn best_throughput(cells: &[Cell], target: Target) -> Option<f64> {
    cells
        .iter()
        .filter(|c| c.target == target)
        .map(|c| c.throughput)
        .reduce(f64::max)
}

pub(crate) fn p50_at(cells: &[Cell], target: Target, concurrency: usize) -> Option<u64> {
    cells
        .iter()
        .find(|c| c.target == target && c.concurrency == concurrency)
        .map(|c| c.p50_us)
}

fn capacity(w: &mut String, model: &Model, cells: &[Cell], volumes: &[PgVolume]) -> fmt::Result {
    writeln!(
        w,
        "\n## Capacity model\n\nAssumptions (flags of the report command): {} idempotent writes per user per day, peak {}x the daily \
         average, retention {} h. Rows held = writes per day x retention; storage uses the measured bytes per row; WAL per day uses \
         the measured WAL per operation; headroom = best measured throughput on this machine / peak requests per second.\n",
        model.writes_per_user_per_day, model.peak_factor, model.retention_hours
    )?;
    let unlogged = volumes.iter().find(|v| v.mode == TableMode::Unlogged);
    let logged = volumes.iter().find(|v| v.mode == TableMode::Logged);
    let pg_best = best_throughput(cells, Target::Postgres(TableMode::Unlogged));
    let redis_best = best_throughput(cells, Target::Redis);
    writeln!(
        w,
        "| MAU | writes/day | peak req/s | rows held | UNLOGGED storage | LOGGED WAL/day | headroom UNLOGGED | headroom Redis |"
    )?;
    writeln!(
        w,
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    )?;
    for mau in [1_000f64, 10_000.0, 100_000.0, 1_000_000.0] {
        let per_day = mau * model.writes_per_user_per_day;
        let peak = per_day / 86_400.0 * model.peak_factor;
        let rows = per_day * model.retention_hours / 24.0;
        let storage = unlogged.map_or("?".into(), |v| {
            format!("{:.1} MiB", rows * v.bytes_per_row / 1048576.0)
        });
        let wal = logged.map_or("?".into(), |v| {
            format!("{:.1} MiB", per_day * v.wal_bytes_per_op / 1048576.0)
        });
        let head = |best: Option<f64>| best.map_or("?".into(), |b| format!("{:.0}x", b / peak));
        writeln!(
            w,
            "| {mau:.0} | {per_day:.0} | {peak:.1} | {rows:.0} | {storage} | {wal} | {} | {} |",
            head(pg_best),
            head(redis_best)
        )?;
    }
    Ok(())
}

/// The verdict, read off every result of the run.
fn verdict(w: &mut String, results: &Results) -> fmt::Result {
    let Results {
        http,
        http_pg,
        cells,
        compares,
        floors,
        volumes,
        environment,
        fsync_after_us: fsync_after,
        ..
    } = results;
    let (fsync_before, fsync_after) = (environment.fsync_before_us, *fsync_after);
    writeln!(w, "\n## Verdict (from the numbers above)\n")?;
    http_verdict(w, http, http_pg)?;
    if !http.is_empty() || !http_pg.is_empty() {
        writeln!(
            w,
            "\nPer store operation (the store call alone, without a request around it: what the ADR argued from; in a \
             one-transaction request the business transaction's own commit flushes the WAL anyway):\n"
        )?;
    }
    let unlogged = Target::Postgres(TableMode::Unlogged);
    let logged = Target::Postgres(TableMode::Logged);
    let async_commit = Target::Postgres(TableMode::LoggedAsyncCommit);
    for clients in [1usize, 8] {
        let ratio = |t: Target| {
            compares
                .iter()
                .find(|c| c.target == t && c.concurrency == clients)
                .map(|c| c.ratio_to_unlogged)
        };
        if let (Some(l), Some(a)) = (ratio(logged), ratio(async_commit)) {
            writeln!(
                w,
                "- Interleaved at {clients} client(s), claim + complete: LOGGED takes {l:.2}x the time of UNLOGGED, LOGGED with \
                 `synchronous_commit = off` {a:.2}x{}.",
                ratio(Target::Redis).map_or(String::new(), |r| format!(", Redis {r:.2}x")),
            )?;
        }
    }
    for c in [1usize, 8] {
        if let (Some(u), Some(l), Some(a), Some(m)) = (
            p50_at(cells, unlogged, c),
            p50_at(cells, logged, c),
            p50_at(cells, async_commit, c),
            p50_at(cells, Target::Memory, c),
        ) {
            writeln!(
                w,
                "- At {c} client(s), p50: UNLOGGED {u} µs, LOGGED {l} µs ({:.2}x UNLOGGED), LOGGED + async commit {a} µs ({:.2}x), memory {m} µs \
                 (UNLOGGED is {:.0}x memory: \"near memory speed\" means one database round trip, not memory).",
                l as f64 / u as f64,
                a as f64 / u as f64,
                u as f64 / m.max(1) as f64
            )?;
        }
    }
    if let (Some(r), Some(u)) = (p50_at(cells, Target::Redis, 1), p50_at(cells, unlogged, 1)) {
        writeln!(
            w,
            "- Redis at one client: p50 {r} µs, {:.2}x UNLOGGED.",
            r as f64 / u as f64
        )?;
    }
    if let (Some(u), Some(l)) = (
        volumes.iter().find(|v| v.mode == TableMode::Unlogged),
        volumes.iter().find(|v| v.mode == TableMode::Logged),
    ) {
        writeln!(
            w,
            "- WAL: UNLOGGED writes {:.0} bytes per operation, LOGGED {:.0} ({:.0}x). This is the ADR's real saving; whether it \
             matters depends on WAL volume limits and replication, not on request latency alone.",
            u.wal_bytes_per_op,
            l.wal_bytes_per_op,
            l.wal_bytes_per_op / u.wal_bytes_per_op.max(1.0)
        )?;
    }
    writeln!(
        w,
        "- fsync on this machine measured {} before and {} after: the LOGGED figures move with it. On hardware with slow fsync, LOGGED \
         latency at one client is dominated by it; `synchronous_commit = off` removes that wait while keeping the table crash-safe \
         except for the last moments, and is replicated, which UNLOGGED is not.",
        fsync_before.map_or("n/a".into(), |v| format!("{v:.0} µs")),
        fsync_after.map_or("n/a".into(), |v| format!("{v:.0} µs"))
    )?;
    for f in floors {
        writeln!(
            w,
            "- {}: the library costs {:.2}x the raw driver sending the same statements ({:.0} vs {:.0} µs per claim + complete).",
            f.target.name(),
            f.ratio,
            f.library_us,
            f.raw_us
        )?;
    }
    if let Some(best) = best_throughput(cells, unlogged) {
        let peak_10k = 10_000.0 * 20.0 / 86_400.0 * 10.0;
        writeln!(
            w,
            "- The 10,000 MAU trigger: at 20 writes per user per day and a 10x peak, 10,000 users make {peak_10k:.1} requests/s at peak, \
             against {best:.0}/s measured for UNLOGGED on this machine ({:.0}x headroom). Throughput is not what should trigger a move \
             to Redis at that scale; the reasons that remain are availability (UNLOGGED loses every key on a crash of community \
             PostgreSQL and is absent on standbys) and load on the primary database, which the WAL and size figures above let you size.",
            best / peak_10k
        )?;
    }
    Ok(())
}
