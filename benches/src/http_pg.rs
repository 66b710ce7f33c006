//! What a service on PostgreSQL sees: the same create-task handler (one `INSERT` into a LOGGED
//! `bench_tasks` table) served bare and behind the layer in each claim mode and key-table mode,
//! each variant in its own process, driven over loopback keep-alive connections in interleaved
//! rounds. Per round: requests/s, p50/p99 and the WAL the database wrote per request; each
//! variant's ratio to the bare `BEGIN; INSERT; COMMIT` handler of the same round.
//!
//! `idempotency-bench serve-pg-tasks` runs one variant; [`compare`] runs them all.

mod server;

use server::*;
pub use server::{app, cleanup, prepare, serve};

use crate::http::{Round, ServerProcess, Workload, round};
use crate::{err, median};
use idempotency::postgres::tokio_postgres;
use idempotency::{ClaimMode, TableMode};
use std::time::Duration;

/// The schema the bench creates (and drops) for its tables.
pub const SCHEMA: &str = "idempotency_http_bench";

/// One server variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PgVariant {
    /// The handler alone, its `INSERT` in autocommit.
    BareAutocommit,
    /// The handler alone, `BEGIN; INSERT; COMMIT` (tokio-postgres's `transaction()` and
    /// `commit()`: three round trips).
    BareTransaction,
    /// No layer: the one-transaction mode's guarantees written by hand on the LOGGED key table
    /// (`BEGIN` pipelined with a plain lookup; the task; a plain `INSERT` of the key, whose unique
    /// violation aborts the transaction, pipelined with `COMMIT`): the SQL floor of the mode.
    HandWritten,
    /// No layer: the speculative mode's SQL written by hand (`BEGIN`, a plain lookup and the
    /// task pipelined; a plain `INSERT` of the key pipelined with `COMMIT`): its SQL floor, two
    /// round trips for a fresh key.
    HandWrittenSpeculative,
    /// Behind the layer in `mode`, its `INSERT` in the request's `Tx`, keys in a `table` table.
    Layer {
        /// How the key is held.
        mode: ClaimMode,
        /// The key table's persistence.
        table: TableMode,
    },
}

impl PgVariant {
    /// Every variant the comparison runs, the reference (bare transaction) first.
    pub const ALL: [PgVariant; 11] = [
        PgVariant::BareTransaction,
        PgVariant::BareAutocommit,
        PgVariant::HandWritten,
        PgVariant::HandWrittenSpeculative,
        PgVariant::Layer {
            mode: ClaimMode::Lease,
            table: TableMode::Unlogged,
        },
        PgVariant::Layer {
            mode: ClaimMode::Lease,
            table: TableMode::Logged,
        },
        PgVariant::Layer {
            mode: ClaimMode::Lease,
            table: TableMode::LoggedAsyncCommit,
        },
        PgVariant::Layer {
            mode: ClaimMode::OneTransaction,
            table: TableMode::Unlogged,
        },
        PgVariant::Layer {
            mode: ClaimMode::OneTransaction,
            table: TableMode::Logged,
        },
        PgVariant::Layer {
            mode: ClaimMode::OneTransactionSpeculative,
            table: TableMode::Unlogged,
        },
        PgVariant::Layer {
            mode: ClaimMode::OneTransactionSpeculative,
            table: TableMode::Logged,
        },
    ];

