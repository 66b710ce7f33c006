//! What a service on PostgreSQL sees: the same create-task handler (one `INSERT` into a LOGGED
//! `bench_tasks` table) served bare and behind the layer in each claim mode and key-table mode,
//! each variant in its own process, driven over loopback keep-alive connections in interleaved
//! rounds. Per round: requests/s, p50/p99 and the WAL the database wrote per request; each
//! variant's ratio to the bare `BEGIN; INSERT; COMMIT` handler of the same round.
//!
//! `idempotency-bench serve-pg-tasks` runs one variant; [`compare`] runs them all.

use crate::http::{Round, ServerProcess, Workload, round};
use crate::{err, median};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::{Json, Router};
use bytes::Bytes;
use idempotency::postgres::deadpool_postgres::Pool;
use idempotency::postgres::tokio_postgres;
use idempotency::{
    ClaimMode, IdempotencyLayer, PgTransaction, PostgresStore, Scope, TableMode, Tx,
};
use std::net::SocketAddr;
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
    pub const ALL: [PgVariant; 7] = [
        PgVariant::BareTransaction,
        PgVariant::BareAutocommit,
        PgVariant::HandWritten,
        PgVariant::Layer {
            mode: ClaimMode::Lease,
            table: TableMode::Unlogged,
        },
        PgVariant::Layer {
            mode: ClaimMode::Lease,
            table: TableMode::Logged,
        },
        PgVariant::Layer {
            mode: ClaimMode::OneTransaction,
            table: TableMode::Unlogged,
        },
        PgVariant::Layer {
            mode: ClaimMode::OneTransaction,
            table: TableMode::Logged,
        },
    ];

    /// Its name on the command line and in tables.
    pub fn name(self) -> &'static str {
        match self {
            PgVariant::BareAutocommit => "bare-autocommit",
            PgVariant::BareTransaction => "bare-transaction",
            PgVariant::HandWritten => "hand-written-one-transaction",
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
            PgVariant::Layer {
                mode: ClaimMode::OneTransaction,
                ..
            } => "3 (BEGIN + key lookup, INSERT, key insert + COMMIT)",
            PgVariant::Layer { .. } => "4 (claim, BEGIN + check, INSERT, completion + COMMIT)",
        }
    }
}

#[derive(Clone)]
struct App {
    pool: Pool,
    autocommit: bool,
    keys: String,
}

const INSERT: &str =
    "INSERT INTO idempotency_http_bench.bench_tasks (user_id, title) VALUES ($1, $2) RETURNING id";

fn user_and_title(headers: &HeaderMap, body: &Bytes) -> (String, String) {
    let user = headers
        .get("x-user")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("anonymous")
        .to_owned();
    (user, String::from_utf8_lossy(body).into_owned())
}

fn created(id: i64, title: String) -> (StatusCode, Json<serde_json::Value>) {
    (
        StatusCode::CREATED,
        Json(serde_json::json!({ "id": id, "title": title })),
    )
}

