//! `idempotency-orders-demo`: the two-service proof (`prove`), or one of its services on its own
//! (`orders`, `payments`).

use clap::{Parser, Subcommand, ValueEnum};
use idempotency::ClaimMode;
use idempotency_orders_demo::orders::{self, ChargeKey, OrdersConfig, ParkAt};
use idempotency_orders_demo::proof::{self, ProofConfig};
use idempotency_orders_demo::{DemoError, payments, prepare_schema};
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Parser)]
#[command(
    about = "Orders charging payments, both behind the idempotency layer: the proof that \
                   a retried order is created once and charged once through lossy networks and \
                   a SIGKILLed orders process"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Runs the proof: callers through a lossy proxy to orders (a child process, killed and
    /// restarted), orders through another to payments; then checks every order. Exits 1 when
    /// an order broke the promise.
    Prove {
        #[command(flatten)]
        database: Database,
        /// Logical orders to send.
        #[arg(long, default_value_t = 200)]
        orders: usize,
        /// Callers sending at once.
        #[arg(long, default_value_t = 16)]
        callers: usize,
        /// Times the orders process is killed (after a charge, then after a commit, in turn).
        #[arg(long, default_value_t = 4)]
        kills: usize,
        /// The claim modes to prove, one run each.
        #[arg(long, value_delimiter = ',', default_value = "lease,one-transaction")]
        modes: Vec<Mode>,
        /// The orders service's lease (how long a killed process's keys stay held).
        #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
        lease: Duration,
        /// Keep each run's schema (to look at its tables).
        #[arg(long)]
        keep_schema: bool,
        /// The flaw the proof must catch: orders charges with a fresh key on every run of an
        /// order instead of the derived one (exits 1 when the proof catches it).
        #[arg(long)]
        fresh_charge_key_each_run: bool,
    },
    /// Serves orders.
    Orders {
        #[command(flatten)]
        database: Database,
        /// Where to listen.
        #[arg(long, default_value = "127.0.0.1:3001")]
        listen: SocketAddr,
        /// Payments' base URL.
        #[arg(long, default_value = "http://127.0.0.1:3002")]
        payments: String,
        /// The schema of the tables (created if missing).
        #[arg(long, default_value = "orders_demo")]
        schema: String,
        /// The claim mode.
        #[arg(long, default_value = "lease")]
        claim_mode: Mode,
        /// The lease of a key.
        #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
        lease: Duration,
        /// Park the `n`th request after its charge, for a SIGKILL (the proof's fault).
        #[arg(long, conflicts_with = "park_after_commit")]
        park_after_charge: Option<usize>,
        /// Park the `n`th request after its commit, for a SIGKILL (the proof's fault).
        #[arg(long)]
        park_after_commit: Option<usize>,
        /// Charge with a fresh key on every run (a flaw, for the proof to catch).
        #[arg(long)]
        fresh_charge_key_each_run: bool,
    },
    /// Serves payments.
    Payments {
        #[command(flatten)]
        database: Database,
        /// Where to listen.
        #[arg(long, default_value = "127.0.0.1:3002")]
        listen: SocketAddr,
        /// The schema of the tables (created if missing).
        #[arg(long, default_value = "orders_demo")]
        schema: String,
    },
}

#[derive(clap::Args)]
struct Database {
    /// The PostgreSQL database.
    #[arg(
        long,
        env = "IDEMPOTENCY_POSTGRES_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/postgres"
    )]
    database_url: String,
}

#[derive(Clone, Copy, ValueEnum)]
enum Mode {
    Lease,
    OneTransaction,
}

impl From<Mode> for ClaimMode {
    fn from(mode: Mode) -> ClaimMode {
        match mode {
            Mode::Lease => ClaimMode::Lease,
            Mode::OneTransaction => ClaimMode::OneTransaction,
        }
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("error")),
        )
        .with_writer(std::io::stderr)
        .init();
    match run(Cli::parse().command).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("idempotency-orders-demo: {e}");
            ExitCode::from(2)
        }
    }
}

async fn run(command: Command) -> Result<ExitCode, DemoError> {
    match command {
        Command::Prove {
            database,
            orders,
            callers,
            kills,
            modes,
            lease,
            keep_schema,
            fresh_charge_key_each_run,
        } => {
            let mut held = true;
            for mode in modes {
                let mut config =
                    ProofConfig::new(database.database_url.clone(), std::env::current_exe()?);
                config.claim_mode = mode.into();
                config.orders = orders;
                config.callers = callers;
                config.kills = kills;
                config.lease = lease;
                config.keep_schema = keep_schema;
                config.charge_key = charge_key(fresh_charge_key_each_run);
                let report = proof::run(&config).await?;
                println!("{report}");
                held &= report.failures().is_empty();
            }
            Ok(if held {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Command::Orders {
            database,
            listen,
            payments,
            schema,
            claim_mode,
            lease,
            park_after_charge,
            park_after_commit,
            fresh_charge_key_each_run,
        } => {
            prepare_schema(&database.database_url, &schema).await?;
            let park = park_after_charge
                .map(ParkAt::AfterCharge)
                .or(park_after_commit.map(ParkAt::AfterCommit));
            let app = orders::router(&OrdersConfig {
                database_url: database.database_url,
                schema,
                payments,
                claim_mode: claim_mode.into(),
                lease,
                park,
                charge_key: charge_key(fresh_charge_key_each_run),
            })
            .await?;
            serve(listen, app).await
        }
        Command::Payments {
            database,
            listen,
            schema,
        } => {
            prepare_schema(&database.database_url, &schema).await?;
            serve(
                listen,
                payments::router(&database.database_url, &schema).await?,
            )
            .await
        }
    }
}

fn charge_key(fresh_each_run: bool) -> ChargeKey {
    if fresh_each_run {
        ChargeKey::FreshEachRun
    } else {
        ChargeKey::Derived
    }
}

async fn serve(listen: SocketAddr, app: axum::Router) -> Result<ExitCode, DemoError> {
    let listener = tokio::net::TcpListener::bind(listen).await?;
    println!("listening on {}", listener.local_addr()?);
    axum::serve(listener, app).await?;
    Ok(ExitCode::SUCCESS)
}
