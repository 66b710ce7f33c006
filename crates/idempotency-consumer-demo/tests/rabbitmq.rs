//! The idempotent consumer on the real RabbitMQ and PostgreSQL: duplicates, a consumer killed
//! between its commit and its ack, two consumers racing, poison messages, and ten thousand
//! messages with a kill mid-stream. Each test counts the tasks that exist and checks that the
//! queue is empty at the end: every message done once, and nothing acked that was not done.

mod support;

use std::time::Duration;
use support::{Broker, ConsumerProcess, Database, task};

const IDLE: &str = "2";
const EXIT_WITHIN: Duration = Duration::from_secs(120);

/// The task id a line `ran|replayed <message_id> task <id>` reports.
fn task_id(line: &str) -> Option<i64> {
    line.rsplit_once("task ")?.1.parse().ok()
}

fn lines_for<'a>(lines: &'a [String], word: &str, id: &str) -> Vec<&'a String> {
    let prefix = format!("{word} {id} ");
    lines.iter().filter(|l| l.starts_with(&prefix)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_published_five_times_creates_one_task() {
    let (broker, db) = (Broker::new().await, Database::create().await);
    let body = task("ada", "Buy milk");
    let other = task("ada", "Walk the dog");
    let mut messages = vec![(Some("m-1"), body.as_slice()); 5];
    messages.push((Some("m-2"), other.as_slice()));
    broker.publish_many(messages).await;

    let consumer = ConsumerProcess::start(&broker, &db, &["--exit-when-idle", IDLE]);
    let (status, lines) = consumer.exit(EXIT_WITHIN).await;
    assert!(status.success(), "{status}: {lines:?}");

    let ran = lines_for(&lines, "ran", "m-1");
    let replayed = lines_for(&lines, "replayed", "m-1");
    assert_eq!((ran.len(), replayed.len()), (1, 4), "{lines:?}");
    let id = task_id(ran[0]);
    assert!(
        replayed.iter().all(|l| task_id(l) == id),
        "replays carry the first task's id: {lines:?}"
    );
    assert_eq!(db.tasks().await, (2, 2), "one task per message id");
    assert_eq!(db.tasks_of("m-1").await, vec![id.expect("an id")]);
    assert_eq!(
        broker.ready(&broker.queue).await,
        0,
        "every delivery was acked"
    );
    assert_eq!(
        broker.ready(&broker.dead()).await,
        0,
        "nothing dead-lettered"
    );
    broker.delete().await;
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_killed_between_commit_and_ack_costs_one_replay_and_no_second_task() {
    let (broker, db) = (Broker::new().await, Database::create().await);
    // The first consumer holds every ack for a minute after its commit: it is killed there.
    let first = ConsumerProcess::start(&broker, &db, &["--hold-ack-ms", "60000"]);
    broker
        .publish(Some("m-kill"), &task("ada", "Pay rent"))
        .await;
    first
        .wait_for(
            Duration::from_secs(60),
            "the first delivery to commit",
            |lines| !lines_for(lines, "ran", "m-kill").is_empty(),
        )
        .await;
    let lines = first.kill().await;
    let ran = lines_for(&lines, "ran", "m-kill");
    let id = task_id(ran[0]).expect("a task id");
    assert_eq!(db.tasks_of("m-kill").await, vec![id], "the commit happened");
    // Unacked, the message goes back to the queue when the killed consumer's connection drops.
    broker
        .wait_ready(&broker.queue, 1, Duration::from_secs(30))
        .await;

    let second = ConsumerProcess::start(&broker, &db, &["--exit-when-idle", IDLE]);
    let (status, lines) = second.exit(EXIT_WITHIN).await;
    assert!(status.success(), "{status}: {lines:?}");
    let replayed = lines_for(&lines, "replayed", "m-kill");
    assert_eq!(replayed.len(), 1, "the redelivery replays: {lines:?}");
    assert_eq!(task_id(replayed[0]), Some(id), "with the first task's id");
    assert_eq!(
        db.tasks_of("m-kill").await,
        vec![id],
        "and creates no second task"
    );
    assert_eq!(broker.ready(&broker.queue).await, 0);
    broker.delete().await;
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_consumers_racing_on_duplicates_create_each_task_once() {
    let (broker, db) = (Broker::new().await, Database::create().await);
    let ids: Vec<String> = (0..200).map(|n| format!("race-{n}")).collect();
    let bodies: Vec<Vec<u8>> = (0..200)
        .map(|n| task("ada", &format!("task {n}")))
        .collect();
    // Three copies of each message, adjacent, so both consumers get copies of the same one.
    let messages = (0..200)
        .flat_map(|n| std::iter::repeat_n((Some(ids[n].as_str()), bodies[n].as_slice()), 3));
    broker.publish_many(messages).await;

    let args = ["--exit-when-idle", IDLE, "--concurrency", "8"];
    let one = ConsumerProcess::start(&broker, &db, &args);
    let two = ConsumerProcess::start(&broker, &db, &args);
    let (status_one, lines_one) = one.exit(EXIT_WITHIN).await;
    let (status_two, lines_two) = two.exit(EXIT_WITHIN).await;
    assert!(status_one.success() && status_two.success());
    let ran = lines_one
        .iter()
        .chain(&lines_two)
        .filter(|l| l.starts_with("ran "))
        .count();
    assert_eq!(ran, 200, "each message ran once across both consumers");
    assert!(
        !lines_one.is_empty() && !lines_two.is_empty(),
        "both consumers took messages: {} and {}",
        lines_one.len(),
        lines_two.len()
    );
    assert_eq!(db.tasks().await, (200, 200));
    assert_eq!(broker.ready(&broker.queue).await, 0);
    broker.delete().await;
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_messages_are_dead_lettered_and_a_refusal_is_replayed() {
    let (broker, db) = (Broker::new().await, Database::create().await);
    let good = task("ada", "Buy milk");
    let refused = task("ada", "");
    broker
        .publish_many([
            (None, good.as_slice()),                  // no message_id: no key
            (Some("p-json"), b"not json".as_slice()), // not a task
            (Some("p-refused"), refused.as_slice()),  // an empty title: refused, stored
            (Some("p-good"), good.as_slice()),
            (Some("p-refused"), refused.as_slice()), // its duplicate gets the same refusal
        ])
        .await;
    let consumer = ConsumerProcess::start(
        &broker,
        &db,
        &["--exit-when-idle", IDLE, "--concurrency", "1"],
    );
    let (status, lines) = consumer.exit(EXIT_WITHIN).await;
    assert!(status.success(), "{status}: {lines:?}");

    assert_eq!(
        broker.ready(&broker.dead()).await,
        2,
        "the two unreadable messages: {lines:?}"
    );
    assert_eq!(
        lines_for(&lines, "dead-lettered", "-").len(),
        1,
        "{lines:?}"
    );
    assert_eq!(
        lines_for(&lines, "dead-lettered", "p-json").len(),
        1,
        "{lines:?}"
    );
    assert_eq!(
        lines_for(&lines, "refused", "p-refused").len(),
        1,
        "{lines:?}"
    );
    let replayed = lines_for(&lines, "replayed", "p-refused");
    assert_eq!(replayed.len(), 1, "{lines:?}");
    assert!(
        replayed[0].contains("a title has 1 to 200 characters"),
        "{lines:?}"
    );
    assert_eq!(
        db.tasks().await,
        (1, 1),
        "only the good message made a task"
    );
    assert_eq!(broker.ready(&broker.queue).await, 0, "the rest were acked");
    broker.delete().await;
    db.drop().await;
}

/// Ten thousand messages, 2,000 of them duplicates of the other 8,000, shuffled; the first
/// consumer is killed with SIGKILL mid-stream, and two more finish the queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_messages_with_duplicates_and_a_kill_mid_stream_create_each_task_once() {
    const UNIQUE: usize = 8_000;
    const DUPLICATES: usize = 2_000;
    let (broker, db) = (Broker::new().await, Database::create().await);
    let ids: Vec<String> = (0..UNIQUE).map(|n| format!("bulk-{n}")).collect();
    let bodies: Vec<Vec<u8>> = (0..UNIQUE)
        .map(|n| task(&format!("user-{}", n % 50), &format!("task {n}")))
        .collect();
    // Every message once, plus 2,000 copies, in an order a fixed LCG shuffles.
    let mut order: Vec<usize> = (0..UNIQUE).chain((0..DUPLICATES).map(|n| n * 4)).collect();
    let mut state: u64 = 0x2545_f491_4f6c_dd1d;
    for i in (1..order.len()).rev() {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1);
        let j = usize::try_from(state >> 33).expect("fits") % (i + 1);
        order.swap(i, j);
    }
    broker
        .publish_many(
            order
                .iter()
                .map(|&n| (Some(ids[n].as_str()), bodies[n].as_slice())),
        )
        .await;

    let started = std::time::Instant::now();
    let first = ConsumerProcess::start(&broker, &db, &["--concurrency", "16"]);
    first
        .wait_for(
            Duration::from_secs(120),
            "3,000 messages to be processed",
            |lines| lines.len() >= 3_000,
        )
        .await;
    let killed_after = first.kill().await.len();

    let args = ["--exit-when-idle", "3", "--concurrency", "16"];
    let second = ConsumerProcess::start(&broker, &db, &args);
    let third = ConsumerProcess::start(&broker, &db, &args);
    let (status_two, lines_two) = second.exit(Duration::from_secs(300)).await;
    let (status_three, lines_three) = third.exit(Duration::from_secs(300)).await;
    assert!(status_two.success() && status_three.success());
    // Includes the 3 s the last consumers wait, idle, before they exit.
    eprintln!(
        "10,000 messages: {:.1} s from the first consumer's start to the last one's exit",
        started.elapsed().as_secs_f64()
    );
    assert_eq!(
        db.tasks().await,
        (UNIQUE as i64, UNIQUE as i64),
        "each of the {UNIQUE} messages has exactly one task (first consumer killed after \
         {killed_after} lines; then {} and {} lines)",
        lines_two.len(),
        lines_three.len()
    );
    assert_eq!(
        broker.ready(&broker.queue).await,
        0,
        "every message was acked"
    );
    assert_eq!(broker.ready(&broker.dead()).await, 0, "none dead-lettered");
    broker.delete().await;
    db.drop().await;
}

/// A title PostgreSQL refuses (a NUL byte: `22021`) passes the consumer's own check. The
/// refusal is permanent: the message is dead-lettered with the cause, its refusal stored, and
/// its duplicate answered from that record without running; nothing is requeued. Before, the
/// work's error was retryable and the message was requeued for ever (186 times in 20 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_the_database_refuses_is_dead_lettered_not_requeued() {
    let (broker, db) = (Broker::new().await, Database::create().await);
    let poison = task("ada", "Buy \u{0}milk");
    let good = task("ada", "Buy milk");
    broker
        .publish_many([
            (Some("p-nul"), poison.as_slice()),
            (Some("p-good"), good.as_slice()),
            (Some("p-nul"), poison.as_slice()), // its duplicate
        ])
        .await;
    let consumer = ConsumerProcess::start(
        &broker,
        &db,
        &["--exit-when-idle", IDLE, "--concurrency", "1"],
    );
    let (status, lines) = consumer.exit(EXIT_WITHIN).await;
    assert!(status.success(), "{status}: {lines:?}");
    assert_eq!(lines_for(&lines, "requeued", "p-nul").len(), 0, "{lines:?}");
    let dead = lines_for(&lines, "dead-lettered", "p-nul");
    assert_eq!(dead.len(), 1, "{lines:?}");
    assert!(dead[0].contains("22021"), "the cause is logged: {lines:?}");
    let replayed = lines_for(&lines, "replayed", "p-nul");
    assert_eq!(
        replayed.len(),
        1,
        "the duplicate replays the refusal: {lines:?}"
    );
    assert!(replayed[0].contains("22021"), "{lines:?}");
    assert_eq!(broker.ready(&broker.dead()).await, 1, "{lines:?}");
    assert_eq!(
        db.tasks().await,
        (1, 1),
        "only the good message made a task"
    );
    assert_eq!(broker.ready(&broker.queue).await, 0);
    broker.delete().await;
    db.drop().await;
}

/// A message whose work fails with a retryable error every time (here a trigger answers a
/// serialization failure, `40001`, for its title) is requeued only up to the delivery limit,
/// then dead-lettered by the broker; every other message is done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_that_always_fails_is_dead_lettered_at_the_delivery_limit() {
    let (broker, db) = (Broker::new().await, Database::create().await);
    db.execute(idempotency_consumer_demo::CREATE_TASKS_TABLE)
        .await;
    db.execute(
        "CREATE FUNCTION refuse_cursed() RETURNS trigger LANGUAGE plpgsql AS $$ \
         BEGIN IF NEW.title = 'cursed' THEN \
           RAISE EXCEPTION 'try again' USING ERRCODE = '40001'; END IF; RETURN NEW; END $$; \
         CREATE TRIGGER refuse_cursed BEFORE INSERT ON consumer_tasks \
           FOR EACH ROW EXECUTE FUNCTION refuse_cursed();",
    )
    .await;
    let cursed = task("ada", "cursed");
    let good = task("ada", "Buy milk");
    broker
        .publish_many([
            (Some("p-cursed"), cursed.as_slice()),
            (Some("p-good"), good.as_slice()),
        ])
        .await;
    let consumer = ConsumerProcess::start(
        &broker,
        &db,
        &[
            "--exit-when-idle",
            IDLE,
            "--concurrency",
            "1",
            "--delivery-limit",
            "3",
        ],
    );
    let (status, lines) = consumer.exit(EXIT_WITHIN).await;
    assert!(status.success(), "{status}: {lines:?}");
    let requeued = lines_for(&lines, "requeued", "p-cursed");
    assert!(
        (1..=4).contains(&requeued.len()),
        "requeued up to the limit: {lines:?}"
    );
    assert!(
        requeued[0].contains("40001"),
        "the cause is logged: {lines:?}"
    );
    assert_eq!(broker.ready(&broker.dead()).await, 1, "{lines:?}");
    assert_eq!(db.tasks().await, (1, 1));
    assert_eq!(broker.ready(&broker.queue).await, 0);
    broker.delete().await;
    db.drop().await;
}

