//! The command line of the demo service (`cargo run -p idempotency-demo`).

use clap::Parser;
use std::net::SocketAddr;

/// ADR 009's task API behind the idempotency layer.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:3000")]
    listen: SocketAddr,
    /// Idempotency store: `memory` (embedded, nothing to set up), `postgres://...` (tasks and
    /// keys in that database), `redis://...` or `redis+cluster://host:port,host:port`.
    #[arg(
        long,
        env = "IDEMPOTENCY_STORE",
        default_value = "memory",
        hide_env_values = true
    )]
    store: String,
    /// Idempotency lease in seconds: how long the key of a request whose process died stays
    /// blocked before a retry may run it.
    #[arg(long, value_name = "SECONDS", default_value_t = 60.0)]
    lease: f64,
    /// How long responses are replayed, in seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 86_400.0)]
    retention: f64,
    /// On PostgreSQL, write tasks on their own connection instead of in the request's
    /// idempotency transaction: shows the hazard the transaction removes (a crash between the
    /// task and its stored response makes the retry create a second task).
    #[arg(long)]
    tasks_outside_transaction: bool,
    /// On PostgreSQL, how each key is held: `speculative` (the default: inside the request's
    /// one transaction, looked up with the handler's first statement), `one-transaction` (the
    /// same, looked up before the handler runs) or `lease` (a committed claim with a lease, the
    /// mode for handlers that call something outside the database). Elsewhere always `lease`.
    #[arg(long, value_name = "MODE", default_value = "speculative", value_parser = claim_mode)]
    claim_mode: idempotency::ClaimMode,
    /// The same as `--claim-mode lease`.
    #[arg(long, conflicts_with = "claim_mode")]
    lease_mode: bool,
    /// On PostgreSQL, the key table's persistence: `logged` (survives a database crash with
    /// the tasks), `unlogged` (the ADR's choice: emptied by a database crash) or
    /// `logged_async_commit` (for the lease mode: claims commit without waiting for their WAL
    /// flush). Default: a new table is LOGGED, an existing one keeps its mode.
    #[arg(long, value_name = "MODE")]
    table_mode: Option<idempotency::TableMode>,
    /// On shutdown (Ctrl-C, SIGTERM), how long to wait for running requests to finish and
    /// their responses to be stored.
    #[arg(long, value_name = "SECONDS", default_value = "30", value_parser = drain_seconds)]
    drain_timeout: std::time::Duration,
}

fn claim_mode(value: &str) -> Result<idempotency::ClaimMode, String> {
    match value {
        "speculative" => Ok(idempotency::ClaimMode::OneTransactionSpeculative),
        "one-transaction" => Ok(idempotency::ClaimMode::OneTransaction),
        "lease" => Ok(idempotency::ClaimMode::Lease),
        other => Err(format!(
            "unknown claim mode {other:?}: use speculative, one-transaction or lease"
        )),
    }
}

fn drain_seconds(value: &str) -> Result<std::time::Duration, String> {
    let seconds: f64 = value
        .parse()
        .map_err(|_| format!("not a number of seconds: {value}"))?;
    std::time::Duration::try_from_secs_f64(seconds).map_err(|e| format!("{value}: {e}"))
}

/// Seconds from the command line as a duration, or a message saying what is wrong.
fn seconds(flag: &str, value: f64) -> Result<std::time::Duration, String> {
    std::time::Duration::try_from_secs_f64(value)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| format!("--{flag} must be a positive number of seconds, not {value}"))
}

/// Parses the command line, then serves the task API until Ctrl-C or SIGTERM.
pub async fn run() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,idempotency=debug".into()),
        )
        .init();
    let args = Args::parse();
    let options = crate::Options {
        lease: seconds("lease", args.lease)?,
        retention: seconds("retention", args.retention)?,
        tasks_in_transaction: !args.tasks_outside_transaction,
        claim_mode: if args.lease_mode {
            idempotency::ClaimMode::Lease
        } else {
            args.claim_mode
        },
        table_mode: args.table_mode,
    };
    let metrics = crate::operations::install_metrics()?;
    let app = crate::build_app_with(&args.store, &options)
        .await
        .map_err(|e| idempotency::ErrorChain(&e).to_string())?;
    let router = app.router.merge(crate::operations::metrics_route(
        metrics,
        Some(app.store.clone()),
    ));
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    let scheme_only = args.store.split("://").next().unwrap_or("memory");
    tracing::info!(
        "listening on http://{} (store: {scheme_only})",
        listener.local_addr()?
    );
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown_signal())
        .await?;
    // The server has answered every connection it had; handlers whose client left run on
    // their own, and responses may still be being stored in the background. Wait for them, so a
    // deploy cuts no side effect in half and leaves no key claimed until its lease runs out.
    let running = app.drain.running();
    if running > 0 {
        tracing::info!(running, "waiting for detached requests to finish");
    }
    match tokio::time::timeout(args.drain_timeout, app.drain.drained()).await {
        Ok(()) => tracing::info!("stopped"),
        Err(_) => tracing::warn!(
            running = app.drain.running(),
            "stopped before every request finished; their keys stay claimed until their lease runs out"
        ),
    }
    Ok(())
}

/// Resolves on Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::warn!(%e, "could not listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(e) => {
                tracing::warn!(%e, "could not listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = terminate => {},
    }
    tracing::info!("shutting down: finishing in-flight requests");
}