    /// Its name on the command line and in tables.
    pub fn name(self) -> &'static str {
        match self {
            PgVariant::BareAutocommit => "bare-autocommit",
            PgVariant::BareTransaction => "bare-transaction",
            PgVariant::HandWritten => "hand-written-one-transaction",
            PgVariant::HandWrittenSpeculative => "hand-written-speculative",
            PgVariant::Layer {
                mode: ClaimMode::OneTransactionSpeculative,
                table: TableMode::Logged,
            } => "speculative-logged",
            PgVariant::Layer {
                mode: ClaimMode::OneTransactionSpeculative,
                ..
            } => "speculative-unlogged",
            PgVariant::Layer {
                mode: ClaimMode::OneTransaction,
                table: TableMode::Logged,
            } => "one-transaction-logged",
            PgVariant::Layer {
                mode: ClaimMode::OneTransaction,
                ..
            } => "one-transaction-unlogged",
            PgVariant::Layer {
                table: TableMode::Logged,
                ..
            } => "lease-logged",
            PgVariant::Layer {
                table: TableMode::LoggedAsyncCommit,
                ..
            } => "lease-logged-async-commit",
            PgVariant::Layer { .. } => "lease-unlogged",
        }
    }

    /// The variant named `name`.
    pub fn parse(name: &str) -> Option<PgVariant> {
        PgVariant::ALL.into_iter().find(|v| v.name() == name)
    }

    /// What a reader should know about its round trips per fresh-key request.
    pub fn round_trips(self) -> &'static str {
        match self {
            PgVariant::BareAutocommit => "1",
            PgVariant::BareTransaction => "3 (BEGIN, INSERT, COMMIT)",
            PgVariant::HandWritten => "3 (BEGIN + key lookup, INSERT, key insert + COMMIT)",
            PgVariant::HandWrittenSpeculative => {
                "2 (BEGIN + key lookup + INSERT, key insert + COMMIT)"
            }
            PgVariant::Layer {
                mode: ClaimMode::OneTransaction,
                ..
            } => "3 (BEGIN + key lookup, INSERT, key insert + COMMIT)",
            PgVariant::Layer {
                mode: ClaimMode::OneTransactionSpeculative,
                ..
            } => "2 (BEGIN + key lookup + INSERT, key insert + COMMIT)",
            PgVariant::Layer { .. } => "4 (claim, BEGIN + check, INSERT, completion + COMMIT)",
        }
    }
}

/// One variant's medians at one client count.
#[derive(Clone, Debug)]
pub struct PgRow {
    /// The variant.
    pub variant: PgVariant,
    /// Connections at once.
    pub clients: usize,
    /// Median requests/s.
    pub throughput: f64,
    /// Median p50.
    pub p50: Duration,
    /// Median p99.
    pub p99: Duration,
    /// Median WAL bytes per request.
    pub wal_per_request: f64,
    /// Median of the per-round ratios of requests/s to the bare transaction's.
    pub ratio: f64,
    /// Median of the per-round ratios of p99 to the bare transaction's.
    pub p99_ratio: f64,
    /// Median CPU time of the server process per request.
    pub app_cpu: Option<Duration>,
    /// Median CPU time of all PostgreSQL processes per request.
    pub db_cpu: Option<Duration>,
    /// Median share of the machine's CPU time that the hypervisor took for others during the
    /// variant's rounds (`steal` in `/proc/stat`): a slow hour shows here.
    pub steal: Option<f64>,
}

/// The machine's CPU ticks stolen by the hypervisor and its total ticks, from `/proc/stat`'s
/// `cpu` line; `None` where it cannot be read.
fn cpu_ticks() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let fields: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|f| f.parse().ok())
        .collect::<Option<_>>()?;
    // user nice system idle iowait irq softirq steal (guest time is counted in user).
    let counted = fields.get(..8)?;
    Some((counted[7], counted.iter().sum()))
}

/// The share of CPU ticks stolen between two readings of [`cpu_ticks`].
fn steal_between(before: Option<(u64, u64)>, after: Option<(u64, u64)>) -> Option<f64> {
    let ((steal0, total0), (steal1, total1)) = (before?, after?);
    let total = total1.checked_sub(total0).filter(|t| *t > 0)?;
    Some(steal1.saturating_sub(steal0) as f64 / total as f64)
}

