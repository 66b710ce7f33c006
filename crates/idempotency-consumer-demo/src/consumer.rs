//! The consumer: the queue, the work of one message, and the ack that follows its commit.

use crate::message::{CreateTask, Message, TaskResult};
use crate::queues::declare_queues;
use crate::{CREATE_TASKS_TABLE, INSERT_TASK};
use futures_util::StreamExt;
use idempotency::postgres::tokio_postgres::types::Type;
use idempotency::postgres::{PurgeJob, is_permanent_sqlstate};
use idempotency::{
    BoxError, ClaimMode, Engine, EngineConfig, OnceContext, OnceError, Outcome, PostgresStore,
    PostgresTransaction,
};
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions, BasicRejectOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Connection, ConnectionProperties};
use std::io::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::task::JoinSet;

/// [`ConsumerConfig::delivery_limit`] by default: with the requeue backoff (100 ms doubling up
/// to 5 s) a message rides out about a minute and a half of a database outage.
pub const DEFAULT_DELIVERY_LIMIT: u32 = 25;

/// How often expired keys are deleted when pg_cron does not do it.
const PURGE_EVERY: Duration = Duration::from_secs(3600);

/// How a [`Consumer`] runs.
#[derive(Clone, Debug)]
pub struct ConsumerConfig {
    /// The broker, e.g. `amqp://guest:guest@127.0.0.1:5672/%2f`.
    pub amqp_url: String,
    /// The database of the tasks and of the key table.
    pub database_url: String,
    /// The queue to consume; its dead letters go to `<queue>.dead`.
    pub queue: String,
    /// Messages processed at once (the prefetch is twice this).
    pub concurrency: usize,
    /// Stop once no message arrived for this long and none is running (for batch runs and
    /// tests); `None` runs until SIGINT or SIGTERM.
    pub exit_when_idle: Option<Duration>,
    /// How long a duplicate delivered while the first is running waits for it before it is
    /// requeued.
    pub in_flight_wait: Duration,
    /// Wait this long between a message's commit and its ack (0 in production): a window in
    /// which the tests kill the process, to show what a crash there costs.
    pub hold_ack: Duration,
    /// Deliveries of one message before a retryable failure dead-letters it instead of
    /// requeuing it again (counted by the broker: the quorum queue's `x-delivery-count`).
    pub delivery_limit: u32,
}

impl ConsumerConfig {
    /// Defaults for `queue` on the local servers: 16 at once, no idle exit, a 5 s wait for
    /// running duplicates, no ack hold.
    pub fn new(amqp_url: &str, database_url: &str, queue: &str) -> Self {
        ConsumerConfig {
            amqp_url: amqp_url.to_owned(),
            database_url: database_url.to_owned(),
            queue: queue.to_owned(),
            concurrency: 16,
            exit_when_idle: None,
            in_flight_wait: Duration::from_secs(5),
            hold_ack: Duration::ZERO,
            delivery_limit: DEFAULT_DELIVERY_LIMIT,
        }
    }
}

