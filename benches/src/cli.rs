//! The bench's command line.

use crate::report;
use clap::{Parser, Subcommand};
use idempotency_bench::http;

/// The command line.
#[derive(Parser, Debug)]
#[command(
    version,
    about = "Benchmarks, the ADR 009 re-evaluation report, and load"
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Subcommand, Debug)]
pub(crate) enum Command {
    /// Runs the workload on every reachable store and table mode and writes the report.
    Report(Box<report::Args>),
    /// Sends a duplicate-heavy mix to the demo service on each store and counts double
    /// executions; fails when there is one.
    Load(LoadArgs),
    /// The layer's cost through real HTTP: a task API with and without the layer (memory
    /// store), each in its own process, interleaved rounds of fresh keys and replays.
    Http(HttpArgs),
    /// Purge at scale only (a section of the report): days of churn on a throwaway
    /// PostgreSQL, with autovacuum at defaults and as recommended; prints the Markdown table.
    Purge(PurgeArgs),
    /// The two PostgreSQL drivers only (a section of the report): tokio-postgres and sqlx, as
    /// the library and raw, interleaved; prints the Markdown table.
    Drivers(DriversArgs),
    /// What waiting for a Redis replica costs (a section of the report), on a throwaway master
    /// and replica; prints the Markdown table.
    Replicas(DriversArgs),
    /// Serves the task API of `http` (started by `http` and the report).
    #[command(hide = true)]
    ServeTasks(ServeArgs),
    /// Through HTTP on PostgreSQL: a create-task handler bare (autocommit, own transaction)
    /// and behind the layer in each claim mode and key-table mode, interleaved rounds at each
    /// client count; prints the Markdown table.
    HttpPg(HttpPgArgs),
    /// Serves one variant of `http-pg` (started by `http-pg`).
    #[command(hide = true)]
    ServePgTasks(ServePgArgs),
    /// Under contention (issue 45): an orders service on hot stock rows in two instances,
    /// SDK-like clients that cut first attempts off and retry with the same key; throughput and
    /// replay latency per claim mode and pool size, every key checked against the database;
    /// prints the Markdown table.
    Contention(ContentionArgs),
    /// Serves the orders service of `contention` (started by `contention`).
    #[command(hide = true)]
    ServeShop(ServeShopArgs),
    /// How soon a waiting duplicate gets the answer once the original's is stored, on the same
    /// instance and on another, per store; prints the Markdown table.
    Wake(WakeArgs),
    /// The report's chaos runs alone (PostgreSQL restarted in two claim modes, Redis killed, a
    /// Redis Cluster failed over, on throwaway servers); prints the section. Fails when a
    /// run's checks fail.
    Chaos(ChaosArgs),
}

/// Settings of the chaos runs.
#[derive(clap::Args, Debug)]
pub(crate) struct ChaosArgs {
    /// Seconds of chaos in each run.
    #[arg(long, default_value_t = 40)]
    pub(crate) secs: u64,
}

/// Settings of the wake bench.
#[derive(clap::Args, Debug)]
pub(crate) struct WakeArgs {
    /// Stores, comma-separated URLs (`memory`, `postgres://...`, `redis://...`).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "memory,postgres://postgres@127.0.0.1:5432/postgres,redis://127.0.0.1:6379"
    )]
    pub(crate) stores: Vec<String>,
    /// Duplicates per store and instance.
    #[arg(long, default_value_t = 100)]
    pub(crate) trials: usize,
    /// The shortest time the original holds its key, in milliseconds.
    #[arg(long, default_value_t = 20)]
    pub(crate) hold_min_ms: u64,
    /// The longest time the original holds its key, in milliseconds.
    #[arg(long, default_value_t = 80)]
    pub(crate) hold_max_ms: u64,
    /// The claim mode of both engines: `lease`, or `one-transaction` (PostgreSQL only).
    #[arg(long, default_value = "lease", value_parser = ["lease", "one-transaction"])]
    pub(crate) claim_mode: String,
}