/// `GET http://{addr}{path}`: its status and body.
async fn get(addr: &str, path: &str) -> (u16, String) {
    use http_body_util::BodyExt;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Full<bytes::Bytes>>();
    let uri: hyper::Uri = format!("http://{addr}{path}").parse().expect("uri");
    let response = tokio::time::timeout(Duration::from_secs(5), client.get(uri))
        .await
        .expect("answered within 5 s")
        .expect("GET");
    let status = response.status().as_u16();
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operations_endpoints_show_what_the_consumer_did() {
    let (broker, db) = (Broker::new().await, Database::create().await);
    let body = task("ada", "Scraped");
    broker
        .publish_many(vec![(Some("m-1"), body.as_slice()); 2])
        .await;
    let consumer = ConsumerProcess::start(&broker, &db, &["--ops-listen", "127.0.0.1:0"]);
    consumer
        .wait_for(Duration::from_secs(60), "both deliveries", |lines| {
            lines.iter().any(|l| l.starts_with("ran m-1 "))
                && lines.iter().any(|l| l.starts_with("replayed m-1 "))
        })
        .await;
    let lines = consumer.lines();
    let addr = lines
        .iter()
        .find_map(|l| l.strip_prefix("operations on http://"))
        .unwrap_or_else(|| panic!("no operations line: {lines:?}"))
        .to_owned();
    let (status, metrics) = get(&addr, "/metrics").await;
    assert_eq!(status, 200);
    assert!(
        metrics
            .lines()
            .any(|l| l == r#"idempotency_completions_total{result="stored"} 1"#),
        "{metrics}"
    );
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("idempotency_store_duration_seconds_bucket{")),
        "{metrics}"
    );
    assert_eq!(get(&addr, "/health/live").await, (200, "live\n".to_owned()));
    assert_eq!(
        get(&addr, "/health/ready").await,
        (200, "ready\n".to_owned())
    );
    consumer.kill().await;
    broker.delete().await;
    db.drop().await;
}