/// Why the consumer could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ConsumerError {
    /// The key store could not be built or migrated.
    #[error("the PostgreSQL store failed")]
    Store(#[from] idempotency::postgres::PostgresStoreError),
    /// The tasks table could not be created.
    #[error("could not create the tasks table")]
    Tasks(#[source] idempotency::postgres::tokio_postgres::Error),
    /// A connection from the store's pool could not be had.
    #[error("could not get a database connection")]
    Pool(#[source] BoxError),
    /// The broker failed.
    #[error("RabbitMQ failed")]
    Broker(#[from] lapin::Error),
    /// The engine's settings cannot run on the store.
    #[error("the idempotency settings cannot run on this store")]
    Config(#[from] idempotency::ConfigError),
    /// The operations endpoints (`--ops-listen`) could not listen.
    #[error("could not serve the operations endpoints")]
    Operations(#[source] std::io::Error),
}

/// What became of one delivery.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Handled {
    /// This delivery ran the work; its result is stored; acked after the commit.
    Ran(TaskResult),
    /// An earlier delivery ran it: its stored result; acked, nothing written.
    Replayed(TaskResult),
    /// Not done, may succeed later (a running duplicate, the database down): requeued.
    Requeued(String),
    /// Can never be done (unreadable, its key used by another message, a title the database
    /// refuses, or a retryable failure past the delivery limit): dead-lettered.
    DeadLettered(String),
}

impl Handled {
    /// The word the consumer prints for it.
    pub fn label(&self) -> &'static str {
        match self {
            Handled::Ran(Ok(_)) => "ran",
            Handled::Ran(Err(_)) => "refused",
            Handled::Replayed(_) => "replayed",
            Handled::Requeued(_) => "requeued",
            Handled::DeadLettered(_) => "dead-lettered",
        }
    }
}

/// The work of one message, once: checks the task, inserts it in the store's transaction, and
/// returns its id, which commits with the stored result. A refusal is `Ok(Err(..))` (stored):
/// the task's own check, or the database refusing its data (a permanent SQLSTATE: its writes
/// are discarded and the refusal stored alone, and `refused_by_database` is set). Any other
/// database error is `Err`: the key is released and the message requeued.
async fn create_task(
    ctx: OnceContext,
    task: &CreateTask,
    message_id: &str,
    refused_by_database: &AtomicBool,
) -> Result<TaskResult, BoxError> {
    if let Err(refusal) = task.check() {
        return Ok(Err(refusal));
    }
    let tx = ctx.transaction::<PostgresTransaction>().await?;
    let inserted = tx
        .query_typed_one(
            INSERT_TASK,
            &[
                (&task.user, Type::TEXT),
                (&task.title, Type::TEXT),
                (&message_id, Type::TEXT),
            ],
        )
        .await;
    match inserted {
        Ok(row) => Ok(Ok(row.try_get(0)?)),
        Err(error)
            if error
                .code()
                .is_some_and(|c| is_permanent_sqlstate(c.code())) =>
        {
            // The same title fails every time: record the refusal (the failed statement
            // aborted the transaction, so its writes are rolled back and the refusal stored
            // alone), and let the broker's dead-letter queue show the message.
            drop(tx);
            ctx.discard_writes()?;
            refused_by_database.store(true, Ordering::Relaxed);
            Ok(Err(format!(
                "the database refused the task: {}",
                describe(&error)
            )))
        }
        Err(error) => Err(error.into()),
    }
}

/// A database error as its message and SQLSTATE (tokio-postgres's own `Display` says only
/// "db error"); other errors as their chain of causes.
fn describe(error: &(dyn std::error::Error + 'static)) -> String {
    let database = error
        .downcast_ref::<idempotency::postgres::tokio_postgres::Error>()
        .and_then(|e| e.as_db_error());
    match database {
        Some(db) => format!("{} (SQLSTATE {})", db.message(), db.code().code()),
        None => idempotency::ErrorChain(error).to_string(),
    }
}

/// Runs the work of `delivery` once per `message_id` and says what to tell the broker.
pub async fn handle(engine: &Engine<PostgresStore>, delivery: &Delivery) -> Handled {
    let message = match Message::read(delivery) {
        Ok(message) => message,
        Err(why) => return Handled::DeadLettered(why),
    };
    let message_id = message.key.as_str().to_owned();
    let task = &message.task;
    let refused_by_database = AtomicBool::new(false);
    let outcome = engine
        .once(message.scope, message.key, task, |ctx| {
            create_task(ctx, task, &message_id, &refused_by_database)
        })
        .await;
    match outcome {
        Ok(Outcome::Replayed(result)) => Handled::Replayed(result),
        // Recorded (its duplicates replay it), and dead-lettered for someone to look at.
        Ok(Outcome::Ran {
            value: Err(refusal),
            ..
        }) if refused_by_database.load(Ordering::Relaxed) => Handled::DeadLettered(refusal),
        Ok(outcome) => Handled::Ran(outcome.into_value()),
        Err(error) if error.is_retryable() => Handled::Requeued(chain(&error)),
        Err(error) => Handled::DeadLettered(chain(&error)),
    }
}

/// The error and its causes; the work's own error described with its SQLSTATE.
fn chain(error: &OnceError<BoxError>) -> String {
    match error {
        OnceError::Work(work) => format!("the work failed: {}", describe(&**work)),
        other => idempotency::ErrorChain(other).to_string(),
    }
}

/// How many times the broker delivered `delivery` before (the quorum queue's
/// `x-delivery-count`; 0 on a first delivery, which carries no such header).
fn earlier_deliveries(delivery: &Delivery) -> u32 {
    let count = delivery
        .properties
        .headers()
        .as_ref()
        .and_then(|headers| headers.inner().get("x-delivery-count").cloned());
    match count {
        Some(AMQPValue::LongLongInt(n)) => u32::try_from(n).unwrap_or(u32::MAX),
        Some(AMQPValue::LongInt(n)) => u32::try_from(n).unwrap_or(u32::MAX),
        Some(AMQPValue::LongUInt(n)) => n,
        Some(AMQPValue::ShortInt(n)) => u32::try_from(n).unwrap_or(0),
        Some(AMQPValue::ShortShortInt(n)) => u32::try_from(n).unwrap_or(0),
        _ => 0,
    }
}

/// A running consumer: its engine over the PostgreSQL store, and its channel.
#[derive(Debug)]
pub struct Consumer {
    engine: Engine<PostgresStore>,
    connection: Connection,
    channel: Channel,
    config: ConsumerConfig,
}

impl Consumer {
    /// Builds the store (migrating its key table), creates the tasks table, connects to the
    /// broker and declares the queues.
    pub async fn connect(config: ConsumerConfig) -> Result<Consumer, ConsumerError> {
        let store = PostgresStore::builder(config.database_url.as_str())
            .build()
            .await?;
        let migrated = store.migrate().await?;
        if matches!(migrated.purge_job, PurgeJob::PgCronUnavailable { .. }) {
            // No pg_cron: expired keys are deleted from here, hourly.
            let store = store.clone();
            tokio::spawn(async move {
                idempotency::purge_periodically(&store, PURGE_EVERY, 10_000).await;
            });
        }
        store
            .pool()
            .get()
            .await
            .map_err(|e| ConsumerError::Pool(e.into()))?
            .batch_execute(CREATE_TASKS_TABLE)
            .await
            .map_err(ConsumerError::Tasks)?;
        let engine = Engine::new(
            store,
            EngineConfig::default()
                .claim_mode(ClaimMode::OneTransaction)
                .in_flight_wait(config.in_flight_wait),
        )?;
        let connection =
            Connection::connect(&config.amqp_url, ConnectionProperties::default()).await?;
        let channel = connection.create_channel().await?;
        declare_queues(&channel, &config.queue).await?;
        let prefetch = u16::try_from(config.concurrency.saturating_mul(2)).unwrap_or(u16::MAX);
        channel
            .basic_qos(prefetch, BasicQosOptions::default())
            .await?;
        Ok(Consumer {
            engine,
            connection,
            channel,
            config,
        })
    }

    /// The store its engine runs on (for a readiness probe).
    pub fn store(&self) -> &PostgresStore {
        self.engine.store()
    }

    /// Consumes until SIGINT/SIGTERM or, with [`ConsumerConfig::exit_when_idle`], until the
    /// queue is idle; then waits for the running messages, closes the channel and returns. Each
    /// message prints one line on stdout: what became of it and its `message_id`.
    pub async fn run(self) -> Result<(), ConsumerError> {
        let mut deliveries = self
            .channel
            .basic_consume(
                self.config.queue.as_str().into(),
                "tasks-consumer".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        let concurrency = self.config.concurrency.max(1);
        let hold_ack = self.config.hold_ack;
        let delivery_limit = self.config.delivery_limit.max(1);
        let idle = self.config.exit_when_idle.unwrap_or(Duration::MAX);
        let mut running = JoinSet::new();
        let mut stop = std::pin::pin!(shutdown_signal());
        loop {
            // Finished messages leave the set at once, so it counts the running ones.
            while running.try_join_next().is_some() {}
            while running.len() >= concurrency {
                running.join_next().await;
            }
            let next = tokio::select! {
                () = &mut stop => break,
                next = tokio::time::timeout(idle, deliveries.next()) => next,
            };
            let delivery = match next {
                Ok(Some(Ok(delivery))) => delivery,
                Ok(Some(Err(error))) => return Err(error.into()),
                Ok(None) => break,
                Err(_idle) => {
                    while running.try_join_next().is_some() {}
                    if running.is_empty() {
                        break;
                    }
                    continue;
                }
            };
            let engine = self.engine.clone();
            running.spawn(async move { settle(&engine, delivery, hold_ack, delivery_limit).await });
        }
        while running.join_next().await.is_some() {}
        self.engine.drain().drained().await;
        self.channel.close(200, "done".into()).await?;
        self.connection.close(200, "done".into()).await?;
        Ok(())
    }
}

/// Handles one delivery and tells the broker: ack after the commit, requeue what may succeed
/// later (after a pause that doubles with each delivery, from 100 ms up to 5 s, so a failing
/// database is not hammered) until the message was delivered `delivery_limit` times,
/// dead-letter the rest.
async fn settle(
    engine: &Engine<PostgresStore>,
    delivery: Delivery,
    hold_ack: Duration,
    delivery_limit: u32,
) {
    let mut handled = handle(engine, &delivery).await;
    let earlier = earlier_deliveries(&delivery);
    if let Handled::Requeued(why) = &handled
        && earlier.saturating_add(1) >= delivery_limit
    {
        handled = Handled::DeadLettered(format!(
            "delivered {} times (the limit), still failing: {why}",
            earlier.saturating_add(1)
        ));
    }
    let id = delivery
        .properties
        .message_id()
        .as_ref()
        .map_or("-", |id| id.as_str());
    let detail = match &handled {
        Handled::Ran(result) | Handled::Replayed(result) => match result {
            Ok(task) => format!("task {task}"),
            Err(refusal) => refusal.clone(),
        },
        Handled::Requeued(why) | Handled::DeadLettered(why) => why.clone(),
    };
    say(&format!("{} {id} {detail}", handled.label()));
    let acked = match handled {
        Handled::Ran(_) | Handled::Replayed(_) => {
            if !hold_ack.is_zero() {
                tokio::time::sleep(hold_ack).await;
            }
            delivery.acker.ack(BasicAckOptions::default()).await
        }
        Handled::Requeued(_) => {
            let pause = Duration::from_millis(100).saturating_mul(1 << earlier.min(6));
            tokio::time::sleep(pause.min(Duration::from_secs(5))).await;
            let requeue = BasicNackOptions {
                requeue: true,
                multiple: false,
            };
            delivery.acker.nack(requeue).await
        }
        Handled::DeadLettered(_) => {
            let dead_letter = BasicRejectOptions { requeue: false };
            delivery.acker.reject(dead_letter).await
        }
    };
    if let Err(error) = acked {
        // The broker redelivers an unsettled message when the channel closes; its key replays.
        tracing::warn!(%error, message_id = id, "could not settle the message; the broker will redeliver it");
    }
}

/// One line on stdout, flushed (the tests read it as it happens).
fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}
