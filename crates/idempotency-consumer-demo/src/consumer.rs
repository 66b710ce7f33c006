//! The consumer: the queue, the work of one message, and the ack that follows its commit.

use crate::message::{CreateTask, Message, TaskResult};
use crate::{CREATE_TASKS_TABLE, INSERT_TASK};
use futures_util::StreamExt;
use idempotency::postgres::PurgeJob;
use idempotency::postgres::tokio_postgres::types::Type;
use idempotency::{
    BoxError, ClaimMode, Engine, EngineConfig, OnceContext, OnceError, Outcome, PgTransaction,
    PostgresStore,
};
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions, BasicRejectOptions,
    QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Connection, ConnectionProperties};
use std::io::Write as _;
use std::time::Duration;
use tokio::task::JoinSet;

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
    /// Can never be done (unreadable, or its key used by another message): dead-lettered.
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
/// returns its id, which commits with the stored result. A refusal is `Ok(Err(..))` (stored);
/// a database error is `Err` (the key is released and the message requeued).
async fn create_task(
    ctx: OnceContext,
    task: &CreateTask,
    message_id: &str,
) -> Result<TaskResult, BoxError> {
    if let Err(refusal) = task.check() {
        return Ok(Err(refusal));
    }
    let tx = ctx.transaction::<PgTransaction>().await?;
    let row = tx
        .query_typed_one(
            INSERT_TASK,
            &[
                (&task.user, Type::TEXT),
                (&task.title, Type::TEXT),
                (&message_id, Type::TEXT),
            ],
        )
        .await?;
    Ok(Ok(row.try_get(0)?))
}

/// Runs the work of `delivery` once per `message_id` and says what to tell the broker.
pub async fn handle(engine: &Engine<PostgresStore>, delivery: &Delivery) -> Handled {
    let message = match Message::read(delivery) {
        Ok(message) => message,
        Err(why) => return Handled::DeadLettered(why),
    };
    let message_id = message.key.as_str().to_owned();
    let task = &message.task;
    let outcome = engine
        .once(message.scope, message.key, task, |ctx| {
            create_task(ctx, task, &message_id)
        })
        .await;
    match outcome {
        Ok(Outcome::Replayed(result)) => Handled::Replayed(result),
        Ok(outcome) => Handled::Ran(outcome.into_value()),
        Err(error) if error.is_retryable() => Handled::Requeued(chain(&error)),
        Err(error) => Handled::DeadLettered(chain(&error)),
    }
}

fn chain(error: &OnceError<BoxError>) -> String {
    idempotency::ErrorChain(error).to_string()
}

/// Declares `queue` (durable) with its dead-letter queue `<queue>.dead`. The publisher and the
/// consumer both declare it, with the same arguments.
pub async fn declare_queues(channel: &Channel, queue: &str) -> Result<(), lapin::Error> {
    let dead = format!("{queue}.dead");
    let durable = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    channel
        .queue_declare(dead.as_str().into(), durable, FieldTable::default())
        .await?;
    let mut arguments = FieldTable::default();
    arguments.insert(
        "x-dead-letter-exchange".into(),
        AMQPValue::LongString("".into()),
    );
    arguments.insert(
        "x-dead-letter-routing-key".into(),
        AMQPValue::LongString(dead.as_str().into()),
    );
    channel
        .queue_declare(queue.into(), durable, arguments)
        .await?;
    Ok(())
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
                .with_claim_mode(ClaimMode::OneTransaction)
                .with_in_flight_wait(config.in_flight_wait),
        );
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
            running.spawn(async move { settle(&engine, delivery, hold_ack).await });
        }
        while running.join_next().await.is_some() {}
        self.engine.drain().drained().await;
        self.channel.close(200, "done".into()).await?;
        self.connection.close(200, "done".into()).await?;
        Ok(())
    }
}

/// Handles one delivery and tells the broker: ack after the commit, requeue what may succeed
/// later (after a short pause, so a failing database is not hammered), dead-letter the rest.
async fn settle(engine: &Engine<PostgresStore>, delivery: Delivery, hold_ack: Duration) {
    let handled = handle(engine, &delivery).await;
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
            tokio::time::sleep(Duration::from_millis(100)).await;
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