/// CPU time (user + system) of every process named `postgres`, from `/proc`; `None` where it
/// cannot be read (another OS, a remote server: then the column says `?`).
fn postgres_cpu() -> Option<Duration> {
    let mut ticks = 0u64;
    let mut found = false;
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let Some((head, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        if !head.ends_with("(postgres") {
            continue;
        }
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if let (Some(Ok(user)), Some(Ok(system))) = (
            fields.get(11).map(|f| f.parse::<u64>()),
            fields.get(12).map(|f| f.parse::<u64>()),
        ) {
            ticks += user + system;
            found = true;
        }
    }
    // USER_HZ is 100 on Linux.
    found.then(|| Duration::from_millis(ticks * 10))
}

/// One round of one variant.
#[derive(Clone, Copy)]
struct Measured {
    figures: Round,
    wal_per_request: f64,
    db_cpu: Option<Duration>,
    steal: Option<f64>,
}

async fn wal_lsn(client: &tokio_postgres::Client) -> Result<i64, String> {
    let row = client
        .query_one(
            "SELECT (pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::bigint",
            &[],
        )
        .await
        .map_err(err)?;
    Ok(row.get(0))
}

/// One measured run of `variant`: its own server process, warmed up, then `length` of fresh
/// keys at `connections` connections.
async fn measure_one(
    binary: &std::path::Path,
    url: &str,
    admin: &tokio_postgres::Client,
    variant: PgVariant,
    connections: usize,
    length: Duration,
) -> Result<Measured, String> {
    let args = [
        "serve-pg-tasks",
        "--listen",
        "127.0.0.1:0",
        "--variant",
        variant.name(),
    ];
    // The URL goes in the environment: a password in it must not show in the process list.
    let envs = [("IDEMPOTENCY_BENCH_POSTGRES_URL", url)];
    let server = ServerProcess::spawn_with_env(binary, &args, &envs).await?;
    // Warm up: prepared statements on every connection, the pool filled.
    let warm_up = Duration::from_millis(500);
    round(&server, Workload::FreshKeys, connections, warm_up).await?;
    let before = wal_lsn(admin).await?;
    let db_before = postgres_cpu();
    let ticks_before = cpu_ticks();
    let figures = round(&server, Workload::FreshKeys, connections, length).await?;
    let steal = steal_between(ticks_before, cpu_ticks());
    let db_cpu = match (db_before, postgres_cpu()) {
        (Some(before), Some(after)) => Some(after.saturating_sub(before)),
        _ => None,
    };
    let wal = (wal_lsn(admin).await? - before) as f64;
    let requests = (figures.throughput * length.as_secs_f64()).max(1.0);
    Ok(Measured {
        figures,
        wal_per_request: wal / requests,
        db_cpu: db_cpu.map(|cpu| cpu.div_f64(requests)),
        steal,
    })
}

/// Runs `rounds` rounds at each of `clients` connection counts, on the database at `url` (a pool
/// of 32 connections per server, as the measurement). In each round every variant runs
/// once right beside a run of the bare transaction (the first of `variants`), the order rotated
/// and alternated; a variant's ratio is the median of its ratios to the run beside it.
pub async fn compare(
    url: &str,
    variants: &[PgVariant],
    clients: &[usize],
    rounds: usize,
    length: Duration,
) -> Result<Vec<PgRow>, String> {
    if variants.first() != Some(&PgVariant::BareTransaction) {
        return Err("the first variant must be bare-transaction, the reference".to_owned());
    }
    prepare(url).await?;
    let binary = std::env::current_exe().map_err(|e| e.to_string())?;
    let admin = connect(url).await?;
    let mut rows = Vec::new();
    for &connections in clients {
        let run =
            |variant: PgVariant| measure_one(&binary, url, &admin, variant, connections, length);
        // Per variant: its runs, and the bare transaction's run paired with each.
        let mut paired: Vec<Vec<(Measured, Measured)>> = vec![Vec::new(); variants.len()];
        let mut bare_runs: Vec<Measured> = Vec::new();
        for r in 0..rounds {
            let others = variants.len() - 1;
            for i in 0..others {
                // Rotate the order each round, and alternate which of a pair runs first, so no
                // variant always runs on a warmer or colder machine than its reference.
                let index = 1 + (i + r) % others;
                let (bare, theirs) = if (i + r) % 2 == 0 {
                    let bare = run(PgVariant::BareTransaction).await?;
                    (bare, run(variants[index]).await?)
                } else {
                    let theirs = run(variants[index]).await?;
                    (run(PgVariant::BareTransaction).await?, theirs)
                };
                bare_runs.push(bare);
                paired[index].push((theirs, bare));
            }
            if others == 0 {
                bare_runs.push(run(PgVariant::BareTransaction).await?);
            }
        }
        paired[0] = bare_runs.iter().map(|b| (*b, *b)).collect();
        for (index, &variant) in variants.iter().enumerate() {
            let pairs = &paired[index];
            let pick = |f: &dyn Fn(&Measured) -> f64| {
                median(&mut pairs.iter().map(|(v, _)| f(v)).collect::<Vec<_>>())
            };
            let optional = |f: &dyn Fn(&Measured) -> Option<f64>| {
                let values: Option<Vec<f64>> = pairs.iter().map(|(v, _)| f(v)).collect();
                values.map(|mut v| median(&mut v))
            };
            let cpu = |f: &dyn Fn(&Measured) -> Option<Duration>| {
                optional(&|m| f(m).map(|d| d.as_secs_f64())).map(Duration::from_secs_f64)
            };
            let ratio = median(
                &mut pairs
                    .iter()
                    .map(|(v, b)| v.figures.throughput / b.figures.throughput)
                    .collect::<Vec<_>>(),
            );
            let p99_ratio = median(
                &mut pairs
                    .iter()
                    .map(|(v, b)| v.figures.p99.as_secs_f64() / b.figures.p99.as_secs_f64())
                    .collect::<Vec<_>>(),
            );
            rows.push(PgRow {
                variant,
                clients: connections,
                throughput: pick(&|m| m.figures.throughput),
                p50: Duration::from_secs_f64(pick(&|m| m.figures.p50.as_secs_f64())),
                p99: Duration::from_secs_f64(pick(&|m| m.figures.p99.as_secs_f64())),
                wal_per_request: pick(&|m| m.wal_per_request),
                ratio,
                p99_ratio,
                app_cpu: cpu(&|m| m.figures.cpu_per_request),
                db_cpu: cpu(&|m| m.db_cpu),
                steal: optional(&|m| m.steal),
            });
        }
    }
    cleanup(url).await?;
    Ok(rows)
}

/// The rows as a Markdown table.
pub fn markdown_table(rows: &[PgRow]) -> String {
    let mut table = String::from(
        "| clients | handler | req/s | × bare transaction | p50 | p99 | p99 × bare transaction | WAL / request | app CPU / request | database CPU / request | CPU steal | round trips |\n\
         | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n",
    );
    let us = |d: Option<Duration>| {
        d.map_or("?".to_owned(), |d| {
            format!("{:.0} µs", d.as_secs_f64() * 1e6)
        })
    };
    for row in rows {
        table.push_str(&format!(
            "| {} | {} | {:.0} | {:.2}x | {:.2} ms | {:.2} ms | {:.2}x | {:.0} B | {} | {} | {} | {} |\n",
            row.clients,
            row.variant.name(),
            row.throughput,
            row.ratio,
            row.p50.as_secs_f64() * 1e3,
            row.p99.as_secs_f64() * 1e3,
            row.p99_ratio,
            row.wal_per_request,
            us(row.app_cpu),
            us(row.db_cpu),
            row.steal
                .map_or("?".to_owned(), |s| format!("{:.1}%", s * 100.0)),
            row.variant.round_trips(),
        ));
    }
    table
}
