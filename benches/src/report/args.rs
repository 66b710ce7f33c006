//! The report's command-line arguments.

use std::path::PathBuf;

/// Settings of one report run.
#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// A quick run, about 3 minutes instead of about 20: what the verdict reads (every store
    /// at 1, 8 and 32 clients, the interleaved comparisons, WAL per operation, the layer
    /// through HTTP on memory and on PostgreSQL in every claim and table mode at 32 clients)
    /// with fewer requests and rounds, and without the purge at scale, the pool sweep and the
    /// chaos runs. Its
    /// figures spread more; it writes `target/reevaluation-quick.md` unless `--out` names
    /// another file.
    #[arg(long)]
    pub(crate) quick: bool,
    /// PostgreSQL URL (default: IDEMPOTENCY_TEST_POSTGRES_URL or the loopback server).
    #[arg(long)]
    pub(crate) postgres: Option<String>,
    /// Redis URL (default: IDEMPOTENCY_TEST_REDIS_URL or the loopback server).
    #[arg(long)]
    pub(crate) redis: Option<String>,
    /// A PgBouncer in transaction mode in front of the same PostgreSQL, to measure what the
    /// pooler costs (without it, only the unnamed-statement mode is measured).
    #[arg(long)]
    pub(crate) pgbouncer: Option<String>,
    /// Where to write the Markdown report; the chart goes beside it as `<name>-latency.svg`.
    #[arg(long, default_value = FULL_OUT)]
    pub(crate) out: PathBuf,
    /// Requests per store, mode and concurrency level.
    #[arg(long, default_value_t = 3000)]
    pub(crate) requests: usize,
    /// Concurrency levels (clients in flight at once).
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 8, 32, 64])]
    pub(crate) concurrency: Vec<usize>,
    /// Interleaved rounds of library vs raw driver at one client.
    #[arg(long, default_value_t = 21)]
    pub(crate) floor_rounds: usize,
    /// Operations per side in each floor round.
    #[arg(long, default_value_t = 100)]
    pub(crate) floor_ops: usize,
    /// Claim+complete operations measured for WAL bytes per operation.
    #[arg(long, default_value_t = 2000)]
    pub(crate) wal_ops: usize,
    /// Client counts of the many-clients floor (PostgreSQL UNLOGGED, library vs raw driver on
    /// pools of that size).
    #[arg(long, value_delimiter = ',', default_values_t = [32usize, 64])]
    pub(crate) floor_clients: Vec<usize>,
    /// Pool sizes compared at the largest of `--floor-clients` (all connected at once: keep
    /// their sum under the server's `max_connections`).
    #[arg(long, value_delimiter = ',', default_values_t = [4usize, 8, 16, 32])]
    pub(crate) sweep_pools: Vec<usize>,
    /// Interleaved rounds of the many-clients floor.
    #[arg(long, default_value_t = 9)]
    pub(crate) concurrent_floor_rounds: usize,
    /// Operations per client in each round of the many-clients floor.
    #[arg(long, default_value_t = 40)]
    pub(crate) concurrent_floor_ops: usize,
    /// Interleaved rounds per variant of the HTTP comparison (layer vs no layer); 0 skips it.
    #[arg(long, default_value_t = 5)]
    pub(crate) http_rounds: usize,
    /// Length of one HTTP round, in seconds.
    #[arg(long, default_value_t = 2.0)]
    pub(crate) http_seconds: f64,
    /// Keep-alive connections of the HTTP comparison.
    #[arg(long, default_value_t = 32)]
    pub(crate) http_connections: usize,
    /// Interleaved rounds per variant of the comparison through HTTP on PostgreSQL (the
    /// create-task handler bare and behind the layer in each claim mode and table mode); 0
    /// skips it.
    #[arg(long, default_value_t = 3)]
    pub(crate) http_pg_rounds: usize,
    /// Length of one round of the comparison through HTTP on PostgreSQL, in seconds.
    #[arg(long, default_value_t = 3.0)]
    pub(crate) http_pg_seconds: f64,
    /// Client counts of the comparison through HTTP on PostgreSQL.
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 8, 32])]
    pub(crate) http_pg_clients: Vec<usize>,
    /// Purge at scale: live records of the compressed churn (a day of records; the run inserts
    /// this many per compressed day).
    #[arg(long, default_value_t = 400_000)]
    pub(crate) purge_live_rows: u64,
    /// Purge at scale: compressed days of churn per variant; 0 skips the section.
    #[arg(long, default_value_t = 4)]
    pub(crate) purge_days: u32,
    /// Purge at scale: wall time of one compressed hour, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    pub(crate) purge_hour_ms: u64,
    /// Chaos on a schedule: seconds of chaos in each of its four runs (throwaway PostgreSQL,
    /// Redis and Redis Cluster servers, one run after another); 0 skips the section.
    #[arg(long, default_value_t = 40)]
    pub(crate) chaos_secs: u64,
    /// Capacity model: idempotent writes per user per day.
    #[arg(long, default_value_t = 20.0)]
    pub(crate) writes_per_user_per_day: f64,
    /// Capacity model: peak rate over the daily average.
    #[arg(long, default_value_t = 10.0)]
    pub(crate) peak_factor: f64,
    /// Capacity model: retention in hours.
    #[arg(long, default_value_t = 24.0)]
    pub(crate) retention_hours: f64,
}

/// Where the full report goes unless `--out` says otherwise.
const FULL_OUT: &str = "docs/reevaluation.md";

impl Args {
    /// The settings of a `--quick` run applied over these (a no-op without `--quick`).
    pub(crate) fn settled(mut self) -> Self {
        if !self.quick {
            return self;
        }
        if self.out == std::path::Path::new(FULL_OUT) {
            self.out = PathBuf::from("target/reevaluation-quick.md");
        }
        self.requests = self.requests.min(600);
        self.concurrency = vec![1, 8, 32];
        self.floor_rounds = self.floor_rounds.min(7);
        self.floor_ops = self.floor_ops.min(50);
        self.wal_ops = self.wal_ops.min(500);
        self.floor_clients = vec![32];
        self.sweep_pools = Vec::new();
        self.concurrent_floor_rounds = self.concurrent_floor_rounds.min(3);
        self.concurrent_floor_ops = self.concurrent_floor_ops.min(20);
        self.http_rounds = self.http_rounds.min(2);
        self.http_pg_rounds = self.http_pg_rounds.min(2);
        self.http_pg_seconds = self.http_pg_seconds.min(2.0);
        self.http_pg_clients = vec![32];
        self.purge_days = 0;
        self.chaos_secs = 0;
        self
    }

    /// What the run will take, said before it starts.
    pub(crate) fn expected_duration(&self) -> &'static str {
        if self.quick {
            "a quick run: about 3 minutes on 2 cores (`--quick`; without it, the full report takes about 25)"
        } else {
            "the full report: about 25 minutes on 2 cores (21 min 28 s on 2026-12-02, before the chaos runs \
             were added, which take about 4); `--quick` answers the verdict's questions in about 3"
        }
    }
}
