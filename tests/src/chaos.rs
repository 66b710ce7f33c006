//! Chaos on a schedule: the store's server taken down every 5-15 s (at random, a clean stop or
//! a crash, down for 0.5-2 s; or a Redis Cluster master failed over) while 16 clients create one
//! task after another through the demo, each retrying its key (`409`, `503`) until it has its
//! `201`. Then every key is sent once more. Counted per run ([`ChaosFigures`]): the keys, the
//! side effects per key (the demo's table, or the handler's count), the keys whose retry did not
//! replay the `201` its client saw byte for byte, and whether any key went without its answer.
//!
//! The runs are `tests/chaos.rs` in CI (40 s each) and a section of the report
//! (`idempotency-bench report`), which prints their figures.

use crate::{Runs, User, counting_app_with, create_task, request, send};
use axum::Router;
use axum::body::Body;
use bytes::Bytes;
use hyper::{Request, StatusCode};
use idempotency::{ClaimMode, IdempotencyStore};
use idempotency_demo::Options;
use idempotency_testkit::{TempPostgres, TempRedis, TempRedisCluster};
use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Clients creating tasks at once.
pub const CLIENTS: usize = 16;
/// A request slower than this fails the run: the store timeout bounds every call.
const PER_REQUEST: Duration = Duration::from_secs(30);
/// How long a key may go without its answer: the longest outage, a lease, and the retries.
const STUCK: Duration = Duration::from_secs(60);

/// What one run saw, and what its checks read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChaosFigures {
    /// Which store, and how it was taken down.
    pub run: String,
    /// Outages (or failovers) the schedule caused.
    pub outages: usize,
    /// Keys that got their `201`.
    pub keys: usize,
    /// Requests sent for them, retries included.
    pub attempts: usize,
    /// Of those, answered `503` (the store unreachable, or the outcome unknown).
    pub unavailable: usize,
    /// Side effects counted: tasks in the demo's table, or runs of the handler.
    pub effects: usize,
    /// Keys with more than one side effect.
    pub doubled: usize,
    /// Keys whose retry after the run answered another `201` than the first.
    pub changed: usize,
    /// State losses the store counted (Redis), where it counts them.
    pub state_losses: Option<u64>,
    /// How long the run took, the final retries included.
    pub took: Duration,
}

impl ChaosFigures {
    /// The run's promise: the outages happened and were seen, the load was real, every key
    /// has exactly one side effect and replays what its client saw.
    pub fn check(&self) -> Result<(), String> {
        let run = &self.run;
        if self.outages < 2 {
            return Err(format!(
                "{run}: the schedule took the server down {} times, not 2",
                self.outages
            ));
        }
        if self.unavailable == 0 {
            return Err(format!("{run}: no request saw an outage"));
        }
        if self.keys <= CLIENTS * 10 {
            return Err(format!(
                "{run}: only {} keys: the load was not real",
                self.keys
            ));
        }
        if self.doubled != 0 {
            return Err(format!(
                "{run}: {} keys got a second side effect",
                self.doubled
            ));
        }
        if self.effects != self.keys {
            return Err(format!(
                "{run}: {} side effects for {} keys (a key's work ran twice, or never)",
                self.effects, self.keys
            ));
        }
        if self.changed != 0 {
            return Err(format!(
                "{run}: {} keys answered another 201 than their first",
                self.changed
            ));
        }
        Ok(())
    }
}

impl fmt::Display for ChaosFigures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} outages, {} keys, {} attempts ({} answered 503), {} side effects, {} doubled, \
             {} answered differently",
            self.run,
            self.outages,
            self.keys,
            self.attempts,
            self.unavailable,
            self.effects,
            self.doubled,
            self.changed
        )?;
        if let Some(losses) = self.state_losses {
            write!(f, ", {losses} state losses counted")?;
        }
        write!(f, ", {:.0} s", self.took.as_secs_f64())
    }
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

