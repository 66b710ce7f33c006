//! The re-evaluation report: `probe` reads the environment, `measure` runs the workloads,
//! `chart` draws the latency chart, and `render` writes the Markdown from the results.

mod args;
pub(crate) mod chaos;
pub(crate) mod chart;
pub(crate) mod drivers;
mod measure;
mod probe;
pub(crate) mod purge;
pub(crate) mod render;
pub(crate) mod replicas;

pub(crate) use args::Args;
use idempotency::TableMode;
use idempotency_bench::http::{self, HttpCompare};
use idempotency_bench::{Servers, Target, connect, err};
use indicatif::{ProgressBar, ProgressStyle};
use measure::{
    Cell, Compare, ConcurrentFloor, Floor, PgVolume, PoolSweep, TierReplay, concurrent_floor,
    floor, interleaved, pg_volume, pool_sweep, tier_replay, workload,
};
use std::path::PathBuf;

/// The capacity model's assumptions.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Model {
    pub(crate) writes_per_user_per_day: f64,
    pub(crate) peak_factor: f64,
    pub(crate) retention_hours: f64,
}

/// How the measurements were taken (for the text around them).
#[derive(Clone, Debug)]
pub(crate) struct Settings {
    /// A `--quick` run.
    pub(crate) quick: bool,
    pub(crate) requests: usize,
    pub(crate) floor_rounds: usize,
    pub(crate) floor_ops: usize,
    pub(crate) wal_ops: usize,
    pub(crate) http_seconds: f64,
    pub(crate) model: Model,
}

/// Everything the report says, measured in one run.
#[derive(Debug)]
pub(crate) struct Results {
    pub(crate) settings: Settings,
    pub(crate) environment: probe::Environment,
    pub(crate) cells: Vec<Cell>,
    pub(crate) compares: Vec<Compare>,
    /// UNLOGGED prepared, unnamed, and through PgBouncer (ratios to prepared).
    pub(crate) pooler: Vec<Compare>,
    pub(crate) floors: Vec<Floor>,
    /// PostgreSQL UNLOGGED with many clients, library vs raw driver.
    pub(crate) concurrent_floors: Vec<ConcurrentFloor>,
    /// PostgreSQL UNLOGGED at the most clients over pools of several sizes.
    pub(crate) pool_sweep: Vec<PoolSweep>,
    pub(crate) volumes: Vec<PgVolume>,
    /// Replays from the store vs from a local replay tier in front of it.
    pub(crate) tier_replays: Vec<TierReplay>,
    /// The layer vs the same handler without it, through HTTP (fresh keys, replays).
    pub(crate) http: Vec<HttpCompare>,
    /// Through HTTP on PostgreSQL: each claim mode and table mode against the bare handler.
    pub(crate) http_pg: Vec<idempotency_bench::http_pg::PgRow>,
    /// The file name of the chart of `http_pg`, beside the report (when it was drawn).
    pub(crate) http_pg_chart: Option<String>,
    /// Purge at scale, per table mode and autovacuum setting.
    pub(crate) purges: Vec<purge::PurgeRun>,
    pub(crate) drivers: Vec<drivers::DriverRow>,
    pub(crate) replica_wait: Option<replicas::ReplicaWaitCost>,
    pub(crate) churn: purge::Churn,
    /// Chaos on a schedule (none when skipped), and its seconds per run.
    pub(crate) chaos: Vec<chaos::ChaosRun>,
    pub(crate) chaos_secs: u64,
    /// Stores that could not be reached, and why.
    pub(crate) skipped: Vec<String>,
    pub(crate) fsync_after_us: Option<f64>,
    /// The chart's file name, beside the report.
    pub(crate) chart_file: String,
}