async fn bare(
    State(app): State<App>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<(StatusCode, Json<serde_json::Value>), StatusCode> {
    let (user, title) = user_and_title(&headers, &body);
    let unavailable = |_| StatusCode::SERVICE_UNAVAILABLE;
    let mut client = app
        .pool
        .get()
        .await
        .map_err(|_| StatusCode::SERVICE_UNAVAILABLE)?;
    let statement = client.prepare_cached(INSERT).await.map_err(unavailable)?;
    let id: i64 = if app.autocommit {
        client
            .query_one(&statement, &[&user, &title])
            .await
            .map_err(unavailable)?
            .get(0)
    } else {
        let tx = client.transaction().await.map_err(unavailable)?;
        let id = tx
            .query_one(&statement, &[&user, &title])
            .await
            .map_err(unavailable)?
            .get(0);
        tx.commit().await.map_err(unavailable)?;
        id
    };
    Ok(created(id, title))
}

/// The one-transaction mode's SQL without the library: what the mode costs at the SQL level.
async fn hand_written(
    State(app): State<App>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<(StatusCode, Json<serde_json::Value>), StatusCode> {
    let (user, title) = user_and_title(&headers, &body);
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .ok_or(StatusCode::BAD_REQUEST)?
        .to_owned();
    let unavailable = |_| StatusCode::SERVICE_UNAVAILABLE;
    let client = app
        .pool
        .get()
        .await
        .map_err(|_| StatusCode::SERVICE_UNAVAILABLE)?;
    let lookup = client
        .prepare_cached(&format!(
            "SELECT response FROM {} WHERE user_id = $1 AND key = $2 AND expires_at > now()",
            app.keys
        ))
        .await
        .map_err(unavailable)?;
    let task = client.prepare_cached(INSERT).await.map_err(unavailable)?;
    let insert_key = client
        .prepare_cached(&format!(
            "INSERT INTO {} (user_id, key, request_hash, status_code, response, expires_at) \
             VALUES ($1, $2, $3, $4, $5, now() + interval '1 day')",
            app.keys
        ))
        .await
        .map_err(unavailable)?;
    let lookup_params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&user, &key];
    let (begun, found) = tokio::join!(
        client.batch_execute("BEGIN"),
        client.query_opt(&lookup, &lookup_params)
    );
    begun.map_err(unavailable)?;
    if let Some(row) = found.map_err(unavailable)? {
        let _ = client.batch_execute("ROLLBACK").await;
        let stored: Vec<u8> = row.get(0);
        return Ok((
            StatusCode::CREATED,
            Json(serde_json::from_slice(&stored).unwrap_or_default()),
        ));
    }
    let id: i64 = client
        .query_one(&task, &[&user, &title])
        .await
        .map_err(unavailable)?
        .get(0);
    let answer = serde_json::json!({ "id": id, "title": title });
    let stored = serde_json::to_vec(&answer).unwrap_or_default();
    let hash = [0u8; 33];
    let (hash, status) = (&hash[..], 201i32);
    let key_params: [&(dyn tokio_postgres::types::ToSql + Sync); 5] =
        [&user, &key, &hash, &status, &stored];
    let (inserted, committed) = tokio::join!(
        client.execute(&insert_key, &key_params),
        client.batch_execute("COMMIT")
    );
    inserted.map_err(unavailable)?;
    committed.map_err(unavailable)?;
    Ok((StatusCode::CREATED, Json(answer)))
}

async fn in_tx(
    tx: Tx<PgTransaction>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<(StatusCode, Json<serde_json::Value>), StatusCode> {
    let (user, title) = user_and_title(&headers, &body);
    let unavailable = |_| StatusCode::SERVICE_UNAVAILABLE;
    let statement = tx.prepare_cached(INSERT).await.map_err(unavailable)?;
    let id: i64 = tx
        .query_one(&statement, &[&user, &title])
        .await
        .map_err(unavailable)?
        .get(0);
    Ok(created(id, title))
}

/// The app of `variant` on the database at `url`, with a pool of `pool` connections.
pub async fn app(variant: PgVariant, url: &str, pool: usize) -> Result<Router, String> {
    let table = match variant {
        PgVariant::Layer { table, .. } => table,
        PgVariant::HandWritten => TableMode::Logged,
        _ => TableMode::Unlogged,
    };
    let store = PostgresStore::builder(url)
        .schema(SCHEMA)
        .table(match table {
            TableMode::Logged => "keys_logged",
            _ => "keys_unlogged",
        })
        .table_mode(table)
        .pool_size(pool)
        .build()
        .await
        .map_err(err)?;
    store.migrate().await.map_err(err)?;
    let router = match variant {
        PgVariant::BareAutocommit | PgVariant::BareTransaction => {
            Router::new().route("/tasks", post(bare)).with_state(App {
                pool: store.pool().clone(),
                autocommit: variant == PgVariant::BareAutocommit,
                keys: store.table_name(),
            })
        }
        PgVariant::HandWritten => Router::new()
            .route("/tasks", post(hand_written))
            .with_state(App {
                pool: store.pool().clone(),
                autocommit: false,
                keys: store.table_name(),
            }),
        PgVariant::Layer { mode, .. } => {
            fn scope(parts: &axum::http::request::Parts) -> Option<Scope> {
                parts
                    .headers
                    .get("x-user")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|u| Scope::new(u).ok())
            }
            let layer = IdempotencyLayer::builder(store)
                .scope_with(scope)
                .claim_mode(mode)
                .build();
            Router::new().route("/tasks", post(in_tx).layer(layer))
        }
    };
    Ok(router)
}

/// Creates the bench's schema and task table afresh.
pub async fn prepare(url: &str) -> Result<(), String> {
    let client = connect(url).await?;
    client
        .batch_execute(&format!(
            "DROP SCHEMA IF EXISTS {SCHEMA} CASCADE; CREATE SCHEMA {SCHEMA}; \
             CREATE TABLE {SCHEMA}.bench_tasks (id bigserial PRIMARY KEY, user_id text NOT NULL, \
               title text NOT NULL, created_at timestamptz NOT NULL DEFAULT now())"
        ))
        .await
        .map_err(err)
}

/// Drops the bench's schema.
pub async fn cleanup(url: &str) -> Result<(), String> {
    connect(url)
        .await?
        .batch_execute(&format!("DROP SCHEMA IF EXISTS {SCHEMA} CASCADE"))
        .await
        .map_err(err)
}

async fn connect(url: &str) -> Result<tokio_postgres::Client, String> {
    // The store's own connector: the URL's `sslmode` and `sslrootcert` as the store reads them.
    idempotency::postgres::connect_raw(url).await.map_err(err)
}

/// Serves `variant` on `listen` and prints `listening on <addr>` once bound.
pub async fn serve(
    listen: SocketAddr,
    variant: PgVariant,
    url: &str,
    pool: usize,
) -> Result<(), String> {
    let app = app(variant, url, pool).await?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| e.to_string())?;
    println!(
        "listening on {}",
        listener.local_addr().map_err(|e| e.to_string())?
    );
    axum::serve(listener, app).await.map_err(|e| e.to_string())
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

/// One round of one variant: its figures, WAL bytes per request, database CPU per request.
type Measured = (Round, f64, Option<Duration>);

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
    let figures = round(&server, Workload::FreshKeys, connections, length).await?;
    let db_cpu = match (db_before, postgres_cpu()) {
        (Some(before), Some(after)) => Some(after.saturating_sub(before)),
        _ => None,
    };
    let wal = (wal_lsn(admin).await? - before) as f64;
    let requests = (figures.throughput * length.as_secs_f64()).max(1.0);
    Ok((
        figures,
        wal / requests,
        db_cpu.map(|cpu| cpu.div_f64(requests)),
    ))
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
            let cpu = |f: &dyn Fn(&Measured) -> Option<Duration>| {
                let values: Option<Vec<f64>> = pairs
                    .iter()
                    .map(|(v, _)| f(v).map(|d| d.as_secs_f64()))
                    .collect();
                values.map(|mut v| Duration::from_secs_f64(median(&mut v)))
            };
            let ratio = median(
                &mut pairs
                    .iter()
                    .map(|(v, b)| v.0.throughput / b.0.throughput)
                    .collect::<Vec<_>>(),
            );
            let p99_ratio = median(
                &mut pairs
                    .iter()
                    .map(|(v, b)| v.0.p99.as_secs_f64() / b.0.p99.as_secs_f64())
                    .collect::<Vec<_>>(),
            );
            rows.push(PgRow {
                variant,
                clients: connections,
                throughput: pick(&|(f, ..)| f.throughput),
                p50: Duration::from_secs_f64(pick(&|(f, ..)| f.p50.as_secs_f64())),
                p99: Duration::from_secs_f64(pick(&|(f, ..)| f.p99.as_secs_f64())),
                wal_per_request: pick(&|(_, w, _)| *w),
                ratio,
                p99_ratio,
                app_cpu: cpu(&|(f, ..)| f.cpu_per_request),
                db_cpu: cpu(&|(.., d)| *d),
            });
        }
    }
    cleanup(url).await?;
    Ok(rows)
}

/// The rows as a Markdown table.
pub fn markdown_table(rows: &[PgRow]) -> String {
    let mut table = String::from(
        "| clients | handler | req/s | × bare transaction | p50 | p99 | p99 × bare transaction | WAL / request | app CPU / request | database CPU / request | round trips |\n\
         | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n",
    );
    let us = |d: Option<Duration>| {
        d.map_or("?".to_owned(), |d| {
            format!("{:.0} µs", d.as_secs_f64() * 1e6)
        })
    };
    for row in rows {
        table.push_str(&format!(
            "| {} | {} | {:.0} | {:.2}x | {:.2} ms | {:.2} ms | {:.2}x | {:.0} B | {} | {} | {} |\n",
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
            row.variant.round_trips(),
        ));
    }
    table
}
