//! A frozen instance (SIGSTOP: a paused VM, a long stop-the-world; the same to the database as a
//! host cut off the network) must not hold its keys past the lease in any claim mode. Two demo
//! processes on one throwaway server; one is frozen mid-traffic, and every key it was sent is
//! retried on the other until it answers 201. In the one-transaction modes a key is held by the
//! request's open transaction, which PostgreSQL ends only when the session does: never, for a
//! frozen process, without a bound. After the frozen process thaws, no key has two tasks.
//!
//! The second case freezes an instance while its request's transaction holds a row lock (an
//! `UPDATE` of one task, not yet committed): the retry, run on the other instance once the key is
//! free, updates the same row and must not wait on the frozen transaction for ever.
#![allow(clippy::unwrap_used)]

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::StatusCode;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use idempotency_e2e::DemoProcess;
use idempotency_testkit::TempPostgres;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const LEASE: Duration = Duration::from_secs(4);
const CLIENTS: usize = 8;

type HttpClient = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

/// `POST /tasks` titled with the key; `None` when no answer came within `within`.
async fn create(
    client: &HttpClient,
    addr: SocketAddr,
    user: &str,
    key: &str,
    within: Duration,
) -> Option<(StatusCode, Bytes)> {
    send(client, "POST", addr, "/tasks", user, key, within).await
}

