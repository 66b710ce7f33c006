//! The re-evaluation report: workload, floor, WAL, size, capacity model, chart, Markdown.

use hdrhistogram::Histogram;
use idempotency::{
    Begin, Completion, Engine, EngineConfig, IdempotencyStore, LeaseToken, TableMode,
};
use idempotency_bench::{
    Connected, LEASE, RETENTION, Raw, Servers, Target, bench_fingerprint, bench_response,
    bench_scope, connect, err, fresh_key,
};
use indicatif::{ProgressBar, ProgressStyle};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Settings of one report run.
#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// PostgreSQL URL (default: IDEMPOTENCY_TEST_POSTGRES_URL or the loopback server).
    #[arg(long)]
    postgres: Option<String>,
    /// Redis URL (default: IDEMPOTENCY_TEST_REDIS_URL or the loopback server).
    #[arg(long)]
    redis: Option<String>,
    /// Where to write the Markdown report; the chart goes beside it as `<name>-latency.svg`.
    #[arg(long, default_value = "docs/reevaluation.md")]
    out: PathBuf,
    /// Requests per store, mode and concurrency level.
    #[arg(long, default_value_t = 3000)]
    requests: usize,
    /// Concurrency levels (clients in flight at once).
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 8, 32, 64])]
    concurrency: Vec<usize>,
    /// Interleaved rounds of library vs raw driver at one client.
    #[arg(long, default_value_t = 21)]
    floor_rounds: usize,
    /// Operations per side in each floor round.
    #[arg(long, default_value_t = 100)]
    floor_ops: usize,
    /// Claim+complete operations measured for WAL bytes per operation.
    #[arg(long, default_value_t = 2000)]
    wal_ops: usize,
    /// Capacity model: idempotent writes per user per day.
    #[arg(long, default_value_t = 20.0)]
    writes_per_user_per_day: f64,
    /// Capacity model: peak rate over the daily average.
    #[arg(long, default_value_t = 10.0)]
    peak_factor: f64,
    /// Capacity model: retention in hours.
    #[arg(long, default_value_t = 24.0)]
    retention_hours: f64,
}

/// One workload cell.
struct Cell {
    target: Target,
    concurrency: usize,
    p50_us: u64,
    p95_us: u64,
    p99_us: u64,
    throughput: f64,
    unexpected: usize,
}

/// Library vs raw driver, interleaved at one client.
struct Floor {
    target: Target,
    library_us: f64,
    raw_us: f64,
    ping_us: f64,
    ratio: f64,
}

/// One store's claim+complete latency in the interleaved comparison.
struct Compare {
    target: Target,
    concurrency: usize,
    median_us: f64,
    ratio_to_unlogged: f64,
}

/// WAL and size per Postgres mode.
struct PgVolume {
    mode: TableMode,
    wal_bytes_per_op: f64,
    bytes_per_row: f64,
    rows: i64,
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    if values.is_empty() {
        return f64::NAN;
    }
    values[values.len() / 2]
}