/// Sends `make()` until it answers `201`, retrying `409` and `503` after 50 ms; returns the
/// body, the attempts and the `503`s. A key without its answer after [`STUCK`], a request
/// unanswered for [`PER_REQUEST`], or another status is an error.
async fn until_created(
    app: &Router,
    make: &(impl Fn() -> Request<Body> + Sync),
) -> Result<(Bytes, usize, usize), String> {
    let (mut attempts, mut unavailable) = (0, 0);
    let started = Instant::now();
    loop {
        if started.elapsed() >= STUCK {
            return Err(format!(
                "a key had no answer after {STUCK:?} ({attempts} attempts)"
            ));
        }
        attempts += 1;
        let (status, _, body) = tokio::time::timeout(PER_REQUEST, send(app, make()))
            .await
            .map_err(|_| format!("a request went unanswered for {PER_REQUEST:?}"))?;
        match status {
            StatusCode::CREATED => return Ok((body, attempts, unavailable)),
            StatusCode::SERVICE_UNAVAILABLE => unavailable += 1,
            StatusCode::CONFLICT => {}
            other => {
                return Err(format!(
                    "unexpected {other}: {}",
                    String::from_utf8_lossy(&body)
                ));
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Runs [`CLIENTS`] clients through `app` while `outage` takes the server down every 5-15 s
/// for `chaos_for`, then sends every key once more; returns what the clients saw, the keys
/// whose second answer differed from their first, and the outages.
async fn under_chaos(
    app: &Router,
    chaos_for: Duration,
    make: impl Fn(&str, &str) -> Request<Body> + Clone + Send + Sync + 'static,
    outage: impl Fn(bool) -> Result<(), String> + Clone + Send + Sync + 'static,
) -> Result<(Seen, usize, usize), String> {
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
                    until_created(&app, &|| make(&user, &key)).await?;
                let mut seen = seen.lock().unwrap();
                seen.first.insert(format!("{user}/{key}"), body);
                seen.attempts += attempts;
                seen.unavailable += unavailable;
            }
            Ok::<(), String>(())
        }));
    }
    let started = Instant::now();
    let mut outages = 0;
    let mut failed = None;
    while started.elapsed() < chaos_for {
        tokio::time::sleep(between(5_000, 15_000).min(chaos_for.saturating_sub(started.elapsed())))
            .await;
        if started.elapsed() >= chaos_for {
            break;
        }
        // A clean stop, then a crash, and so on; `outage` brings the server back.
        let (outage, crash) = (outage.clone(), outages % 2 == 1);
        let caused = tokio::task::spawn_blocking(move || outage(crash))
            .await
            .map_err(|e| format!("the outage's task: {e}"))?;
        if let Err(why) = caused {
            failed = Some(format!("the outage could not be caused: {why}"));
            break;
        }
        outages += 1;
    }
    stop.store(true, Ordering::SeqCst);
    for client in clients {
        client
            .await
            .map_err(|e| format!("a client's task: {e}"))??;
    }
    if let Some(why) = failed {
        return Err(why);
    }
    let seen = Arc::try_unwrap(seen)
        .map_err(|_| "the clients' record is still shared".to_owned())?
        .into_inner()
        .unwrap();
    let mut changed = 0;
    for (id, first) in &seen.first {
        let (user, key) = id.split_once('/').unwrap();
        let (body, _, _) = until_created(app, &|| make(user, key)).await?;
        if body != *first {
            changed += 1;
        }
    }
    Ok((seen, changed, outages))
}

/// The demo on a throwaway PostgreSQL in `claim_mode`, its server stopped (or crashed) and
/// started again on the schedule; counted: the demo's tasks per key.
pub async fn postgres_restarted(
    claim_mode: ClaimMode,
    chaos_for: Duration,
) -> Result<ChaosFigures, String> {
    let started = Instant::now();
    let pg = Arc::new(TempPostgres::start(&[]).map_err(|e| e.to_string())?);
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
    .map_err(|e| e.to_string())?
    .router;
    let server = Arc::clone(&pg);
    let (seen, changed, outages) = under_chaos(&app, chaos_for, create_task, move |crash| {
        if crash {
            server.crash().map_err(|e| e.to_string())?;
        } else {
            server.stop().map_err(|e| e.to_string())?;
        }
        std::thread::sleep(between(500, 2_000));
        server.start_server().map_err(|e| e.to_string())
    })
    .await?;
    let (client, connection) = idempotency::postgres::tokio_postgres::connect(
        &url,
        idempotency::postgres::tokio_postgres::NoTls,
    )
    .await
    .map_err(|e| e.to_string())?;
    tokio::spawn(connection);
    let keys: Vec<String> = seen
        .first
        .keys()
        .map(|id| id.split_once('/').unwrap().1.to_owned())
        .collect();
    let row = client
        .query_one(
            "SELECT count(*), count(*) - count(DISTINCT title) FROM tasks WHERE title = ANY($1)",
            &[&keys],
        )
        .await
        .map_err(|e| e.to_string())?;
    let (tasks, doubled): (i64, i64) = (row.get(0), row.get(1));
    let mode = match claim_mode {
        ClaimMode::Lease => "the lease mode",
        ClaimMode::OneTransaction => "the one-transaction mode",
        ClaimMode::OneTransactionSpeculative => "the speculative mode",
        _ => "another mode",
    };
    Ok(ChaosFigures {
        run: format!("PostgreSQL in {mode}, stopped or crashed and restarted"),
        outages,
        keys: keys.len(),
        attempts: seen.attempts,
        unavailable: seen.unavailable,
        effects: usize::try_from(tasks).unwrap_or(usize::MAX),
        doubled: usize::try_from(doubled).unwrap_or(usize::MAX),
        changed,
        state_losses: None,
        took: started.elapsed(),
    })
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
            .or_insert_with(crate::user);
        request("/orders", key, user, "{}")
    }
}