/// Settings of the contention bench.
#[derive(clap::Args, Debug)]
pub(crate) struct ContentionArgs {
    /// The database (the bench creates and drops the schema `idempotency_contention` there).
    #[arg(
        long,
        env = "IDEMPOTENCY_BENCH_POSTGRES_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/postgres",
        hide_env_values = true
    )]
    pub(crate) url: String,
    /// Claim modes, comma-separated (`lease`, `one-transaction`, `speculative`).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "lease,one-transaction,speculative"
    )]
    pub(crate) modes: Vec<String>,
    /// Pool sizes, comma-separated; `default` runs the store's default.
    #[arg(long, value_delimiter = ',', default_value = "2,4,8,default")]
    pub(crate) pools: Vec<String>,
    /// Clients sending orders at once.
    #[arg(long, default_value_t = 32)]
    pub(crate) clients: usize,
    /// Seconds of load per run.
    #[arg(long, default_value_t = 10.0)]
    pub(crate) seconds: f64,
    /// Runs of each mode and pool size, interleaved (the table shows the median run).
    #[arg(long, default_value_t = 1)]
    pub(crate) rounds: usize,
    /// Hot items.
    #[arg(long, default_value_t = 5)]
    pub(crate) items: i32,
    /// The lease in milliseconds (default: the library's).
    #[arg(long)]
    pub(crate) lease_ms: Option<u64>,
    /// How many request transactions run at once, comma-separated: `adaptive` (the default)
    /// and `whole-pool` (the pool alone limits them).
    #[arg(long, value_delimiter = ',', default_value = "adaptive")]
    pub(crate) admission: Vec<String>,
}

/// Settings of one `serve-shop` server.
#[derive(clap::Args, Debug)]
pub(crate) struct ServeShopArgs {
    #[arg(long)]
    pub(crate) listen: std::net::SocketAddr,
    /// The database (read from the environment, so a password never shows in the process list).
    #[arg(long, env = "IDEMPOTENCY_BENCH_POSTGRES_URL", hide_env_values = true)]
    pub(crate) url: String,
    #[arg(long)]
    pub(crate) schema: String,
    #[arg(long)]
    pub(crate) mode: String,
    /// The pool size; 0: the store's default.
    #[arg(long)]
    pub(crate) pool: usize,
    #[arg(long)]
    pub(crate) lease_ms: Option<u64>,
    #[arg(long)]
    pub(crate) store_timeout_ms: Option<u64>,
    /// The pool alone limits the request transactions (`TransactionAdmission::WholePool`).
    #[arg(long)]
    pub(crate) whole_pool: bool,
    /// A seeded bug for the checks' own test: refusals stored without `discard_writes`.
    #[arg(long, hide = true)]
    pub(crate) keep_refused_writes: bool,
}

/// Settings of the HTTP comparison on PostgreSQL.
#[derive(clap::Args, Debug)]
pub(crate) struct HttpPgArgs {
    /// The database (the bench creates and drops the schema `idempotency_http_bench` there).
    #[arg(
        long,
        env = "IDEMPOTENCY_BENCH_POSTGRES_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/postgres",
        hide_env_values = true
    )]
    pub(crate) url: String,
    /// Client counts (keep-alive connections at once), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32")]
    pub(crate) clients: Vec<usize>,
    /// Rounds per variant and client count.
    #[arg(long, default_value_t = 3)]
    pub(crate) rounds: usize,
    /// Length of a round, in seconds.
    #[arg(long, default_value_t = 3.0)]
    pub(crate) seconds: f64,
    /// The variants to run, comma-separated (default: all); `bare-transaction`, the reference,
    /// is always run first.
    #[arg(long, value_delimiter = ',')]
    pub(crate) variants: Vec<String>,
    /// Also draw the chart (requests/s and WAL per request by handler) to this SVG file.
    #[arg(long)]
    pub(crate) chart: Option<std::path::PathBuf>,
}

