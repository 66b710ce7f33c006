//! `tasks-consumer`: consumes "create task" messages from RabbitMQ and creates each task once on
//! PostgreSQL (see the crate docs).

use clap::Parser;
use idempotency::IdempotencyStore;
use idempotency_consumer_demo::{Consumer, ConsumerConfig, ConsumerError};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

/// Consumes "create task" messages (JSON `{"user": .., "title": ..}`, the key in the
/// `message_id` property) and creates each task once, acking after the commit.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// The broker.
    #[arg(
        long,
        env = "AMQP_URL",
        default_value = "amqp://guest:guest@127.0.0.1:5672/%2f",
        hide_env_values = true,
        hide_default_value = true
    )]
    amqp_url: String,
    /// The database of the tasks and of the key table.
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/postgres",
        hide_env_values = true
    )]
    database_url: String,
    /// The queue (its dead letters go to `<queue>.dead`).
    #[arg(long, default_value = "tasks")]
    queue: String,
    /// Messages processed at once.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Stop once the queue was idle this many seconds (for batch runs).
    #[arg(long, value_name = "SECONDS")]
    exit_when_idle: Option<f64>,
    /// Wait this many milliseconds between a message's commit and its ack: a window to kill
    /// the process in, to see what a crash there costs (one replay, no second task).
    #[arg(long, value_name = "MS", default_value_t = 0, hide = true)]
    hold_ack_ms: u64,
    /// Deliveries of one message before a failure that may pass (the database down, a
    /// serialization failure) dead-letters it instead of requeuing it again.
    #[arg(long, default_value_t = idempotency_consumer_demo::DEFAULT_DELIVERY_LIMIT)]
    delivery_limit: u32,
    /// Serve `GET /metrics`, `/health/live` and `/health/ready` on this address (port 0: any
    /// free port); its first stdout line then says where: `operations on http://ADDR`.
    #[arg(long, value_name = "ADDR")]
    ops_listen: Option<std::net::SocketAddr>,
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .init();
    let args = Args::parse();
    let mut config = ConsumerConfig::new(&args.amqp_url, &args.database_url, &args.queue);
    config.concurrency = args.concurrency;
    config.exit_when_idle = match args.exit_when_idle.map(Duration::try_from_secs_f64) {
        None => None,
        Some(Ok(idle)) => Some(idle),
        Some(Err(error)) => {
            eprintln!("--exit-when-idle: {error}");
            return ExitCode::from(2);
        }
    };
    config.hold_ack = Duration::from_millis(args.hold_ack_ms);
    config.delivery_limit = args.delivery_limit;
    let metrics = match args
        .ops_listen
        .map(|_| idempotency_demo::operations::install_metrics())
    {
        None => None,
        Some(Ok(handle)) => Some(handle),
        Some(Err(error)) => {
            eprintln!("tasks-consumer: the metrics recorder: {error}");
            return ExitCode::FAILURE;
        }
    };
    let run = async {
        let consumer = Consumer::connect(config).await?;
        if let (Some(addr), Some(metrics)) = (args.ops_listen, metrics) {
            let store: Arc<dyn IdempotencyStore> = Arc::new(consumer.store().clone());
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(ConsumerError::Operations)?;
            println!(
                "operations on http://{}",
                listener.local_addr().map_err(ConsumerError::Operations)?
            );
            let routes = idempotency_demo::operations::routes(store, metrics);
            tokio::spawn(async move {
                if let Err(error) = axum::serve(listener, routes).await {
                    tracing::error!(%error, "the operations endpoints stopped");
                }
            });
        }
        consumer.run().await
    };
    match run.await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("tasks-consumer: {}", idempotency::ErrorChain(&error));
            ExitCode::FAILURE
        }
    }
}
