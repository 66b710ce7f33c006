//! A PostgreSQL crash (immediate shutdown: no checkpoint, crash recovery at the next start) in
//! the middle of traffic, through the demo in the one-transaction mode, on a throwaway server.
//! Every key is then retried to completion. With a LOGGED key table no key has two tasks, and
//! every 201 a client saw before the crash is what its retry replays, byte for byte. With the
//! ADR's UNLOGGED key table the same crash empties the key table while the tasks stay, and the
//! same test finds keys with two tasks: the cost the ADR accepted, shown.
#![allow(clippy::unwrap_used)]

use axum::Router;
use bytes::Bytes;
use hyper::StatusCode;
use idempotency::TableMode;
use idempotency_demo::Options;
use idempotency_e2e::{create_task, send};
use idempotency_testkit::TempPostgres;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const CLIENTS: usize = 16;
const PER_REQUEST: Duration = Duration::from_secs(10);

/// What the clients saw: per (user, key), the 201 body they got, if any.
type Seen = Arc<Mutex<HashMap<(String, String), Option<Bytes>>>>;

/// Sends `create(user, key)` once (`retry` false) or until a 201, and records the first 201's
/// body; returns false when a later 201 differs from the one the client saw first.
async fn send_once_or_until_done(
    app: &Router,
    user: &str,
    key: &str,
    seen: &Seen,
    retry: bool,
) -> bool {
    seen.lock()
        .unwrap()
        .entry((user.to_owned(), key.to_owned()))
        .or_default();
    for _ in 0..400 {
        let answer = tokio::time::timeout(PER_REQUEST, send(app, create_task(user, key))).await;
        let Ok((status, _, body)) = answer else {
            panic!("a request went unanswered for {PER_REQUEST:?}");
        };
        if status == StatusCode::CREATED {
            let mut seen = seen.lock().unwrap();
            let slot = seen.entry((user.to_owned(), key.to_owned())).or_default();
            return match slot {
                Some(first) => *first == body,
                None => {
                    *slot = Some(body);
                    true
                }
            };
        }
        assert!(
            matches!(
                status,
                StatusCode::SERVICE_UNAVAILABLE | StatusCode::CONFLICT
            ),
            "unexpected {status}: {}",
            String::from_utf8_lossy(&body)
        );
        if !retry {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("key {key} was not created after 400 tries");
}

/// Crashes PostgreSQL under `CLIENTS` clients of the demo with `table_mode`, restarts it,
/// retries every key; returns (keys with two or more tasks, keys sent, keys whose retry answered
/// another 201 than the one the client saw).
async fn crash_under_load(table_mode: TableMode) -> (i64, usize, usize) {
    crash_under_load_with(Options {
        table_mode: Some(table_mode),
        ..Options::default()
    })
    .await
}

/// [`crash_under_load`] with the demo's `options`.
async fn crash_under_load_with(options: Options) -> (i64, usize, usize) {
    let pg = TempPostgres::start(&[]).unwrap();
    let url = pg.url("postgres");
    let app = idempotency_demo::build_app_with(&url, &options)
        .await
        .unwrap()
        .router;
    let seen: Seen = Arc::default();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        let (app, seen, stop) = (app.clone(), seen.clone(), stop.clone());
        clients.push(tokio::spawn(async move {
            let user = uuid::Uuid::new_v4().to_string();
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let key = uuid::Uuid::new_v4().to_string();
                // One try each while the server goes down: the retries come after the restart.
                send_once_or_until_done(&app, &user, &key, &seen, false).await;
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    pg.crash().unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    for client in clients {
        client.await.unwrap();
    }
    pg.start_server().unwrap();
    let sent: Vec<(String, String)> = seen.lock().unwrap().keys().cloned().collect();
    let mut changed = 0;
    for (user, key) in &sent {
        if !send_once_or_until_done(&app, user, key, &seen, true).await {
            changed += 1;
        }
    }
    let (client, connection) = idempotency::postgres::tokio_postgres::connect(
        &url,
        idempotency::postgres::tokio_postgres::NoTls,
    )
    .await
    .unwrap();
    tokio::spawn(connection);
    let keys: Vec<String> = sent.iter().map(|(_, key)| key.clone()).collect();
    let doubled: i64 = client
        .query_one(
            "SELECT count(*) FROM (SELECT title FROM tasks WHERE title = ANY($1) \
             GROUP BY title HAVING count(*) > 1) doubled",
            &[&keys],
        )
        .await
        .unwrap()
        .get(0);
    let created: i64 = client
        .query_one(
            "SELECT count(DISTINCT title) FROM tasks WHERE title = ANY($1)",
            &[&keys],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(created, keys.len() as i64, "every key has its task");
    (doubled, sent.len(), changed)
}

/// LOGGED key table (the demo's default mode, speculative): the key commits with its task, so
/// the crash keeps both or neither.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_database_crash_never_creates_a_task_twice_with_a_logged_key_table() {
    let (doubled, sent, changed) = crash_under_load(TableMode::Logged).await;
    eprintln!("LOGGED: {sent} keys, {doubled} with two tasks, {changed} answered differently");
    assert!(sent > CLIENTS, "the load must have been real: {sent} keys");
    assert_eq!(doubled, 0, "{doubled} of {sent} keys got a second task");
    assert_eq!(
        changed, 0,
        "{changed} of {sent} retries answered another 201 than the one the client saw"
    );
}

/// The same in the one-transaction mode that looks the key up before the handler runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_database_crash_never_creates_a_task_twice_with_the_lookup_first() {
    let (doubled, sent, changed) = crash_under_load_with(Options {
        table_mode: Some(TableMode::Logged),
        claim_mode: idempotency::ClaimMode::OneTransaction,
        ..Options::default()
    })
    .await;
    eprintln!(
        "lookup first: {sent} keys, {doubled} with two tasks, {changed} answered differently"
    );
    assert!(sent > CLIENTS, "the load must have been real: {sent} keys");
    assert_eq!(doubled, 0, "{doubled} of {sent} keys got a second task");
    assert_eq!(
        changed, 0,
        "{changed} of {sent} retries answered another 201 than the one the client saw"
    );
}

/// Lease mode with `LoggedAsyncCommit`: claims commit asynchronously (a crash may take back the
/// last ones: their keys are free again, and nothing ran in a transaction that did not commit),
/// while each request's transaction, holding its task and its stored response, commits
/// synchronously. Every key retried after recovery: no task twice, and every 201 a client saw is
/// what its retry replays. (Before, the request's transaction committed asynchronously too, so a
/// client could be answered 201 for a task the crash then took back.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_database_crash_never_creates_a_task_twice_with_asynchronous_claims() {
    let (doubled, sent, changed) = crash_under_load_with(Options {
        table_mode: Some(TableMode::LoggedAsyncCommit),
        claim_mode: idempotency::ClaimMode::Lease,
        // Claims that survive the crash with nobody running them block their keys this long.
        lease: Duration::from_secs(2),
        ..Options::default()
    })
    .await;
    eprintln!(
        "LOGGED, asynchronous claims: {sent} keys, {doubled} with two tasks, {changed} answered \
         differently"
    );
    assert!(sent > CLIENTS, "the load must have been real: {sent} keys");
    assert_eq!(doubled, 0, "{doubled} of {sent} keys got a second task");
    assert_eq!(
        changed, 0,
        "{changed} of {sent} retries answered another 201 than the one the client saw"
    );
}

/// UNLOGGED key table (the ADR): crash recovery empties it while the tasks stay, so retries of
/// keys completed before the crash create a second task. Shown, as documented.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_database_crash_with_an_unlogged_key_table_runs_completed_keys_again() {
    let (doubled, sent, changed) = crash_under_load(TableMode::Unlogged).await;
    eprintln!("UNLOGGED: {sent} keys, {doubled} with two tasks, {changed} answered differently");
    assert!(
        doubled > 0,
        "the UNLOGGED key table lost its keys in the crash, so some of {sent} keys must have \
         run again"
    );
}