/// Settings of one `serve-pg-tasks` server.
#[derive(clap::Args, Debug)]
pub(crate) struct ServePgArgs {
    #[arg(long)]
    pub(crate) listen: std::net::SocketAddr,
    /// The database (read from the environment, so a password never shows in the process list).
    #[arg(long, env = "IDEMPOTENCY_BENCH_POSTGRES_URL", hide_env_values = true)]
    pub(crate) url: String,
    #[arg(long)]
    pub(crate) variant: String,
    /// The pool size (the env var sets it for every server `http-pg` starts).
    #[arg(long, env = "IDEMPOTENCY_BENCH_POOL", default_value_t = 32)]
    pub(crate) pool: usize,
}

/// Settings of an HTTP comparison.
#[derive(clap::Args, Debug)]
pub(crate) struct HttpArgs {
    /// Keep-alive connections at once.
    #[arg(long, default_value_t = 32)]
    pub(crate) connections: usize,
    /// Rounds per variant and workload.
    #[arg(long, default_value_t = 5)]
    pub(crate) rounds: usize,
    /// Length of a round, in seconds.
    #[arg(long, default_value_t = 2.0)]
    pub(crate) seconds: f64,
    /// The store behind the layer: `memory` (the target's); `null`, a store that keeps
    /// nothing, to see the layer's own cost; or `memory-roomy`, a memory store whose bound no
    /// run reaches, to see the store's cost without eviction.
    #[arg(long, value_enum, default_value_t = http::LayerStore::Memory)]
    pub(crate) store: http::LayerStore,
    /// Compare with the layer on this store instead of the handler alone ("without" is then
    /// this store): `--store memory-prometheus --baseline memory` measures what an installed
    /// Prometheus recorder costs.
    #[arg(long, value_enum)]
    pub(crate) baseline: Option<http::LayerStore>,
}

/// Settings of the purge-at-scale run.
#[derive(clap::Args, Debug)]
pub(crate) struct PurgeArgs {
    /// Live records (a day of records).
    #[arg(long, default_value_t = 400_000)]
    pub(crate) live_rows: u64,
    /// Compressed days of churn per variant.
    #[arg(long, default_value_t = 4)]
    pub(crate) days: u32,
    /// Wall time of one compressed hour, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    pub(crate) hour_ms: u64,
}

/// Settings of an interleaved comparison at one client (drivers, replicas).
#[derive(clap::Args, Debug)]
pub(crate) struct DriversArgs {
    /// Interleaved rounds.
    #[arg(long, default_value_t = 21)]
    pub(crate) rounds: usize,
    /// Operations per side in each round.
    #[arg(long, default_value_t = 100)]
    pub(crate) ops: usize,
}

/// Settings of the task API server.
#[derive(clap::Args, Debug)]
pub(crate) struct ServeArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub(crate) listen: std::net::SocketAddr,
    /// With the idempotency layer on the POST route, on this store.
    #[arg(long, value_enum)]
    pub(crate) layer: Option<http::LayerStore>,
}

/// Settings of a load run.
#[derive(clap::Args, Debug)]
pub(crate) struct LoadArgs {
    /// Stores to run on (repeatable). Default: memory, the loopback PostgreSQL and Redis.
    #[arg(long)]
    pub(crate) store: Vec<String>,
    /// The long mode (not in CI): at least 10^5 duplicates per store, on memory, PostgreSQL
    /// UNLOGGED and LOGGED, Redis, and a throwaway three-master Redis Cluster; 60,000 logical
    /// requests per store unless `--logical` says otherwise.
    #[arg(long)]
    pub(crate) long: bool,
    /// Logical requests (distinct keys) per store (default 5,000; 60,000 in the long mode).
    #[arg(long)]
    pub(crate) logical: Option<usize>,
    /// Clients at once.
    #[arg(long, default_value_t = 32)]
    pub(crate) concurrency: usize,
    /// Duplicates per burst.
    #[arg(long, default_value_t = 8)]
    pub(crate) burst: usize,
}