/// Runs the mixed workload: 70% fresh requests (claim + complete), 20% retries of completed
/// requests (replay), 10% duplicates of a request still in flight (409).
async fn workload(
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
async fn interleaved(
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
            let store = Arc::clone(&connected[index].1.store);
            let mut tasks = Vec::new();
            for _ in 0..concurrency {
                let store = Arc::clone(&store);
                tasks.push(tokio::spawn(async move {
                    let (scope, fp, response) =
                        (bench_scope(), bench_fingerprint(), bench_response());
                    let mut samples = Vec::new();
                    for _ in 0..ops.div_ceil(concurrency) {
                        let (key, token) = (fresh_key(), LeaseToken::new());
                        let t = Instant::now();
                        store
                            .claim(&scope, &key, &fp, token, LEASE)
                            .await
                            .map_err(err)?;
                        let _ = store
                            .complete(&scope, &key, token, &response, RETENTION)
                            .await
                            .map_err(err)?;
                        samples.push(t.elapsed().as_secs_f64() * 1e6);
                    }
                    Ok::<_, String>(samples)
                }));
            }
            let mut samples = Vec::new();
            for task in tasks {
                samples.extend(task.await.map_err(err)??);
            }
            this_round[index] = median(&mut samples);
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
async fn floor(
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
                        let (key, token) = (fresh_key(), LeaseToken::new());
                        connected
                            .store
                            .claim(&scope, &key, &fp, token, LEASE)
                            .await
                            .map_err(err)?;
                        let _ = connected
                            .store
                            .complete(&scope, &key, token, &response, RETENTION)
                            .await
                            .map_err(err)?;
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
async fn pg_volume(connected: &Connected, mode: TableMode, ops: usize) -> Result<PgVolume, String> {
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
        let (key, token) = (fresh_key(), LeaseToken::new());
        connected
            .store
            .claim(&scope, &key, &fp, token, LEASE)
            .await
            .map_err(err)?;
        let _ = connected
            .store
            .complete(&scope, &key, token, &response, RETENTION)
            .await
            .map_err(err)?;
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

/// `pg_test_fsync`'s fdatasync time for one 8 kB write, in microseconds, in `dir`.
fn fsync_us(dir: &std::path::Path) -> Option<f64> {
    let bin = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(Result::ok)
        .map(|e| e.path().join("bin/pg_test_fsync"))
        .find(|p| p.exists())?;
    let file = dir.join(format!("idem-fsync-{}.tmp", std::process::id()));
    let mut child = std::process::Command::new(bin)
        .args(["-s", "1", "-f"])
        .arg(&file)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .ok()?;
    let stdout = child.stdout.take()?;
    let mut found = None;
    use std::io::BufRead;
    for line in std::io::BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
    {
        let words: Vec<&str> = line.split_whitespace().collect();
        if words.first() == Some(&"fdatasync") && words.len() >= 5 {
            found = words[3].parse().ok();
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_file(&file);
    found
}

fn command_output(program: &str, args: &[&str]) -> String {
    std::process::Command::new(program)
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let memory = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines().next().map(|l| {
                l.split_whitespace()
                    .nth(1)
                    .unwrap_or("0")
                    .parse::<f64>()
                    .unwrap_or(0.0)
                    / 1048576.0
            })
        })
        .unwrap_or(0.0);
    format!(
        "{} cores ({cpu}), {memory:.0} GiB memory, Linux {}",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0),
        command_output("uname", &["-r"])
    )
}

/// Runs everything and writes the report; returns its path.
pub(crate) async fn run(args: Args) -> Result<PathBuf, String> {
    let defaults = Servers::default();
    let servers = Servers {
        postgres: args.postgres.clone().unwrap_or(defaults.postgres),
        redis: args.redis.clone().unwrap_or(defaults.redis),
    };
    let max_c = args.concurrency.iter().copied().max().unwrap_or(1);
    let steps = Target::ALL.len() * (args.concurrency.len() + 2) + 4;
    let progress = ProgressBar::new(steps as u64);
    progress.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:40}] {pos}/{len} {msg}")
            .map_err(err)?
            .progress_chars("=> "),
    );

    // The environment first, so every LOGGED figure has its fsync time beside it.
    progress.set_message("environment");
    let pg_env = match connect(Target::Postgres(TableMode::Unlogged), &servers, 1).await {
        Ok(c) => {
            let pg = c.postgres.clone().ok_or("no Postgres store")?;
            let client = pg.pool().get().await.map_err(err)?;
            let row = client
                .query_one(
                    "SELECT version(), current_setting('synchronous_commit'), current_setting('fsync'), \
                     current_setting('wal_level'), current_setting('shared_buffers'), current_setting('data_directory')",
                    &[],
                )
                .await
                .map_err(err)?;
            drop(client);
            c.cleanup().await;
            Some((
                row.get::<_, String>(0),
                row.get::<_, String>(1),
                row.get::<_, String>(2),
                row.get::<_, String>(3),
                row.get::<_, String>(4),
                row.get::<_, String>(5),
            ))
        }
        Err(_) => None,
    };
    let fsync_dir = pg_env
        .as_ref()
        .map(|e| PathBuf::from(&e.5))
        .and_then(|d| d.parent().map(PathBuf::from))
        .filter(|d| d.exists())
        .unwrap_or_else(std::env::temp_dir);
    let fsync_before = fsync_us(&fsync_dir);
    let redis_env = match idempotency::redis::redis::Client::open(servers.redis.as_str()) {
        Ok(client) => match client.get_multiplexed_async_connection().await {
            Ok(mut con) => {
                use idempotency::redis::redis::cmd;
                let info: String = cmd("INFO")
                    .arg("server")
                    .query_async(&mut con)
                    .await
                    .unwrap_or_default();
                let version = info
                    .lines()
                    .find_map(|l| l.strip_prefix("redis_version:"))
                    .unwrap_or("?")
                    .trim()
                    .to_owned();
                let save: Vec<String> = cmd("CONFIG")
                    .arg("GET")
                    .arg("save")
                    .query_async(&mut con)
                    .await
                    .unwrap_or_default();
                let aof: Vec<String> = cmd("CONFIG")
                    .arg("GET")
                    .arg("appendonly")
                    .query_async(&mut con)
                    .await
                    .unwrap_or_default();
                Some((
                    version,
                    save.get(1).cloned().unwrap_or_default(),
                    aof.get(1).cloned().unwrap_or_default(),
                ))
            }
            Err(_) => None,
        },
        Err(_) => None,
    };
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
    let fsync_after = fsync_us(&fsync_dir);
    for (_, c) in &connected {
        c.cleanup().await;
    }
    progress.finish_with_message("done");

    if let Some(parent) = args.out.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(err)?;
    }
    let chart_path = args.out.with_file_name(format!(
        "{}-latency.svg",
        args.out
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or("report")
    ));
    chart(&chart_path, &cells, &args.concurrency)?;

    let mut md = String::new();
    let w = &mut md;
    let _ = writeln!(w, "# ADR 009 re-evaluated: measured on this machine\n");
    let _ = writeln!(
        w,
        "Written by `cargo run --release -p idempotency-bench -- report` on {}. Every number below was \
         measured in this one run; rerun the command against your own database (`--postgres URL --redis URL`) \
         before trusting any of them, and on Aurora in particular (AWS: the UNLOGGED saving \"may not be as \
         significant\" there).\n",
        command_output("date", &["-u", "+%Y-%m-%d %H:%M UTC"])
    );
    let _ = writeln!(w, "## Machine and settings\n");
    let _ = writeln!(w, "- Machine: {}", machine());
    if let Some((version, sync, fsync, wal_level, shared_buffers, _)) = &pg_env {
        let _ = writeln!(w, "- PostgreSQL: {version}");
        let _ = writeln!(
            w,
            "  - `synchronous_commit = {sync}` (server default; the async-commit mode sets `off` on its own connections), `fsync = {fsync}`, `wal_level = {wal_level}`, `shared_buffers = {shared_buffers}`"
        );
    }
    let fmt_fsync =
        |v: Option<f64>| v.map_or("not measured".to_owned(), |us| format!("{us:.0} µs"));
    let _ = writeln!(
        w,
        "- fsync (`pg_test_fsync`, one 8 kB `fdatasync`, in `{}`): {} before the runs, {} after. A LOGGED commit waits for one; this time swings by 10x and more over minutes on shared machines.",
        fsync_dir.display(),
        fmt_fsync(fsync_before),
        fmt_fsync(fsync_after)
    );
    if let Some((version, save, aof)) = &redis_env {
        let _ = writeln!(
            w,
            "- Redis {version}: `save \"{save}\"`, `appendonly {aof}` (persistence decides what a restart keeps)"
        );
    }
    let _ = writeln!(
        w,
        "- Servers on loopback; client and servers share the machine's cores."
    );
    for s in &skipped {
        let _ = writeln!(w, "- Skipped (unreachable): {s}");
    }
    let _ = writeln!(
        w,
        "\n## Latency and throughput\n\n{} requests per cell through the engine (what the layer calls): 70% fresh requests \
         (claim + complete), 20% retries of completed requests (replay), 10% duplicates of a request still in flight (409). \
         Latency in microseconds per request.\n",
        args.requests
    );
    let _ = writeln!(
        w,
        "| store | clients | p50 µs | p95 µs | p99 µs | requests/s | unexpected outcomes |"
    );
    let _ = writeln!(w, "| --- | ---: | ---: | ---: | ---: | ---: | ---: |");
    for c in &cells {
        let _ = writeln!(
            w,
            "| {} | {} | {} | {} | {} | {:.0} | {} |",
            c.target.name(),
            c.concurrency,
            c.p50_us,
            c.p95_us,
            c.p99_us,
            c.throughput,
            c.unexpected
        );
    }
    let _ = writeln!(
        w,
        "\n![p50 latency by concurrency]({})\n",
        chart_path
            .file_name()
            .and_then(|s| s.to_str())
            .unwrap_or("")
    );
    let _ = writeln!(
        w,
        "## UNLOGGED vs LOGGED vs async commit, interleaved\n\nClaim + complete of fresh keys on every store, in rounds whose \
         order rotates ({} rounds of {} operations per store at one client, {} at eight), so a change of fsync time or loopback \
         latency during the run hits every store alike. Medians of the per-round medians, and the median of the per-round ratios \
         to UNLOGGED.\n",
        args.floor_rounds,
        args.floor_ops,
        args.floor_ops * 4
    );
    let _ = writeln!(w, "| store | clients | median µs | ratio to UNLOGGED |");
    let _ = writeln!(w, "| --- | ---: | ---: | ---: |");
    for c in &compares {
        let _ = writeln!(
            w,
            "| {} | {} | {:.0} | {:.2} |",
            c.target.name(),
            c.concurrency,
            c.median_us,
            c.ratio_to_unlogged
        );
    }
    let _ = writeln!(
        w,
        "\n## The floor: library vs the same statements sent directly\n\nOne client, {} interleaved rounds of {} operations per side \
         (library, raw driver, and a trivial round trip, alternating order). An operation is a claim and a complete of a fresh key: \
         the library through its pool and types, the raw side with one prepared tokio-postgres connection or one redis connection \
         running the same SQL or Lua. Medians of the per-round medians, and the median of the per-round ratios.\n",
        args.floor_rounds, args.floor_ops
    );
    let _ = writeln!(
        w,
        "| store | library µs | raw driver µs | library / raw | `SELECT 1` / `PING` µs |"
    );
    let _ = writeln!(w, "| --- | ---: | ---: | ---: | ---: |");
    for f in &floors {
        let _ = writeln!(
            w,
            "| {} | {:.0} | {:.0} | {:.2} | {:.0} |",
            f.target.name(),
            f.library_us,
            f.raw_us,
            f.ratio,
            f.ping_us
        );
    }
    let _ = writeln!(
        w,
        "\n## PostgreSQL: WAL and size\n\nWAL from `pg_current_wal_lsn()` before and after {} claim+complete operations at one client \
         (the server is shared, so other activity adds to it); size is `pg_total_relation_size` (table, TOAST, primary key and \
         `expires_at` index) over the live rows.\n",
        args.wal_ops
    );
    let _ = writeln!(
        w,
        "| mode | WAL bytes / operation | bytes / live row | per million live keys | rows measured |"
    );
    let _ = writeln!(w, "| --- | ---: | ---: | ---: | ---: |");
    for v in &volumes {
        let _ = writeln!(
            w,
            "| {} | {:.0} | {:.0} | {:.0} MiB | {} |",
            v.mode.name(),
            v.wal_bytes_per_op,
            v.bytes_per_row,
            v.bytes_per_row * 1e6 / 1048576.0,
            v.rows
        );
    }
    capacity(w, &args, &cells, &volumes);
    verdict(
        w,
        &cells,
        &compares,
        &floors,
        &volumes,
        fsync_before,
        fsync_after,
    );
    std::fs::write(&args.out, md).map_err(|e| format!("writing {}: {e}", args.out.display()))?;
    Ok(args.out)
}