/// The counting app's figures: its handler's runs are the side effects (a run beyond one per
/// key is a doubled key: every key ran at least once to get its `201`).
fn counted(
    run: String,
    seen: &Seen,
    runs: &Runs,
    changed: usize,
    outages: usize,
    store: &idempotency::redis::RedisStore,
    started: Instant,
) -> ChaosFigures {
    let ran = runs.orders.load(Ordering::SeqCst);
    ChaosFigures {
        run,
        outages,
        keys: seen.first.len(),
        attempts: seen.attempts,
        unavailable: seen.unavailable,
        effects: ran,
        doubled: ran.saturating_sub(seen.first.len()),
        changed,
        state_losses: Some(store.state_losses()),
        took: started.elapsed(),
    }
}

/// The counting app on a throwaway Redis whose append-only file is synced on every write,
/// killed (SIGKILL) and started again on the schedule.
pub async fn redis_killed(chaos_for: Duration) -> Result<ChaosFigures, String> {
    let started = Instant::now();
    let server = TempRedis::start(&["--appendonly", "yes", "--appendfsync", "always"])
        .map_err(|e| e.to_string())?;
    let store = idempotency::redis::RedisStore::builder(server.url())
        .connect_timeout(Duration::from_secs(1))
        .response_timeout(Duration::from_secs(1))
        .build()
        .await
        .map_err(|e| e.to_string())?;
    let runs = Runs::default();
    let app = redis_counting_app(&store, &runs, Duration::from_secs(2));
    let server = Arc::new(Mutex::new(server));
    let (seen, changed, outages) = under_chaos(&app, chaos_for, orders_as_users(), move |_| {
        server.lock().unwrap().kill().map_err(|e| e.to_string())?;
        std::thread::sleep(between(500, 2_000));
        server
            .lock()
            .unwrap()
            .start_server()
            .map_err(|e| e.to_string())
    })
    .await?;
    let run = "Redis (append-only, fsync always), killed and restarted".to_owned();
    Ok(counted(
        run, &seen, &runs, changed, outages, &store, started,
    ))
}

/// The counting app on a throwaway Redis Cluster of three masters with a replica each, the
/// store waiting for one replica to acknowledge each claim and completion
/// (`wait_for_replicas(1, ..)`). On the schedule one master fails over to its replica: killed
/// (SIGKILL) and taken over at once, or a coordinated `CLUSTER FAILOVER`, in turn; the killed
/// one comes back empty as the new master's replica. Also returned: each failover as (a
/// crash, the old master's port, the new one's). (On loopback a replica is never far enough
/// behind for a crash to lose a write: runs without the wait lost nothing either. What the
/// wait keeps when one is behind is `idempotency-redis`'s
/// `a_failover_loses_unreplicated_claims_unless_the_store_waits`.)
pub async fn redis_cluster_failed_over(
    chaos_for: Duration,
) -> Result<(ChaosFigures, Vec<(bool, u16, u16)>), String> {
    let started = Instant::now();
    let cluster = TempRedisCluster::start_with_replicas().map_err(|e| e.to_string())?;
    let store = idempotency::redis::RedisStore::cluster_builder(cluster.urls())
        .connect_timeout(Duration::from_secs(1))
        .response_timeout(Duration::from_secs(2))
        .wait_for_replicas(1, Duration::from_millis(500))
        .build()
        .await
        .map_err(|e| e.to_string())?;
    let runs = Runs::default();
    let app = redis_counting_app(&store, &runs, Duration::from_secs(3));
    let cluster = Arc::new(Mutex::new(cluster));
    let failovers: Arc<Mutex<Vec<(bool, u16, u16)>>> = Arc::default();
    let (seen, changed, outages) = under_chaos(&app, chaos_for, orders_as_users(), {
        let failovers = failovers.clone();
        move |crash| {
            let (from, to) = cluster
                .lock()
                .unwrap()
                .fail_over(crash)
                .map_err(|e| e.to_string())?;
            failovers.lock().unwrap().push((crash, from, to));
            Ok(())
        }
    })
    .await?;
    let failovers = failovers.lock().unwrap().clone();
    let run =
        "Redis Cluster (a replica per master, the store waiting for one), masters failed over"
            .to_owned();
    Ok((
        counted(run, &seen, &runs, changed, outages, &store, started),
        failovers,
    ))
}