/// `method path` with the body `{"title": key}`; `None` when no answer came within `within`.
async fn send(
    client: &HttpClient,
    method: &str,
    addr: SocketAddr,
    path: &str,
    user: &str,
    key: &str,
    within: Duration,
) -> Option<(StatusCode, Bytes)> {
    let request = hyper::Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"))
        .header("authorization", format!("Bearer {user}"))
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(format!(r#"{{"title":"{key}"}}"#))))
        .unwrap();
    tokio::time::timeout(within, async {
        let response = client.request(request).await.ok()?;
        let (parts, body) = response.into_parts();
        Some((parts.status, body.collect().await.ok()?.to_bytes()))
    })
    .await
    .ok()
    .flatten()
}

/// A throwaway server and two demo processes on it, in `claim_mode` with the lease [`LEASE`]:
/// the one about to freeze, and the other, where retries go.
struct Instances {
    _pg: TempPostgres,
    url: String,
    frozen: DemoProcess,
    other: DemoProcess,
    client: HttpClient,
}

impl Instances {
    async fn start(claim_mode: &str) -> Instances {
        let pg = TempPostgres::start(&[]).unwrap();
        let url = pg.url("postgres");
        let binary = env!("CARGO_BIN_EXE_demo-server");
        let lease = LEASE.as_secs().to_string();
        let args = [
            "--store",
            url.as_str(),
            "--claim-mode",
            claim_mode,
            "--lease",
            lease.as_str(),
        ];
        let frozen = DemoProcess::start(binary, &args, &[]).await;
        let other = DemoProcess::start(binary, &args, &[]).await;
        let client = Client::builder(TokioExecutor::new()).build_http();
        Instances {
            _pg: pg,
            url,
            frozen,
            other,
            client,
        }
    }
}

/// A connection to the database at `url`, to read what the instances left.
async fn connect(url: &str) -> idempotency::postgres::tokio_postgres::Client {
    let (db, connection) = idempotency::postgres::tokio_postgres::connect(
        url,
        idempotency::postgres::tokio_postgres::NoTls,
    )
    .await
    .unwrap();
    tokio::spawn(connection);
    db
}

async fn a_frozen_instance_holds_no_key_past_the_lease(claim_mode: &str) {
    let Instances {
        _pg,
        url,
        frozen,
        other,
        client,
    } = Instances::start(claim_mode).await;

    // Traffic to the instance about to freeze: each client sends fresh keys, once each.
    let sent: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        let (client, sent, stop) = (client.clone(), sent.clone(), stop.clone());
        let addr = frozen.addr();
        clients.push(tokio::spawn(async move {
            let user = uuid::Uuid::new_v4().to_string();
            while !stop.load(Ordering::SeqCst) {
                let key = uuid::Uuid::new_v4().to_string();
                sent.lock().unwrap().push((user.clone(), key.clone()));
                create(&client, addr, &user, &key, Duration::from_secs(1)).await;
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    frozen.signal("STOP");
    let frozen_at = tokio::time::Instant::now();
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, Ordering::SeqCst);
    for client in clients {
        client.await.unwrap();
    }

    // Every key, retried on the other instance, gets its 201 within the lease and a few
    // seconds, while the first instance stays frozen.
    let deadline = frozen_at + LEASE + Duration::from_secs(6);
    let keys = sent.lock().unwrap().clone();
    assert!(keys.len() > CLIENTS, "the load must have been real");
    let mut stuck = Vec::new();
    for (user, key) in &keys {
        loop {
            let answer = create(&client, other.addr(), user, key, Duration::from_secs(5)).await;
            match answer {
                Some((StatusCode::CREATED, _)) => break,
                Some((StatusCode::CONFLICT | StatusCode::SERVICE_UNAVAILABLE, _)) | None => {}
                Some((status, body)) => {
                    panic!("unexpected {status}: {}", String::from_utf8_lossy(&body))
                }
            }
            if tokio::time::Instant::now() >= deadline {
                stuck.push(key.clone());
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let waited = frozen_at.elapsed();
    assert!(
        stuck.is_empty(),
        "{claim_mode}: {} of {} keys still refused {waited:?} after the freeze (lease {LEASE:?})",
        stuck.len(),
        keys.len()
    );

    // Thawed, the instance finishes what it was doing: it must commit nothing for those keys
    // (their tasks exist once, made on the other instance), and it answers new requests again.
    frozen.signal("CONT");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let user = uuid::Uuid::new_v4().to_string();
    let key = uuid::Uuid::new_v4().to_string();
    let mut answered = None;
    for _ in 0..50 {
        match create(&client, frozen.addr(), &user, &key, Duration::from_secs(5)).await {
            Some((StatusCode::CREATED, _)) => {
                answered = Some(StatusCode::CREATED);
                break;
            }
            Some((status, _)) => answered = Some(status),
            None => {}
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        answered,
        Some(StatusCode::CREATED),
        "{claim_mode}: the thawed instance serves new keys"
    );

    let db = connect(&url).await;
    let titles: Vec<String> = keys.iter().map(|(_, key)| key.clone()).collect();
    let row = db
        .query_one(
            "SELECT count(*) FILTER (WHERE n > 1), count(*) \
             FROM (SELECT count(*) AS n FROM tasks WHERE title = ANY($1) GROUP BY title) t",
            &[&titles],
        )
        .await
        .unwrap();
    let (doubled, created): (i64, i64) = (row.get(0), row.get(1));
    assert_eq!(doubled, 0, "{claim_mode}: {doubled} keys got two tasks");
    assert_eq!(
        created,
        keys.len() as i64,
        "{claim_mode}: every key has its task"
    );
    eprintln!(
        "{claim_mode}: {} keys, all created within {waited:?} of the freeze, none twice",
        keys.len()
    );
    drop(frozen);
    drop(other);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_frozen_instance_holds_no_key_past_the_lease_in_the_speculative_mode() {
    a_frozen_instance_holds_no_key_past_the_lease("speculative").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_frozen_instance_holds_no_key_past_the_lease_in_the_one_transaction_mode() {
    a_frozen_instance_holds_no_key_past_the_lease("one-transaction").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_frozen_instance_holds_no_key_past_the_lease_in_the_lease_mode() {
    a_frozen_instance_holds_no_key_past_the_lease("lease").await;
}

/// One task, updated by `PATCH` with fresh keys on the instance about to freeze until it is
/// frozen between its `UPDATE` and its `COMMIT` (the row locked by a transaction that waits for
/// its frozen application); then the same `PATCH` retried on the other instance. Its handler
/// updates the same row, so it runs only once the frozen transaction has ended.
async fn a_frozen_instance_holds_no_row_lock_past_the_lease(claim_mode: &str) {
    let Instances {
        _pg,
        url,
        frozen,
        other,
        client,
    } = Instances::start(claim_mode).await;
    let db = connect(&url).await;

    let user = uuid::Uuid::new_v4().to_string();
    let (status, body) = create(
        &client,
        other.addr(),
        &user,
        "first",
        Duration::from_secs(5),
    )
    .await
    .unwrap();
    assert_eq!(status, StatusCode::CREATED);
    let task: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let path = format!("/tasks/{}", task["id"].as_str().unwrap());

    // One client updates the task on the instance about to freeze. Frozen at a random instant,
    // it is caught between the `UPDATE` and the `COMMIT` often enough: thaw and try again until
    // the database shows a transaction idle with a row of `tasks` locked.
    let key = Arc::new(Mutex::new(String::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let updater = {
        let (client, key, stop, path, user) = (
            client.clone(),
            key.clone(),
            stop.clone(),
            path.clone(),
            user.clone(),
        );
        let addr = frozen.addr();
        tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let fresh = uuid::Uuid::new_v4().to_string();
                *key.lock().unwrap() = fresh.clone();
                send(
                    &client,
                    "PATCH",
                    addr,
                    &path,
                    &user,
                    &fresh,
                    Duration::from_secs(1),
                )
                .await;
            }
        })
    };
    let mut caught = false;
    for _ in 0..400 {
        tokio::time::sleep(Duration::from_millis(7)).await;
        frozen.signal("STOP");
        tokio::time::sleep(Duration::from_millis(30)).await;
        let locked: i64 = db
            .query_one(
                "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid) \
                 WHERE l.relation = 'tasks'::regclass AND l.mode = 'RowExclusiveLock' \
                   AND l.granted AND a.state = 'idle in transaction'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if locked == 1 {
            caught = true;
            break;
        }
        frozen.signal("CONT");
    }
    assert!(
        caught,
        "{claim_mode}: never froze between an UPDATE and its COMMIT"
    );
    let frozen_at = tokio::time::Instant::now();
    stop.store(true, Ordering::SeqCst);
    updater.await.unwrap();
    let key = key.lock().unwrap().clone();

    // The frozen request's key, retried on the other instance: `200` within the lease and a few
    // seconds, while the first instance stays frozen.
    let deadline = frozen_at + LEASE + Duration::from_secs(6);
    let mut last = None;
    let answered = loop {
        let answer = send(
            &client,
            "PATCH",
            other.addr(),
            &path,
            &user,
            &key,
            Duration::from_secs(2),
        )
        .await;
        match answer {
            Some((StatusCode::OK, body)) => break Some(body),
            Some((StatusCode::CONFLICT | StatusCode::SERVICE_UNAVAILABLE, _)) | None => {}
            Some((status, body)) => {
                panic!("unexpected {status}: {}", String::from_utf8_lossy(&body))
            }
        }
        last = answer.map(|(status, _)| status);
        if tokio::time::Instant::now() >= deadline {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let waited = frozen_at.elapsed();
    frozen.signal("CONT");
    let body = answered.unwrap_or_else(|| {
        panic!(
            "{claim_mode}: the retry of the frozen request was not answered {waited:?} after the \
             freeze (lease {LEASE:?}; last answer {last:?}): it waits on the frozen transaction's \
             row lock"
        )
    });
    let updated: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(updated["title"], key.as_str());
    eprintln!("{claim_mode}: the retry updated the row {waited:?} after the freeze");
    drop(frozen);
    drop(other);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_frozen_instance_holds_no_row_lock_past_the_lease_in_the_lease_mode() {
    a_frozen_instance_holds_no_row_lock_past_the_lease("lease").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_frozen_instance_holds_no_row_lock_past_the_lease_in_the_speculative_mode() {
    a_frozen_instance_holds_no_row_lock_past_the_lease("speculative").await;
}