fn best_throughput(cells: &[Cell], target: Target) -> Option<f64> {
    cells
        .iter()
        .filter(|c| c.target == target)
        .map(|c| c.throughput)
        .reduce(f64::max)
}

fn p50_at(cells: &[Cell], target: Target, concurrency: usize) -> Option<u64> {
    cells
        .iter()
        .find(|c| c.target == target && c.concurrency == concurrency)
        .map(|c| c.p50_us)
}

fn capacity(w: &mut String, args: &Args, cells: &[Cell], volumes: &[PgVolume]) {
    let _ = writeln!(
        w,
        "\n## Capacity model\n\nAssumptions (flags of the report command): {} idempotent writes per user per day, peak {}x the daily \
         average, retention {} h. Rows held = writes per day x retention; storage uses the measured bytes per row; WAL per day uses \
         the measured WAL per operation; headroom = best measured throughput on this machine / peak requests per second.\n",
        args.writes_per_user_per_day, args.peak_factor, args.retention_hours
    );
    let unlogged = volumes.iter().find(|v| v.mode == TableMode::Unlogged);
    let logged = volumes.iter().find(|v| v.mode == TableMode::Logged);
    let pg_best = best_throughput(cells, Target::Postgres(TableMode::Unlogged));
    let redis_best = best_throughput(cells, Target::Redis);
    let _ = writeln!(
        w,
        "| MAU | writes/day | peak req/s | rows held | UNLOGGED storage | LOGGED WAL/day | headroom UNLOGGED | headroom Redis |"
    );
    let _ = writeln!(
        w,
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    );
    for mau in [1_000f64, 10_000.0, 100_000.0, 1_000_000.0] {
        let per_day = mau * args.writes_per_user_per_day;
        let peak = per_day / 86_400.0 * args.peak_factor;
        let rows = per_day * args.retention_hours / 24.0;
        let storage = unlogged.map_or("?".into(), |v| {
            format!("{:.1} MiB", rows * v.bytes_per_row / 1048576.0)
        });
        let wal = logged.map_or("?".into(), |v| {
            format!("{:.1} MiB", per_day * v.wal_bytes_per_op / 1048576.0)
        });
        let head = |best: Option<f64>| best.map_or("?".into(), |b| format!("{:.0}x", b / peak));
        let _ = writeln!(
            w,
            "| {mau:.0} | {per_day:.0} | {peak:.1} | {rows:.0} | {storage} | {wal} | {} | {} |",
            head(pg_best),
            head(redis_best)
        );
    }
}

