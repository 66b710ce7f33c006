//! The contended workload (issue 45): an orders service behind the layer (two instances as child
//! processes, on one database), five hot stock rows taken in the order each client gives them,
//! a restocker that keeps the stock near empty so refusals are stored beside creations, and
//! SDK-like clients that cut a quarter of their first attempts off and retry with the same key.
//! Optionally one instance is SIGKILLed mid-load and started again.
//!
//! [`run`] measures one claim mode on one pool size: throughput (orders answered per second),
//! the latency of replays, what the clients were told; and it checks every key against the
//! database: one order per `201` and none otherwise, stock conserved, every later answer
//! byte-identical to the first, no key left without a final answer. The bench's `contention`
//! command prints [`markdown_table`] for each mode and pool size; `benches/tests/contention.rs`
//! runs it in CI at a size that fits.

mod check;
pub mod client;
pub mod shop;

use crate::err;
use crate::http::ServerProcess;
use check::check;
use client::{Answer, ClientBehaviour, KeyLog};
use idempotency::ClaimMode;
use idempotency::postgres::tokio_postgres;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use shop::NewOrder;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The environment variable the shop processes read the database URL from.
pub const URL_ENV: &str = "IDEMPOTENCY_BENCH_POSTGRES_URL";

/// A SIGKILL of one instance mid-load.
#[derive(Clone, Copy, Debug)]
pub struct Kill {
    /// When, after the load starts.
    pub after: Duration,
    /// How long the instance stays down before it starts again on the same port.
    pub down_for: Duration,
}

/// One run's settings.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The bench binary (it serves the shop: `serve-shop`).
    pub binary: PathBuf,
    /// The shop processes' settings (the database, schema, mode, pool, lease).
    pub shop: shop::ShopSettings,
    /// Instances of the shop on the one database.
    pub instances: usize,
    /// Clients sending orders at once.
    pub clients: usize,
    /// How long clients start new orders.
    pub duration: Duration,
    /// Hot items (stock rows).
    pub items: i32,
    /// How the clients retry.
    pub behaviour: ClientBehaviour,
    /// The share of answered orders sent once more afterwards (a response lost on the way).
    pub resend_share: f64,
    /// A SIGKILL of the first instance, if any.
    pub kill: Option<Kill>,
    /// How long after the load a key may still take to get its final answer (the lease plus a
    /// few seconds when an instance is killed).
    pub settle: Duration,
}

/// What a run measured and found.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// The claim mode.
    pub mode: ClaimMode,
    /// The pool size (0: the store's default).
    pub pool: usize,
    /// How many request transactions ran at once.
    pub admission: idempotency::TransactionAdmission,
    /// Orders (keys) sent.
    pub keys: usize,
    /// Orders answered `201`.
    pub created: usize,
    /// Orders answered with the stored refusal (`409 out_of_stock`).
    pub refused: usize,
    /// Orders finally answered within the load window, per second.
    pub throughput: f64,
    /// From an order's first attempt to its final answer: median and 99th percentile.
    pub order_p50: Duration,
    /// See `order_p50`.
    pub order_p99: Duration,
    /// Replays (`Idempotent-Replayed: true`) and their latency: median and 99th percentile.
    pub replays: usize,
    /// See `replays`.
    pub replay_p50: Duration,
    /// See `replays`.
    pub replay_p99: Duration,
    /// Attempts in all.
    pub attempts: usize,
    /// Retryable answers by who gave them (the library's refusal slug, or `handler-503`), and
    /// cut attempts (`cut`).
    pub retried: BTreeMap<String, usize>,
    /// What went wrong; empty when every check held.
    pub violations: Vec<String>,
}

