//! The demo service: `cargo run -p idempotency-demo` serves the task API on 127.0.0.1:3000 with
//! the embedded memory store.

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
    #[arg(long, env = "IDEMPOTENCY_STORE", default_value = "memory")]
    store: String,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,idempotency=debug".into()),
        )
        .init();
    let args = Args::parse();
    let app = idempotency_demo::build_app(&args.store)
        .await
        .map_err(|e| {
            let mut message = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                message.push_str(": ");
                message.push_str(&s.to_string());
                source = s.source();
            }
            message
        })?;
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    let scheme_only = args.store.split("://").next().unwrap_or("memory");
    tracing::info!(
        "listening on http://{} (store: {scheme_only})",
        listener.local_addr()?
    );
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown_signal())
        .await?;
    tracing::info!("stopped");
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