fn verdict(
    w: &mut String,
    cells: &[Cell],
    compares: &[Compare],
    floors: &[Floor],
    volumes: &[PgVolume],
    fsync_before: Option<f64>,
    fsync_after: Option<f64>,
) {
    let _ = writeln!(w, "\n## Verdict (from the numbers above)\n");
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
            let _ = writeln!(
                w,
                "- Interleaved at {clients} client(s), claim + complete: LOGGED takes {l:.2}x the time of UNLOGGED, LOGGED with \
                 `synchronous_commit = off` {a:.2}x{}.",
                ratio(Target::Redis).map_or(String::new(), |r| format!(", Redis {r:.2}x")),
            );
        }
    }
    for c in [1usize, 8] {
        if let (Some(u), Some(l), Some(a), Some(m)) = (
            p50_at(cells, unlogged, c),
            p50_at(cells, logged, c),
            p50_at(cells, async_commit, c),
            p50_at(cells, Target::Memory, c),
        ) {
            let _ = writeln!(
                w,
                "- At {c} client(s), p50: UNLOGGED {u} µs, LOGGED {l} µs ({:.2}x UNLOGGED), LOGGED + async commit {a} µs ({:.2}x), memory {m} µs \
                 (UNLOGGED is {:.0}x memory: \"near memory speed\" means one database round trip, not memory).",
                l as f64 / u as f64,
                a as f64 / u as f64,
                u as f64 / m.max(1) as f64
            );
        }
    }
    if let (Some(r), Some(u)) = (p50_at(cells, Target::Redis, 1), p50_at(cells, unlogged, 1)) {
        let _ = writeln!(
            w,
            "- Redis at one client: p50 {r} µs, {:.2}x UNLOGGED.",
            r as f64 / u as f64
        );
    }
    if let (Some(u), Some(l)) = (
        volumes.iter().find(|v| v.mode == TableMode::Unlogged),
        volumes.iter().find(|v| v.mode == TableMode::Logged),
    ) {
        let _ = writeln!(
            w,
            "- WAL: UNLOGGED writes {:.0} bytes per operation, LOGGED {:.0} ({:.0}x). This is the ADR's real saving; whether it \
             matters depends on WAL volume limits and replication, not on request latency alone.",
            u.wal_bytes_per_op,
            l.wal_bytes_per_op,
            l.wal_bytes_per_op / u.wal_bytes_per_op.max(1.0)
        );
    }
    let _ = writeln!(
        w,
        "- fsync on this machine measured {} before and {} after: the LOGGED figures move with it. On hardware with slow fsync, LOGGED \
         latency at one client is dominated by it; `synchronous_commit = off` removes that wait while keeping the table crash-safe \
         except for the last moments, and is replicated, which UNLOGGED is not.",
        fsync_before.map_or("n/a".into(), |v| format!("{v:.0} µs")),
        fsync_after.map_or("n/a".into(), |v| format!("{v:.0} µs"))
    );
    for f in floors {
        let _ = writeln!(
            w,
            "- {}: the library costs {:.2}x the raw driver sending the same statements ({:.0} vs {:.0} µs per claim + complete).",
            f.target.name(),
            f.ratio,
            f.library_us,
            f.raw_us
        );
    }
    if let Some(best) = best_throughput(cells, unlogged) {
        let peak_10k = 10_000.0 * 20.0 / 86_400.0 * 10.0;
        let _ = writeln!(
            w,
            "- The 10,000 MAU trigger: at 20 writes per user per day and a 10x peak, 10,000 users make {peak_10k:.1} requests/s at peak, \
             against {best:.0}/s measured for UNLOGGED on this machine ({:.0}x headroom). Throughput is not what should trigger a move \
             to Redis at that scale; the reasons that remain are availability (UNLOGGED loses every key on a crash of community \
             PostgreSQL and is absent on standbys) and load on the primary database, which the WAL and size figures above let you size.",
            best / peak_10k
        );
    }
}