/// Runs the workload once and checks it.
pub async fn run(settings: &Settings) -> Result<Outcome, String> {
    let url = settings.shop.url.clone();
    let schema = settings.shop.schema.clone();
    prepare(&url, &schema, settings.items).await?;
    let mut instances = Vec::new();
    for _ in 0..settings.instances.max(1) {
        instances.push(start_shop(settings, "127.0.0.1:0").await?);
    }
    let addrs: Vec<_> = instances.iter().map(ServerProcess::addr).collect();
    let http = client::http_client();
    let stop = Arc::new(AtomicBool::new(false));
    let restocker = restock(
        url.clone(),
        schema.clone(),
        settings.items,
        Arc::clone(&stop),
    );
    let started = Instant::now();
    let load_end = started + settings.duration;
    let deadline = load_end + settings.settle;
    let mut senders = tokio::task::JoinSet::new();
    for _ in 0..settings.clients {
        let (http, addrs, behaviour) = (http.clone(), addrs.clone(), settings.behaviour);
        let (items, resend) = (settings.items, settings.resend_share);
        senders.spawn(async move {
            let mut logs = Vec::new();
            while Instant::now() < load_end {
                let (key, order) = new_order(items);
                let mut log = client::run_key(&http, &addrs, key, order, behaviour, deadline).await;
                let lost = rand::rng().random_bool(resend);
                if log.first_final().is_some() && lost {
                    resend_once(&http, &addrs, &mut log, &behaviour).await;
                }
                logs.push(log);
            }
            logs
        });
    }
    if let Some(kill) = settings.kill {
        tokio::time::sleep(kill.after).await;
        let addr = instances[0].addr();
        instances[0].kill().await;
        tokio::time::sleep(kill.down_for).await;
        instances[0] = start_shop(settings, &addr.to_string()).await?;
    }
    let mut logs: Vec<KeyLog> = Vec::new();
    while let Some(sent) = senders.join_next().await {
        logs.extend(sent.map_err(|e| e.to_string())?);
    }
    stop.store(true, Ordering::Relaxed);
    restocker.await.map_err(|e| e.to_string())?;
    // Every answered key once more, after the dust settled: its answer must not have changed.
    let mut sweep = tokio::task::JoinSet::new();
    for chunk in logs.chunks(logs.len().div_ceil(16).max(1)) {
        let (http, addrs, behaviour) = (http.clone(), addrs.clone(), settings.behaviour);
        let mut chunk = chunk.to_vec();
        sweep.spawn(async move {
            for log in &mut chunk {
                if log.first_final().is_some() {
                    resend_once(&http, &addrs, log, &behaviour).await;
                }
            }
            chunk
        });
    }
    let mut swept = Vec::with_capacity(logs.len());
    while let Some(chunk) = sweep.join_next().await {
        swept.extend(chunk.map_err(|e| e.to_string())?);
    }
    let outcome = check(settings, &swept, load_end.duration_since(started)).await;
    drop(instances);
    outcome
}

async fn start_shop(settings: &Settings, listen: &str) -> Result<ServerProcess, String> {
    let shop = &settings.shop;
    let mode = mode_name(shop.mode);
    let pool = shop.pool.to_string();
    let mut args = vec![
        "serve-shop",
        "--listen",
        listen,
        "--schema",
        &shop.schema,
        "--mode",
        mode,
        "--pool",
        &pool,
    ];
    let lease = shop.lease.map(|l| l.as_millis().to_string());
    if let Some(lease) = &lease {
        args.extend(["--lease-ms", lease]);
    }
    let timeout = shop.store_timeout.map(|t| t.as_millis().to_string());
    if let Some(timeout) = &timeout {
        args.extend(["--store-timeout-ms", timeout]);
    }
    if shop.admission == idempotency::TransactionAdmission::WholePool {
        args.push("--whole-pool");
    }
    if shop.keep_refused_writes {
        args.push("--keep-refused-writes");
    }
    ServerProcess::spawn_with_env(&settings.binary, &args, &[(URL_ENV, &shop.url)]).await
}

/// A claim mode's name on the command line.
pub fn mode_name(mode: ClaimMode) -> &'static str {
    match mode {
        ClaimMode::Lease => "lease",
        ClaimMode::OneTransaction => "one-transaction",
        _ => "speculative",
    }
}

/// The claim mode of a name of [`mode_name`].
pub fn parse_mode(name: &str) -> Option<ClaimMode> {
    match name {
        "lease" => Some(ClaimMode::Lease),
        "one-transaction" => Some(ClaimMode::OneTransaction),
        "speculative" => Some(ClaimMode::OneTransactionSpeculative),
        _ => None,
    }
}

/// A fresh key and an order of one to three distinct items, in random order, one or two each.
fn new_order(items: i32) -> (String, NewOrder) {
    let mut rng = rand::rng();
    let mut all: Vec<i32> = (1..=items).collect();
    all.shuffle(&mut rng);
    let count = rng.random_range(1..=3usize.min(all.len()));
    let lines = all[..count]
        .iter()
        .map(|&item| (item, rng.random_range(1..=2)))
        .collect();
    let key = uuid::Uuid::new_v4().to_string();
    (
        key.clone(),
        NewOrder {
            reference: key,
            lines,
        },
    )
}

