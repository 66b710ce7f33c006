//! The proof across two services: callers send orders through a lossy proxy to the orders
//! process, whose charges go through another lossy proxy to payments; the orders process is
//! SIGKILLed between a charge and its commit, and after a commit, in turn, and restarted; then
//! every order is checked against both services' tables ([`ProofReport::failures`]).

mod callers;
mod check;

pub use check::ProofReport;

use crate::orders::{ChargeKey, PARKED, ParkAt};
use crate::proxy::LossyProxy;
use crate::{DemoError, payments, prepare_schema, quoted_schema};
use idempotency::ClaimMode;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::watch;

/// What the proof runs.
#[derive(Clone, Debug)]
pub struct ProofConfig {
    /// The database both services use (a schema of the proof's own in it, dropped at the end
    /// unless `keep_schema`).
    pub database_url: String,
    /// This crate's binary, which runs the orders process (`orders` subcommand).
    pub binary: PathBuf,
    /// The orders service's claim mode.
    pub claim_mode: ClaimMode,
    /// How many logical orders the callers send.
    pub orders: usize,
    /// How many callers send at once.
    pub callers: usize,
    /// How many times the orders process is killed: between a charge and its commit, then
    /// after a commit, in turn.
    pub kills: usize,
    /// Which request of a fresh orders process parks for its kill (the `n`th to get there).
    pub park_at: usize,
    /// The orders service's lease: how long a killed process's keys stay held in the lease
    /// mode.
    pub lease: Duration,
    /// Keep the proof's schema (to look at the tables afterwards).
    pub keep_schema: bool,
    /// The key orders charges with: [`ChargeKey::Derived`] but to see the proof fail.
    pub charge_key: ChargeKey,
}

impl ProofConfig {
    /// 200 orders from 16 callers, 4 kills, the lease mode with a 3 s lease.
    pub fn new(database_url: impl Into<String>, binary: impl Into<PathBuf>) -> Self {
        ProofConfig {
            database_url: database_url.into(),
            binary: binary.into(),
            claim_mode: ClaimMode::Lease,
            orders: 200,
            callers: 16,
            kills: 4,
            park_at: 3,
            lease: Duration::from_secs(3),
            keep_schema: false,
            charge_key: ChargeKey::Derived,
        }
    }
}

/// Runs the proof and reports what every order came to. An error is the proof's own
/// (the database unreachable, the orders process not starting); what the services did wrong is
/// in the report.
pub async fn run(config: &ProofConfig) -> Result<ProofReport, DemoError> {
    let schema = format!(
        "orders_demo_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    );
    prepare_schema(&config.database_url, &schema).await?;
    let outcome = run_in(config, &schema).await;
    if !config.keep_schema {
        let client = crate::connect(&config.database_url).await?;
        client
            .batch_execute(&format!("DROP SCHEMA {} CASCADE", quoted_schema(&schema)?))
            .await?;
    }
    outcome
}

async fn run_in(config: &ProofConfig, schema: &str) -> Result<ProofReport, DemoError> {
    let started = Instant::now();
    let payments_app = payments::router(&config.database_url, schema).await?;
    let payments_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let payments_address = payments_listener.local_addr()?;
    tokio::spawn(async move {
        if let Err(e) = axum::serve(payments_listener, payments_app).await {
            tracing::error!(error = %e, "payments stopped");
        }
    });
    let to_payments = LossyProxy::start(payments_address).await?;
    let orders_address = free_port()?;
    let to_orders = LossyProxy::start(orders_address).await?;

    let (done, done_rx) = watch::channel(false);
    let supervisor = tokio::spawn(supervise(
        config.clone(),
        schema.to_owned(),
        orders_address,
        format!("http://{}", to_payments.address()),
        done_rx,
    ));
    let answers = callers::send_all(
        config.orders,
        config.callers,
        &format!("http://{}/orders", to_orders.address()),
    )
    .await?;
    // Every key again, straight to the orders process: each must replay its first answer.
    let replays = callers::send_again(&answers, &format!("http://{orders_address}/orders")).await?;
    let _ = done.send(true);
    let kills = supervisor
        .await
        .map_err(|e| DemoError::OrdersProcess(format!("the supervisor failed: {e}")))??;
    let tables = check::Tables::read(&config.database_url, schema).await?;
    Ok(ProofReport {
        claim_mode: config.claim_mode,
        answers,
        replays,
        kills,
        kills_planned: config.kills,
        to_orders: to_orders.losses(),
        to_payments: to_payments.losses(),
        tables,
        took: started.elapsed(),
    })
}

/// A free loopback port, for the orders process (it binds it again after each restart).
fn free_port() -> Result<SocketAddr, DemoError> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?)
}

/// Runs the orders process, kills it each time it parks (up to `config.kills` times, the park
/// point alternating), restarts it, and stops the last one when `done`. Returns where each
/// kill happened.
async fn supervise(
    config: ProofConfig,
    schema: String,
    address: SocketAddr,
    payments: String,
    mut done: watch::Receiver<bool>,
) -> Result<Vec<ParkAt>, DemoError> {
    let mut kills = Vec::new();
    loop {
        let park = if kills.len() >= config.kills {
            None
        } else if kills.len() % 2 == 0 {
            Some(ParkAt::AfterCharge(config.park_at))
        } else {
            Some(ParkAt::AfterCommit(config.park_at))
        };
        let mut child = spawn_orders(&config, &schema, address, &payments, park)?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| DemoError::OrdersProcess("no stdout".into()))?;
        let mut lines = BufReader::new(stdout).lines();
        let parked = loop {
            tokio::select! {
                line = lines.next_line() => match line? {
                    Some(line) if line.starts_with(PARKED) => break true,
                    Some(_) => {}
                    None => {
                        let status = child.wait().await?;
                        return Err(DemoError::OrdersProcess(format!("it exited: {status}")));
                    }
                },
                _ = done.changed() => break false,
            }
        };
        // SIGKILL, as a crash or an OOM kill: no drop, no drain, no goodbye to the database.
        child.kill().await?;
        match (parked, park) {
            (true, Some(point)) => kills.push(point),
            _ => return Ok(kills),
        }
    }
}

fn spawn_orders(
    config: &ProofConfig,
    schema: &str,
    address: SocketAddr,
    payments: &str,
    park: Option<ParkAt>,
) -> Result<Child, DemoError> {
    let mode = match config.claim_mode {
        ClaimMode::Lease => "lease",
        _ => "one-transaction",
    };
    let mut command = Command::new(&config.binary);
    command
        .arg("orders")
        .args(["--listen", &address.to_string()])
        .args(["--payments", payments])
        .args(["--database-url", &config.database_url])
        .args(["--schema", schema])
        .args(["--claim-mode", mode])
        .args([
            "--lease",
            &humantime::format_duration(config.lease).to_string(),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
    if config.charge_key == ChargeKey::FreshEachRun {
        command.arg("--fresh-charge-key-each-run");
    }
    match park {
        Some(ParkAt::AfterCharge(n)) => command.args(["--park-after-charge", &n.to_string()]),
        Some(ParkAt::AfterCommit(n)) => command.args(["--park-after-commit", &n.to_string()]),
        None => &mut command,
    };
    Ok(command.spawn()?)
}
