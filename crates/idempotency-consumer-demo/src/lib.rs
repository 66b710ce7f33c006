//! The idempotent consumer: a RabbitMQ consumer that creates each task once on PostgreSQL.
//!
//! RabbitMQ delivers a message at least once: a consumer that dies after its work and before
//! its ack gets the message again, a publisher that retries publishes it twice. This consumer
//! runs each message's work through [`Engine::once`](idempotency::Engine::once) with the message's `message_id` as the
//! key, in the PostgreSQL store's one-transaction mode, and acks only after the commit:
//!
//! - the task and the message's stored result commit in one transaction, so a crash at any
//!   instant leaves both or neither;
//! - a redelivered or duplicated message replays the stored result (the same task id) and is
//!   acked, and writes nothing;
//! - a duplicate delivered while the first is running waits for it (bounded), then replays;
//! - a message that cannot be read (no `message_id`, not a task) is dead-lettered, never acked
//!   as done; a task that is refused (an empty title) is a stored result like any other;
//! - a task the database refuses for its data (a NUL byte in the title: a permanent SQLSTATE,
//!   [`is_permanent_sqlstate`](idempotency::postgres::is_permanent_sqlstate)) has its refusal
//!   stored without its writes ([`OnceContext::discard_writes`](idempotency::OnceContext::discard_writes))
//!   and is dead-lettered with the cause; its duplicates replay the refusal;
//! - a failure that may pass (the database down) requeues the message, pausing 100 ms doubling
//!   up to 5 s, until it was delivered `--delivery-limit` times (the quorum queue counts them);
//!   then it is dead-lettered with the cause.
//!
//! The heart of it ([`handle`]), what a user of the library writes:
//!
//! ```ignore
//! let outcome = engine
//!     .once(message.scope, message.key, &message.task, |ctx| async move {
//!         if let Err(refusal) = task.check() {
//!             return Ok(Err(refusal)); // permanent: stored and replayed, never retried
//!         }
//!         let tx = ctx.transaction::<PostgresTransaction>().await?;
//!         let row = tx.query_one(INSERT_TASK, &[&task.user, &task.title, &message_id]).await?;
//!         Ok(Ok(row.get::<_, i64>(0))) // commits with the stored result after we return
//!     })
//!     .await;
//! match outcome {
//!     Ok(_) => delivery.acker.ack(BasicAckOptions::default()).await?, // after the commit
//!     Err(e) if e.is_retryable() => delivery.acker.nack(requeue).await?,
//!     Err(_) => delivery.acker.reject(dead_letter).await?,
//! }
//! ```
//!
//! `cargo run -p idempotency-consumer-demo --bin tasks-consumer -- --help` runs it; the tests
//! in `tests/rabbitmq.rs` publish duplicates, kill consumers with SIGKILL between commit and
//! ack, and race two consumers on one queue.

mod consumer;
mod message;
mod queues;

pub use consumer::{
    Consumer, ConsumerConfig, ConsumerError, DEFAULT_DELIVERY_LIMIT, Handled, handle,
};
pub use message::{CreateTask, Message, TaskResult};
pub use queues::declare_queues;

/// The tasks table the consumer writes (created if missing). Under a transaction-scoped advisory
/// lock: consumers starting together on a new database would otherwise race in
/// `CREATE TABLE IF NOT EXISTS`, and all but one fail with "relation already exists".
pub const CREATE_TASKS_TABLE: &str = "BEGIN; \
     SELECT pg_advisory_xact_lock(hashtext('idempotency-consumer-demo.consumer_tasks')); \
     CREATE TABLE IF NOT EXISTS consumer_tasks (id bigserial PRIMARY KEY, owner text NOT NULL, \
     title text NOT NULL, message_id text NOT NULL); \
     COMMIT;";

/// The one write of a "create task" message.
pub const INSERT_TASK: &str =
    "INSERT INTO consumer_tasks (owner, title, message_id) VALUES ($1, $2, $3) RETURNING id";
