//! Chaos on a schedule: the store's server taken down every 5-15 s (at random, a clean stop or
//! a crash, down for 0.5-2 s) while 16 clients create one task after another through the demo,
//! each retrying its key (`409`, `503`) until it has its `201`. Then every key is sent once
//! more. Checked per key: one task (the demo's table, or the handler's count), the retry
//! replays the `201` its client saw byte for byte, and no key is left without its answer.
//!
//! PostgreSQL (throwaway servers) in the speculative mode and in the lease mode; Redis with an
//! append-only file synced on every write, killed and restarted; a Redis Cluster with a replica
//! per master, a master failed over to its replica (killed and taken over, or a coordinated
//! failover, in turn) with the store waiting for one replica's acknowledgement. 40 s of chaos each by default
//! (`IDEMPOTENCY_CHAOS_SECS` for longer runs); the counts are printed.
#![allow(clippy::unwrap_used)]

use axum::Router;
use axum::body::Body;
use bytes::Bytes;
use hyper::{Request, StatusCode};
use idempotency::{ClaimMode, IdempotencyStore};
use idempotency_demo::Options;
use idempotency_e2e::{Runs, User, counting_app_with, create_task, request, send};
use idempotency_testkit::{TempPostgres, TempRedis, TempRedisCluster};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const CLIENTS: usize = 16;
/// A request slower than this fails the test: the store timeout bounds every call.
const PER_REQUEST: Duration = Duration::from_secs(30);