/// Draws p50 latency by concurrency, one line per store, on a log scale.
fn chart(path: &std::path::Path, cells: &[Cell], levels: &[usize]) -> Result<(), String> {
    use plotters::prelude::*;
    let max = cells.iter().map(|c| c.p50_us).max().unwrap_or(1).max(2) as f64 * 1.5;
    let min = cells.iter().map(|c| c.p50_us).min().unwrap_or(1).max(1) as f64 / 1.5;
    let root = SVGBackend::new(path, (900, 520)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption("p50 latency per request by concurrency", ("sans-serif", 22))
        .margin(16)
        .margin_right(48)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(
            0f64..(levels.len().max(2) - 1) as f64,
            (min..max).log_scale(),
        )
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_labels(levels.len())
        .x_label_formatter(&|x| {
            levels
                .get(x.round() as usize)
                .map_or(String::new(), |c| format!("{c} clients"))
        })
        .y_desc("µs (log scale)")
        .draw()
        .map_err(err)?;
    let colors = [RED, BLUE, GREEN, MAGENTA, BLACK];
    for (i, target) in Target::ALL.iter().enumerate() {
        let points: Vec<(f64, f64)> = levels
            .iter()
            .enumerate()
            .filter_map(|(x, &c)| p50_at(cells, *target, c).map(|p| (x as f64, p as f64)))
            .collect();
        if points.is_empty() {
            continue;
        }
        let color = colors[i % colors.len()];
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
            .map_err(err)?
            .label(target.name())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart
            .draw_series(
                points
                    .into_iter()
                    .map(|p| Circle::new(p, 3, color.filled())),
            )
            .map_err(err)?;
    }
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}