/// Runs everything and writes the report; returns its path.
pub(crate) async fn run(args: Args) -> Result<PathBuf, String> {
    let args = args.settled();
    eprintln!(
        "writing {}: {}",
        args.out.display(),
        args.expected_duration()
    );
    let defaults = Servers::default();
    let servers = Servers {
        postgres: args.postgres.clone().unwrap_or(defaults.postgres),
        redis: args.redis.clone().unwrap_or(defaults.redis),
        pgbouncer: args.pgbouncer.clone(),
    };
    let max_c = args.concurrency.iter().copied().max().unwrap_or(1);
    let steps = Target::ALL.len() * (args.concurrency.len() + 2) + 8;
    let progress = ProgressBar::new(steps as u64);
    progress.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:40}] {pos}/{len} {msg}")
            .map_err(err)?
            .progress_chars("=> "),
    );

    // The environment first, so every LOGGED figure has its fsync time beside it.
    progress.set_message("environment");
    let environment = probe::environment(&servers).await?;
    progress.inc(2);

    // Phase 1: each store alone, one at a time, at every concurrency level; then its WAL and size.
    let mut cells = Vec::new();
    let mut volumes = Vec::new();
    let mut skipped = Vec::new();
    for target in Target::ALL {
        let c = match connect(target, &servers, max_c.clamp(2, 64)).await {
            Ok(c) => c,
            Err(why) => {
                progress.println(format!("skipping {}: {why}", target.name()));
                skipped.push(format!("{}: {why}", target.name()));
                progress.inc(args.concurrency.len() as u64 + 2);
                continue;
            }
        };
        for &concurrency in &args.concurrency {
            progress.set_message(format!("{} at {concurrency} clients", target.name()));
            let (h, throughput, unexpected) = workload(&c, concurrency, args.requests).await?;
            cells.push(Cell {
                target,
                concurrency,
                p50_us: h.value_at_quantile(0.50),
                p95_us: h.value_at_quantile(0.95),
                p99_us: h.value_at_quantile(0.99),
                throughput,
                unexpected,
            });
            progress.inc(1);
        }
        if let Target::Postgres(mode) = target {
            progress.set_message(format!("{}: WAL and size", target.name()));
            volumes.push(pg_volume(&c, mode, args.wal_ops).await?);
        }
        c.cleanup().await;
        progress.inc(2);
    }

    // Phase 2: every store connected with a small pool, compared round by round.
    progress.set_message("interleaved comparison");
    let mut connected = Vec::new();
    for target in Target::ALL {
        if let Ok(c) = connect(target, &servers, 8).await {
            connected.push((target, c));
        }
    }
    let mut compares = interleaved(&connected, 1, args.floor_rounds, args.floor_ops).await?;
    progress.inc(1);
    compares.extend(interleaved(&connected, 8, args.floor_rounds, args.floor_ops * 4).await?);
    progress.inc(1);
    let mut floors = Vec::new();
    for (target, c) in &connected {
        progress.set_message(format!("{}: library vs raw driver", target.name()));
        if let Some(f) = floor(c, &servers, *target, args.floor_rounds, args.floor_ops).await? {
            floors.push(f);
        }
    }
    let mut tier_replays = Vec::new();
    for (target, c) in &connected {
        if matches!(
            target,
            Target::Redis | Target::Postgres(TableMode::Unlogged)
        ) {
            progress.set_message(format!("{}: replays through the local tier", target.name()));
            tier_replays.push(tier_replay(c, *target, args.floor_rounds, args.floor_ops).await?);
        }
    }
    for (_, c) in &connected {
        c.cleanup().await;
    }
    drop(connected);
    let mut concurrent_floors = Vec::new();
    let target = Target::Postgres(TableMode::Unlogged);
    for &clients in &args.floor_clients {
        progress.set_message(format!(
            "{}: raw driver at {clients} clients",
            target.name()
        ));
        match connect(target, &servers, clients).await {
            Ok(c) => {
                concurrent_floors.push(
                    concurrent_floor(
                        &c,
                        target,
                        clients,
                        clients,
                        args.concurrent_floor_rounds,
                        args.concurrent_floor_ops,
                    )
                    .await?,
                );
                c.cleanup().await;
            }
            Err(why) => skipped.push(format!("{} at {clients} clients: {why}", target.name())),
        }
    }
    let mut pools = Vec::new();
    for &pool in &args.sweep_pools {
        match connect(target, &servers, pool).await {
            Ok(c) => pools.push((pool, c)),
            Err(why) => skipped.push(format!("{} with a pool of {pool}: {why}", target.name())),
        }
    }
    let sweep_clients = args.floor_clients.iter().copied().max().unwrap_or(64);
    progress.set_message(format!("pool sizes at {sweep_clients} clients"));
    let pool_sweep = pool_sweep(
        &pools,
        sweep_clients,
        args.concurrent_floor_rounds,
        args.concurrent_floor_ops,
    )
    .await?;
    for (_, c) in &pools {
        c.cleanup().await;
    }
    drop(pools);
    progress.inc(1);

    // Phase 3: what a transaction-mode pooler costs: prepared vs unnamed statements directly,
    // and unnamed through PgBouncer, interleaved.
    progress.set_message("connection pooler");
    let mut pooler_targets = Vec::new();
    for target in Target::POOLER {
        if target == Target::PgBouncer && servers.pgbouncer.is_none() {
            continue;
        }
        match connect(target, &servers, 8).await {
            Ok(c) => pooler_targets.push((target, c)),
            Err(why) => skipped.push(format!("{}: {why}", target.name())),
        }
    }
    let mut pooler = interleaved(&pooler_targets, 1, args.floor_rounds, args.floor_ops).await?;
    pooler.extend(interleaved(&pooler_targets, 8, args.floor_rounds, args.floor_ops * 4).await?);
    for (_, c) in &pooler_targets {
        c.cleanup().await;
    }

    // Phase 3b: the two PostgreSQL drivers, interleaved.
    progress.set_message("tokio-postgres and sqlx");
    let drivers = match drivers::measure(&servers, args.floor_rounds, args.floor_ops).await {
        Ok(rows) => rows,
        Err(why) => {
            skipped.push(format!("tokio-postgres and sqlx: {why}"));
            Vec::new()
        }
    };

    // Phase 3c: what waiting for a Redis replica costs, on a throwaway master and replica.
    progress.set_message("Redis: waiting for replicas (throwaway servers)");
    let replica_wait = match replicas::measure(args.floor_rounds, args.floor_ops).await {
        Ok(cost) => Some(cost),
        Err(why) => {
            skipped.push(format!("Redis: waiting for replicas: {why}"));
            None
        }
    };

    // Phase 4: the layer through real HTTP, against the same handler without it.
    progress.set_message("the layer through HTTP");
    let http = if args.http_rounds == 0 {
        Vec::new()
    } else {
        let length = std::time::Duration::try_from_secs_f64(args.http_seconds).map_err(err)?;
        http::compare_workloads(
            args.http_connections,
            args.http_rounds,
            length,
            http::LayerStore::Memory,
            None,
        )
        .await?
    };
    progress.inc(1);

    // Phase 4b: the create-task handler through HTTP on PostgreSQL, bare and in each mode.
    let http_pg = if args.http_pg_rounds == 0 {
        Vec::new()
    } else {
        progress.set_message("through HTTP on PostgreSQL");
        let length = std::time::Duration::try_from_secs_f64(args.http_pg_seconds).map_err(err)?;
        match idempotency_bench::http_pg::compare(
            &servers.postgres,
            &idempotency_bench::http_pg::PgVariant::ALL,
            &args.http_pg_clients,
            args.http_pg_rounds,
            length,
        )
        .await
        {
            Ok(rows) => rows,
            Err(why) => {
                skipped.push(format!("through HTTP on PostgreSQL: {why}"));
                Vec::new()
            }
        }
    };

    // Phase 5: purge at scale, on a throwaway server of its own.
    let churn = purge::Churn {
        live_rows: args.purge_live_rows,
        days: args.purge_days,
        step: std::time::Duration::from_millis(args.purge_hour_ms),
    };
    let purges = if args.purge_days == 0 {
        Vec::new()
    } else {
        progress.set_message("purge at scale (throwaway server)");
        match purge::measure(churn).await {
            Ok(runs) => runs,
            Err(why) => {
                skipped.push(format!("purge at scale: {why}"));
                Vec::new()
            }
        }
    };
    progress.inc(1);

    // Phase 6: chaos on a schedule, on throwaway servers.
    let chaos = if args.chaos_secs == 0 {
        Vec::new()
    } else {
        progress.set_message("chaos on a schedule (throwaway servers)");
        let (runs, not_run) = chaos::measure(args.chaos_secs).await;
        skipped.extend(not_run);
        runs
    };
    let fsync_after_us = probe::fsync_us(&environment.fsync_dir);
    progress.finish_with_message("done");

    if let Some(parent) = args.out.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(err)?;
    }
    let chart_file = format!(
        "{}-latency.svg",
        args.out
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or("report")
    );
    chart::draw(
        &args.out.with_file_name(&chart_file),
        &cells,
        &args.concurrency,
    )?;
    let http_pg_chart = if http_pg.is_empty() {
        None
    } else {
        let file = chart_file.replace("-latency.svg", "-postgres-http.svg");
        chart::draw_http_pg(&args.out.with_file_name(&file), &http_pg)?;
        Some(file)
    };
    let results = Results {
        settings: Settings {
            quick: args.quick,
            requests: args.requests,
            floor_rounds: args.floor_rounds,
            floor_ops: args.floor_ops,
            wal_ops: args.wal_ops,
            http_seconds: args.http_seconds,
            model: Model {
                writes_per_user_per_day: args.writes_per_user_per_day,
                peak_factor: args.peak_factor,
                retention_hours: args.retention_hours,
            },
        },
        environment,
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
        chaos_secs: args.chaos_secs,
        skipped,
        fsync_after_us,
        chart_file,
    };
    let md = render::markdown(&results).map_err(err)?;
    std::fs::write(&args.out, md).map_err(|e| format!("writing {}: {e}", args.out.display()))?;
    Ok(args.out)
}
