//! `tasks-consumer`: consumes "create task" messages from RabbitMQ and creates each task once on
//! PostgreSQL (see the crate docs).

use clap::Parser;
use idempotency_consumer_demo::{Consumer, ConsumerConfig};
use std::process::ExitCode;
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
    let run = async { Consumer::connect(config).await?.run().await };
    match run.await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("tasks-consumer: {}", idempotency::ErrorChain(&error));
            ExitCode::FAILURE
        }
    }
}
