//! What the broker tests share: a publisher on the real RabbitMQ, a fresh database, and the
//! consumer binary as a child process whose lines are read as it prints them.

#![allow(dead_code, unreachable_pub)]

use idempotency::postgres::tokio_postgres::{self, Client, NoTls};
use idempotency_consumer_demo::declare_queues;
use idempotency_testkit::env::{amqp_url, postgres_url, server_unreachable};
use lapin::options::{
    BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::AsyncBufReadExt;
use tokio::process::{Child, Command};
use tokio::time::Instant;

/// A test's own queue (and dead-letter queue) on the shared broker, with a confirming publisher.
pub struct Broker {
    pub queue: String,
    connection: Connection,
    channel: Channel,
}

impl Broker {
    /// Declares `tasks-<random>` and its `.dead` queue.
    pub async fn new() -> Broker {
        let url = amqp_url();
        let connection = Connection::connect(&url, ConnectionProperties::default())
            .await
            .unwrap_or_else(|e| server_unreachable("RabbitMQ", &url, &e));
        let channel = connection.create_channel().await.expect("a channel");
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .expect("publisher confirms");
        let queue = format!("tasks-{}", uuid::Uuid::new_v4().simple());
        declare_queues(&channel, &queue).await.expect("declare");
        Broker {
            queue,
            connection,
            channel,
        }
    }

    /// Publishes `body` with `message_id` (none when `None`) and waits for the broker's confirm.
    pub async fn publish(&self, message_id: Option<&str>, body: &[u8]) {
        self.publish_many(std::iter::once((message_id, body))).await;
    }

    /// Publishes every `(message_id, body)` in order, then waits for all the confirms.
    pub async fn publish_many<'a>(
        &self,
        messages: impl IntoIterator<Item = (Option<&'a str>, &'a [u8])>,
    ) {
        for (message_id, body) in messages {
            let mut properties = BasicProperties::default().with_delivery_mode(2);
            if let Some(id) = message_id {
                properties = properties.with_message_id(id.into());
            }
            self.channel
                .basic_publish(
                    "".into(),
                    self.queue.as_str().into(),
                    BasicPublishOptions::default(),
                    body,
                    properties,
                )
                .await
                .expect("publish");
        }
        assert!(
            self.channel
                .wait_for_confirms()
                .await
                .expect("confirms")
                .is_empty(),
            "the broker returned a message"
        );
    }

    /// Messages ready in `queue` (delivered and unacked ones are not counted).
    pub async fn ready(&self, queue: &str) -> u32 {
        let passive = QueueDeclareOptions {
            passive: true,
            ..QueueDeclareOptions::default()
        };
        self.channel
            .queue_declare(queue.into(), passive, FieldTable::default())
            .await
            .expect("passive declare")
            .message_count()
    }

    /// The dead-letter queue's name.
    pub fn dead(&self) -> String {
        format!("{}.dead", self.queue)
    }

    /// Waits up to `within` for `queue` to hold `count` ready messages.
    pub async fn wait_ready(&self, queue: &str, count: u32, within: Duration) {
        let until = Instant::now() + within;
        loop {
            let ready = self.ready(queue).await;
            if ready == count {
                return;
            }
            assert!(
                Instant::now() < until,
                "{queue} holds {ready} ready messages, expected {count}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Deletes the queues.
    pub async fn delete(self) {
        for queue in [self.dead(), self.queue.clone()] {
            let _ = self
                .channel
                .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
                .await;
        }
        let _ = self.connection.close(200, "done".into()).await;
    }
}

/// The body of a "create task" message.
pub fn task(user: &str, title: &str) -> Vec<u8> {
    serde_json::json!({ "user": user, "title": title })
        .to_string()
        .into_bytes()
}

/// A fresh database for one test's tasks and key table.
pub struct Database {
    name: String,
    pub url: String,
    client: Client,
}

async fn connect(url: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .unwrap_or_else(|e| server_unreachable("PostgreSQL", url, &e));
    tokio::spawn(connection);
    client
}

impl Database {
    pub async fn create() -> Database {
        let admin = postgres_url();
        let name = format!("consumer_{}", uuid::Uuid::new_v4().simple());
        connect(&admin)
            .await
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .expect("create database");
        let url = match admin.rsplit_once('/') {
            Some((server, _)) => format!("{server}/{name}"),
            None => panic!("IDEMPOTENCY_TEST_POSTGRES_URL must name a database: {admin}"),
        };
        let client = connect(&url).await;
        Database { name, url, client }
    }

    /// Runs `sql` (several statements, no parameters) in the test's database.
    pub async fn execute(&self, sql: &str) {
        self.client.batch_execute(sql).await.expect("run SQL");
    }

    /// Tasks created, and distinct message ids among them.
    pub async fn tasks(&self) -> (i64, i64) {
        let row = self
            .client
            .query_one(
                "SELECT count(*), count(DISTINCT message_id) FROM consumer_tasks",
                &[],
            )
            .await
            .expect("count tasks");
        (row.get(0), row.get(1))
    }

    /// Task ids created for `message_id`.
    pub async fn tasks_of(&self, message_id: &str) -> Vec<i64> {
        self.client
            .query(
                "SELECT id FROM consumer_tasks WHERE message_id = $1 ORDER BY id",
                &[&message_id],
            )
            .await
            .expect("tasks of a message")
            .iter()
            .map(|row| row.get(0))
            .collect()
    }

    pub async fn drop(self) {
        drop(self.client);
        let _ = connect(&postgres_url())
            .await
            .batch_execute(&format!("DROP DATABASE {} WITH (FORCE)", self.name))
            .await;
    }
}

/// The `tasks-consumer` binary, running; its stdout lines are collected as they come.
pub struct ConsumerProcess {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
    reader: tokio::task::JoinHandle<()>,
}

impl ConsumerProcess {
    /// Starts it on `broker`'s queue and `database` with `extra` arguments.
    pub fn start(broker: &Broker, database: &Database, extra: &[&str]) -> ConsumerProcess {
        let mut child = Command::new(env!("CARGO_BIN_EXE_tasks-consumer"))
            .args(["--queue", &broker.queue])
            .args(extra)
            .env("AMQP_URL", amqp_url())
            .env("DATABASE_URL", &database.url)
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start tasks-consumer");
        let stdout = child.stdout.take().expect("piped stdout");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&lines);
        let reader = tokio::spawn(async move {
            let mut reader = tokio::io::BufReader::new(stdout).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                sink.lock().expect("lines").push(line);
            }
        });
        ConsumerProcess {
            child,
            lines,
            reader,
        }
    }

    /// The lines printed so far.
    pub fn lines(&self) -> Vec<String> {
        self.lines.lock().expect("lines").clone()
    }

    /// Lines printed so far that start with `word`.
    pub fn count(&self, word: &str) -> usize {
        let prefix = format!("{word} ");
        self.lines
            .lock()
            .expect("lines")
            .iter()
            .filter(|l| l.starts_with(&prefix))
            .count()
    }

    /// Waits up to `within` until `done` holds for the lines printed.
    pub async fn wait_for(&self, within: Duration, what: &str, done: impl Fn(&[String]) -> bool) {
        let until = Instant::now() + within;
        loop {
            if done(&self.lines.lock().expect("lines")) {
                return;
            }
            assert!(
                Instant::now() < until,
                "waited {within:?} for {what}; the consumer printed: {:?}",
                self.lines()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// SIGKILL: no ack, no cleanup; the broker requeues what it had delivered.
    pub async fn kill(mut self) -> Vec<String> {
        self.child.kill().await.expect("SIGKILL");
        self.lines()
    }

    /// Waits up to `within` for it to exit on its own (`--exit-when-idle`).
    pub async fn exit(mut self, within: Duration) -> (ExitStatus, Vec<String>) {
        let status = tokio::time::timeout(within, self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("the consumer did not exit within {within:?}"))
            .expect("wait");
        // The reader ends at the end of its stdout: it has every line.
        let _ = tokio::time::timeout(Duration::from_secs(5), &mut self.reader).await;
        (status, self.lines())
    }
}