fn chaos_for() -> Duration {
    let secs = std::env::var("IDEMPOTENCY_CHAOS_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(40);
    Duration::from_secs(secs)
}

/// A number in `lo..=hi` (milliseconds), at random.
fn between(lo: u64, hi: u64) -> Duration {
    let random = uuid::Uuid::new_v4().as_u128() as u64;
    Duration::from_millis(lo + random % (hi - lo + 1))
}

/// What the clients saw: each key's first `201` body, and how many attempts it took.
#[derive(Default)]
struct Seen {
    first: HashMap<String, Bytes>,
    attempts: usize,
    unavailable: usize,
}

/// How long a key may go without its answer: the longest outage, a lease, and the retries.
const STUCK: Duration = Duration::from_secs(60);

/// Sends `make()` until it answers `201`, retrying `409` and `503` after 50 ms; returns the
/// body and the attempts. A key without its answer after [`STUCK`] fails the test.
async fn until_created(
    app: &Router,
    make: &(impl Fn() -> Request<Body> + Sync),
) -> (Bytes, usize, usize) {
    let (mut attempts, mut unavailable) = (0, 0);
    let started = Instant::now();
    loop {
        assert!(
            started.elapsed() < STUCK,
            "a key had no answer after {STUCK:?} ({attempts} attempts)"
        );
        attempts += 1;
        let (status, _, body) = tokio::time::timeout(PER_REQUEST, send(app, make()))
            .await
            .unwrap_or_else(|_| panic!("a request went unanswered for {PER_REQUEST:?}"));
        match status {
            StatusCode::CREATED => return (body, attempts, unavailable),
            StatusCode::SERVICE_UNAVAILABLE => unavailable += 1,
            StatusCode::CONFLICT => {}
            other => panic!("unexpected {other}: {}", String::from_utf8_lossy(&body)),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Runs `CLIENTS` clients through `app` while `outage` takes the server down every 5-15 s
/// for `chaos_for()`, then sends every key once more; returns what the clients saw, and the
/// keys whose second answer differed from their first.
async fn under_chaos(
    app: &Router,
    make: impl Fn(&str, &str) -> Request<Body> + Clone + Send + Sync + 'static,
    outage: impl Fn(bool) + Clone + Send + Sync + 'static,
) -> (Seen, usize, usize) {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        let (app, seen, stop, make) = (app.clone(), seen.clone(), stop.clone(), make.clone());
        clients.push(tokio::spawn(async move {
            let user = uuid::Uuid::new_v4().to_string();
            while !stop.load(Ordering::SeqCst) {
                let key = uuid::Uuid::new_v4().to_string();
                let (body, attempts, unavailable) =
                    until_created(&app, &|| make(&user, &key)).await;
                let mut seen = seen.lock().unwrap();
                seen.first.insert(format!("{user}/{key}"), body);
                seen.attempts += attempts;
                seen.unavailable += unavailable;
            }
        }));
    }
    let started = Instant::now();
    let mut outages = 0;
    while started.elapsed() < chaos_for() {
        tokio::time::sleep(
            between(5_000, 15_000).min(chaos_for().saturating_sub(started.elapsed())),
        )
        .await;
        if started.elapsed() >= chaos_for() {
            break;
        }
        // A clean stop, then a crash, and so on; `outage` brings the server back.
        let (outage, crash) = (outage.clone(), outages % 2 == 1);
        tokio::task::spawn_blocking(move || outage(crash))
            .await
            .unwrap();
        outages += 1;
    }
    stop.store(true, Ordering::SeqCst);
    for client in clients {
        client.await.unwrap();
    }
    let seen = Arc::try_unwrap(seen).ok().unwrap().into_inner().unwrap();
    let mut changed = 0;
    for (id, first) in &seen.first {
        let (user, key) = id.split_once('/').unwrap();
        let (body, _, _) = until_created(app, &|| make(user, key)).await;
        if body != *first {
            changed += 1;
        }
    }
    (seen, changed, outages)
}

/// The demo on a throwaway PostgreSQL in `claim_mode`, its server stopped (or crashed) and
/// started again on the schedule; every key has one task and replays what its client saw.
async fn postgres_under_chaos(claim_mode: ClaimMode) {
    let pg = Arc::new(TempPostgres::start(&[]).unwrap());
    let url = pg.url("postgres");
    let app = idempotency_demo::build_app_with(
        &url,
        &Options {
            claim_mode,
            lease: Duration::from_secs(5),
            ..Options::default()
        },
    )
    .await
    .unwrap()
    .router;
    let server = Arc::clone(&pg);
    let (seen, changed, outages) = under_chaos(&app, create_task, move |crash| {
        if crash {
            server.crash().unwrap();
        } else {
            server.stop().unwrap();
        }
        std::thread::sleep(between(500, 2_000));
        server.start_server().unwrap();
    })
    .await;
    let (client, connection) = idempotency::postgres::tokio_postgres::connect(
        &url,
        idempotency::postgres::tokio_postgres::NoTls,
    )
    .await
    .unwrap();
    tokio::spawn(connection);
    let keys: Vec<String> = seen
        .first
        .keys()
        .map(|id| id.split_once('/').unwrap().1.to_owned())
        .collect();
    let (tasks, doubled): (i64, i64) = {
        let row = client
            .query_one(
                "SELECT count(*), count(*) - count(DISTINCT title) FROM tasks \
                 WHERE title = ANY($1)",
                &[&keys],
            )
            .await
            .unwrap();
        (row.get(0), row.get(1))
    };
    eprintln!(
        "PostgreSQL {claim_mode:?}: {outages} outages, {} keys, {} attempts ({} answered 503), \
         {tasks} tasks, {doubled} doubled, {changed} answered differently",
        keys.len(),
        seen.attempts,
        seen.unavailable,
    );
    assert!(outages >= 2, "the schedule must have taken the server down");
    assert!(seen.unavailable > 0, "the outages must have been seen");
    assert!(keys.len() > CLIENTS * 10, "the load must have been real");
    assert_eq!(doubled, 0, "{doubled} keys got a second task");
    assert_eq!(tasks, keys.len() as i64, "every key has its task");
    assert_eq!(
        changed, 0,
        "{changed} keys answered another 201 than their first"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_restarted_on_a_schedule_in_the_speculative_mode() {
    postgres_under_chaos(ClaimMode::OneTransactionSpeculative).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_restarted_on_a_schedule_in_the_lease_mode() {
    postgres_under_chaos(ClaimMode::Lease).await;
}

/// The counting app on a Redis store, with `store_timeout` and a lease of three of them: as
/// in the PostgreSQL runs, a key whose request lost its claim's settle in an outage is held
/// for one short lease, then taken over.
fn redis_counting_app(
    store: &idempotency::redis::RedisStore,
    runs: &Runs,
    store_timeout: Duration,
) -> Router {
    counting_app_with(
        Arc::new(store.clone()) as Arc<dyn IdempotencyStore>,
        runs,
        |b| b.store_timeout(store_timeout).lease(store_timeout * 3),
    )
}

/// An order of the counting app, sent as the client's user (one per client name, made once).
fn orders_as_users() -> impl Fn(&str, &str) -> Request<Body> + Clone + Send + Sync + 'static {
    let users: Arc<Mutex<HashMap<String, User>>> = Arc::default();
    move |user, key| {
        let user = *users
            .lock()
            .unwrap()
            .entry(user.to_owned())
            .or_insert_with(idempotency_e2e::user);
        request("/orders", key, user, "{}")
    }
}

/// The counting app on a throwaway Redis whose append-only file is synced on every write,
/// killed (SIGKILL) and started again on the schedule: every key's handler ran once, and each
/// key replays what its client saw.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_killed_on_a_schedule() {
    let server = TempRedis::start(&["--appendonly", "yes", "--appendfsync", "always"]).unwrap();
    let store = idempotency::redis::RedisStore::builder(server.url())
        .connect_timeout(Duration::from_secs(1))
        .response_timeout(Duration::from_secs(1))
        .build()
        .await
        .unwrap();
    let runs = Runs::default();
    let app = redis_counting_app(&store, &runs, Duration::from_secs(2));
    let server = Arc::new(Mutex::new(server));
    let (seen, changed, outages) = under_chaos(&app, orders_as_users(), move |_| {
        server.lock().unwrap().kill().unwrap();
        std::thread::sleep(between(500, 2_000));
        server.lock().unwrap().start_server().unwrap();
    })
    .await;
    let ran = runs.orders.load(Ordering::SeqCst);
    eprintln!(
        "Redis: {outages} outages, {} keys, {} attempts ({} answered 503), {ran} runs, \
         {changed} answered differently, {} state losses counted",
        seen.first.len(),
        seen.attempts,
        seen.unavailable,
        store.state_losses(),
    );
    assert!(outages >= 2, "the schedule must have taken the server down");
    assert!(seen.unavailable > 0, "the outages must have been seen");
    assert!(
        seen.first.len() > CLIENTS * 10,
        "the load must have been real"
    );
    assert_eq!(
        ran,
        seen.first.len(),
        "a key's handler ran twice (or never)"
    );
    assert_eq!(
        changed, 0,
        "{changed} keys answered another 201 than their first"
    );
}

/// The counting app on a throwaway Redis Cluster of three masters with a replica each, the
/// store waiting for one replica to acknowledge each claim and completion
/// (`wait_for_replicas(1, ..)`). On the schedule one master fails over to its replica: killed
/// (SIGKILL) and taken over at once, or a coordinated `CLUSTER FAILOVER`, in turn; the killed
/// one comes back empty as the new master's replica. Every key's handler ran once, and each key
/// replays what its client saw: the store follows the new masters with no key stuck, no
/// answer changed and no state loss falsely counted. (On loopback a replica is never far
/// enough behind for a crash to lose a write: runs without the wait lost nothing either. What
/// the wait keeps when one is behind is `idempotency-redis`'s
/// `a_failover_loses_unreplicated_claims_unless_the_store_waits`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_cluster_failed_over_on_a_schedule() {
    let cluster = TempRedisCluster::start_with_replicas().unwrap();
    let store = idempotency::redis::RedisStore::cluster_builder(cluster.urls())
        .connect_timeout(Duration::from_secs(1))
        .response_timeout(Duration::from_secs(2))
        .wait_for_replicas(1, Duration::from_millis(500))
        .build()
        .await
        .unwrap();
    let runs = Runs::default();
    let app = redis_counting_app(&store, &runs, Duration::from_secs(3));
    let cluster = Arc::new(Mutex::new(cluster));
    let failovers: Arc<Mutex<Vec<(bool, u16, u16)>>> = Arc::default();
    let (seen, changed, outages) = under_chaos(&app, orders_as_users(), {
        let failovers = failovers.clone();
        move |crash| {
            let (from, to) = cluster.lock().unwrap().fail_over(crash).unwrap();
            failovers.lock().unwrap().push((crash, from, to));
        }
    })
    .await;
    let ran = runs.orders.load(Ordering::SeqCst);
    let failovers = failovers.lock().unwrap().clone();
    eprintln!(
        "Redis Cluster: {outages} failovers {failovers:?} (crash, old master, new master), {} \
         keys, {} attempts ({} answered 503), {ran} runs, {changed} answered differently, {} \
         state losses counted",
        seen.first.len(),
        seen.attempts,
        seen.unavailable,
        store.state_losses(),
    );
    assert!(outages >= 2, "the schedule must have failed masters over");
    assert!(
        failovers.iter().any(|f| f.0) && failovers.iter().any(|f| !f.0),
        "both kinds of failover ran: {failovers:?}"
    );
    assert!(
        seen.first.len() > CLIENTS * 10,
        "the load must have been real"
    );
    assert_eq!(
        ran,
        seen.first.len(),
        "a key's handler ran twice (or never)"
    );
    assert_eq!(
        changed, 0,
        "{changed} keys answered another 201 than their first"
    );
}