/// One more attempt of an answered key (never cut), as a client whose response was lost; the
/// library's retryable answers are retried until a final one comes.
async fn resend_once(
    http: &client::HttpClient,
    addrs: &[std::net::SocketAddr],
    log: &mut KeyLog,
    behaviour: &ClientBehaviour,
) {
    let body = bytes::Bytes::from(serde_json::to_vec(&log.order).unwrap_or_default());
    let mut rng = rand::rngs::SmallRng::from_rng(&mut rand::rng());
    for failed in 0..50u32 {
        let addr = addrs[rng.random_range(0..addrs.len())];
        let sent = client::attempt(http, addr, &log.key, &body, None, behaviour).await;
        let retry_after = match &sent.answer {
            Answer::Retry { retry_after, .. } => *retry_after,
            _ => None,
        };
        let done = !matches!(sent.answer, Answer::Retry { .. } | Answer::Cut);
        log.attempts.push(sent);
        if done {
            return;
        }
        tokio::time::sleep(client::backoff(&mut rng, failed, retry_after, behaviour)).await;
    }
}

/// The stock level the restocker keeps items above, and what it adds.
const LOW_STOCK: i32 = 3;
const RESTOCK: i32 = 6;
const INITIAL_STOCK: i32 = 10;

async fn connect(url: &str) -> Result<tokio_postgres::Client, String> {
    idempotency::postgres::connect_raw(url).await.map_err(err)
}

/// Creates the shop's schema afresh: stock, orders, restocks.
async fn prepare(url: &str, schema: &str, items: i32) -> Result<(), String> {
    connect(url)
        .await?
        .batch_execute(&format!(
            "DROP SCHEMA IF EXISTS \"{schema}\" CASCADE; CREATE SCHEMA \"{schema}\"; \
             CREATE TABLE \"{schema}\".stock (item int PRIMARY KEY, qty int NOT NULL CHECK (qty >= 0)); \
             INSERT INTO \"{schema}\".stock SELECT g, {INITIAL_STOCK} FROM generate_series(1, {items}) g; \
             CREATE TABLE \"{schema}\".orders (id bigserial PRIMARY KEY, reference text NOT NULL, \
               items int[] NOT NULL, qtys int[] NOT NULL); \
             CREATE TABLE \"{schema}\".restocks (item int NOT NULL, qty int NOT NULL)"
        ))
        .await
        .map_err(err)
}

/// Drops the shop's schema.
pub async fn cleanup(url: &str, schema: &str) -> Result<(), String> {
    connect(url)
        .await?
        .batch_execute(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
        .await
        .map_err(err)
}

/// Every 20 ms, adds stock to the items that run low (logged in `restocks` by the same
/// statement), so the stock stays near empty: orders meet refusals and hot rows alike.
fn restock(
    url: String,
    schema: String,
    items: i32,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let Ok(client) = connect(&url).await else {
            return;
        };
        let sql = format!(
            "WITH r AS (UPDATE \"{schema}\".stock SET qty = qty + {RESTOCK} \
               WHERE item = $1 AND qty < {LOW_STOCK} RETURNING item) \
             INSERT INTO \"{schema}\".restocks SELECT item, {RESTOCK} FROM r"
        );
        let mut item = 0;
        while !stop.load(Ordering::Relaxed) {
            // One row per statement: the restocker takes part in no deadlock of its own.
            item = item % items + 1;
            // A statement the server refused (a restart) changed nothing.
            let _ = client.execute(&sql, &[&item]).await;
            tokio::time::sleep(Duration::from_millis(20) / items.max(1) as u32).await;
        }
    })
}

/// The outcomes as a Markdown table.
pub fn markdown_table(outcomes: &[Outcome]) -> String {
    let mut md = String::from(
        "| claim mode | pool | admitted at once | orders/s | created | refused | order p50 | order p99 | replays | \
         replay p50 | replay p99 | retried (by whom) | checks |\n\
         | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |\n",
    );
    for o in outcomes {
        let retried: Vec<String> = o.retried.iter().map(|(k, v)| format!("{k} {v}")).collect();
        let checks = if o.violations.is_empty() {
            "held".to_owned()
        } else {
            format!("**{} violations**", o.violations.len())
        };
        md.push_str(&format!(
            "| {} | {} | {} | {:.1} | {} | {} | {:.0} ms | {:.0} ms | {} | {:.1} ms | {:.1} ms | {} | {} |\n",
            mode_name(o.mode),
            if o.pool == 0 { "default".to_owned() } else { o.pool.to_string() },
            match o.admission {
                idempotency::TransactionAdmission::WholePool => "the pool",
                _ => "adaptive",
            },
            o.throughput,
            o.created,
            o.refused,
            o.order_p50.as_secs_f64() * 1e3,
            o.order_p99.as_secs_f64() * 1e3,
            o.replays,
            o.replay_p50.as_secs_f64() * 1e3,
            o.replay_p99.as_secs_f64() * 1e3,
            retried.join(", "),
            checks
        ));
    }
    md
}
