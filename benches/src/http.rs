//! The layer's cost through real HTTP: a small task API (POST creates a task in a
//! `Mutex<HashMap>`) served by a child process with and without the idempotency layer on the
//! memory store, driven over loopback keep-alive connections by this process, the variants
//! interleaved in short rounds.
//!
//! `idempotency-bench serve-tasks --layer` runs the server; [`compare`] starts both variants
//! and measures them.

mod null_store;
mod process;

pub use null_store::NullStore;
pub use process::ServerProcess;

use crate::median;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::{Json, Router};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use idempotency::{IdempotencyLayer, MemoryStore, Scope};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Which server a round drives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    /// The task API alone.
    Plain,
    /// The task API with the idempotency layer on the POST route, on the given store.
    Layer(LayerStore),
}

/// The store behind the layer in [`Variant::Layer`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LayerStore {
    /// `MemoryStore::default()`: what the target and the report measure.
    #[default]
    Memory,
    /// A store that keeps nothing (`NullStore`): every claim is granted and every completion
    /// accepted, so the figure is the layer's and the engine's own cost, without a store's.
    Null,
    /// A `MemoryStore` whose 16 GiB bound no run reaches: the store's cost on fresh keys
    /// without eviction. `MemoryStore::default()` reaches its 64 MiB within the first
    /// round of fresh keys and evicts a record on every completion from then on; the difference
    /// between the two is what eviction costs.
    MemoryRoomy,
    /// `MemoryStore::default()` in a process with a Prometheus recorder installed
    /// (`metrics-exporter-prometheus`, the library's buckets, `/metrics` served as the demo
    /// does): what the layer's metrics cost once something records them. Compare it with
    /// `memory` (`--baseline memory`).
    MemoryPrometheus,
}

/// The bound of [`LayerStore::MemoryRoomy`]: 16 GiB, about 35 million of the bench's records.
pub const ROOMY_BOUND: u64 = 16 << 30;

impl LayerStore {
    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            LayerStore::Memory => "memory",
            LayerStore::Null => "null",
            LayerStore::MemoryRoomy => "memory-roomy",
            LayerStore::MemoryPrometheus => "memory-prometheus",
        }
    }
}

/// What a round sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    /// A new key on every request: claim, handler, store.
    FreshKeys,
    /// One key, sent over and over: every request but the first is a replay.
    Replay,
}

impl Workload {
    /// Its name in tables.
    pub fn name(self) -> &'static str {
        match self {
            Workload::FreshKeys => "fresh keys",
            Workload::Replay => "replay",
        }
    }
}

type Tasks = Arc<Mutex<HashMap<u64, String>>>;

async fn create_task(
    State(tasks): State<Tasks>,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, Json<serde_json::Value>) {
    let title = String::from_utf8_lossy(&body).into_owned();
    let user = headers
        .get("x-user")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("anonymous")
        .to_owned();
    let id = {
        let mut tasks = tasks.lock().unwrap_or_else(|e| e.into_inner());
        let id = tasks.len() as u64 + 1;
        tasks.insert(id, title.clone());
        id
    };
    (
        StatusCode::CREATED,
        Json(serde_json::json!({ "id": id, "user": user, "title": title })),
    )
}

/// The task API; with a `layer` store, behind the idempotency layer on that store, scoped by
/// the `x-user` header.
pub fn tasks_app(layer: Option<LayerStore>) -> Router {
    fn scope(parts: &axum::http::request::Parts) -> Option<Scope> {
        parts
            .headers
            .get("x-user")
            .and_then(|v| v.to_str().ok())
            .and_then(|u| Scope::new(u).ok())
    }
    let tasks: Tasks = Arc::default();
    let route = post(create_task);
    let route = match layer {
        None => route,
        Some(LayerStore::Memory | LayerStore::MemoryPrometheus) => route.layer(
            IdempotencyLayer::builder(MemoryStore::default())
                .scope_with(scope)
                .build()
                .expect("valid idempotency layer settings"),
        ),
        Some(LayerStore::Null) => route.layer(
            IdempotencyLayer::builder(NullStore)
                .scope_with(scope)
                .build()
                .expect("valid idempotency layer settings"),
        ),
        Some(LayerStore::MemoryRoomy) => route.layer(
            IdempotencyLayer::builder(MemoryStore::builder().max_stored_bytes(ROOMY_BOUND).build())
                .scope_with(scope)
                .build()
                .expect("valid idempotency layer settings"),
        ),
    };
    Router::new().route("/tasks", route).with_state(tasks)
}

/// Serves [`tasks_app`] on `listen` and prints `listening on <addr>` once bound; with
/// [`LayerStore::MemoryPrometheus`], installs the demo's Prometheus recorder first and serves
/// `GET /metrics` beside the task API.
pub async fn serve(listen: SocketAddr, layer: Option<LayerStore>) -> std::io::Result<()> {
    let mut app = tasks_app(layer);
    if layer == Some(LayerStore::MemoryPrometheus) {
        // The demo's recorder (the library's buckets, histograms drained every 5 s).
        let handle =
            idempotency_demo::operations::install_metrics().map_err(std::io::Error::other)?;
        app = app.merge(idempotency_demo::operations::metrics_route(handle, None));
    }
    let listener = tokio::net::TcpListener::bind(listen).await?;
    println!("listening on {}", listener.local_addr()?);
    axum::serve(listener, app).await
}

/// One round's figures.
#[derive(Clone, Copy, Debug)]
pub struct Round {
    /// Requests answered per second.
    pub throughput: f64,
    /// Median latency.
    pub p50: Duration,
    /// 99th percentile latency.
    pub p99: Duration,
    /// Server CPU time per request.
    pub cpu_per_request: Option<Duration>,
}

/// Drives `connections` keep-alive connections at `server` for `length`, each sending its next
/// request when the previous one is answered.
pub async fn round(
    server: &ServerProcess,
    workload: Workload,
    connections: usize,
    length: Duration,
) -> Result<Round, String> {
    let client: Client<HttpConnector, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(connections)
        .build_http();
    let uri = format!("http://{}/tasks", server.addr());
    let replay_key = uuid::Uuid::new_v4().to_string();
    let cpu_before = server.cpu_time();
    let started = Instant::now();
    let deadline = started + length;
    let mut workers = Vec::with_capacity(connections);
    for worker in 0..connections {
        let (client, uri, replay_key) = (client.clone(), uri.clone(), replay_key.clone());
        workers.push(tokio::spawn(async move {
            let mut latencies =
                hdrhistogram::Histogram::<u64>::new(3).map_err(|e| e.to_string())?;
            let user = format!("user-{worker}");
            while Instant::now() < deadline {
                let key = match workload {
                    Workload::FreshKeys => uuid::Uuid::new_v4().to_string(),
                    Workload::Replay => replay_key.clone(),
                };
                let request = hyper::Request::post(&uri)
                    .header("x-user", &user)
                    .header("idempotency-key", key)
                    .header("content-type", "text/plain")
                    .body(Full::new(Bytes::from_static(b"write the report")))
                    .map_err(|e| e.to_string())?;
                let sent = Instant::now();
                let response = client.request(request).await.map_err(|e| e.to_string())?;
                let status = response.status();
                response
                    .into_body()
                    .collect()
                    .await
                    .map_err(|e| e.to_string())?;
                if status != hyper::StatusCode::CREATED {
                    return Err(format!("unexpected {status}"));
                }
                latencies
                    .record(sent.elapsed().as_micros() as u64)
                    .map_err(|e| e.to_string())?;
            }
            Ok::<_, String>(latencies)
        }));
    }
    let mut all = hdrhistogram::Histogram::<u64>::new(3).map_err(|e| e.to_string())?;
    for worker in workers {
        let latencies = worker.await.map_err(|e| e.to_string())??;
        all.add(latencies).map_err(|e| e.to_string())?;
    }
    let elapsed = started.elapsed();
    let requests = all.len();
    let cpu_per_request = match (cpu_before, server.cpu_time()) {
        (Some(before), Some(after)) if requests > 0 => Some((after - before) / requests as u32),
        _ => None,
    };
    Ok(Round {
        throughput: requests as f64 / elapsed.as_secs_f64(),
        p50: Duration::from_micros(all.value_at_quantile(0.5)),
        p99: Duration::from_micros(all.value_at_quantile(0.99)),
        cpu_per_request,
    })
}

/// Medians over interleaved rounds of one workload: each figure of the layer and its ratio to
/// the plain server in the same round.
#[derive(Clone, Debug)]
pub struct HttpCompare {
    /// What was sent.
    pub workload: Workload,
    /// Connections at once.
    pub connections: usize,
    /// Rounds per variant.
    pub rounds: usize,
    /// Median requests/s without the layer.
    pub plain_throughput: f64,
    /// Median requests/s with the layer.
    pub layer_throughput: f64,
    /// Median of per-round throughput ratios (layer / plain).
    pub throughput_ratio: f64,
    /// Median p99 without and with the layer.
    pub plain_p99: Duration,
    /// Median p99 with the layer.
    pub layer_p99: Duration,
    /// Median of per-round p99 ratios (layer / plain).
    pub p99_ratio: f64,
    /// Median server CPU per request without and with the layer.
    pub plain_cpu: Option<Duration>,
    /// Median server CPU per request with the layer.
    pub layer_cpu: Option<Duration>,
}

/// Starts both servers (this executable's `serve-tasks`, with and without the layer on `store`)
/// and compares them on fresh keys, then on replays (fresh keys only on [`LayerStore::Null`],
/// which never replays, and on [`LayerStore::MemoryRoomy`], whose replays are the default
/// store's).
pub async fn compare_workloads(
    connections: usize,
    rounds: usize,
    length: Duration,
    store: LayerStore,
    baseline: Option<LayerStore>,
) -> Result<Vec<HttpCompare>, String> {
    let binary = std::env::current_exe().map_err(|e| e.to_string())?;
    let plain =
        ServerProcess::start(&binary, baseline.map_or(Variant::Plain, Variant::Layer)).await?;
    let layer = ServerProcess::start(&binary, Variant::Layer(store)).await?;
    let workloads: &[Workload] = match store {
        LayerStore::Memory | LayerStore::MemoryPrometheus => {
            &[Workload::FreshKeys, Workload::Replay]
        }
        LayerStore::Null | LayerStore::MemoryRoomy => &[Workload::FreshKeys],
    };
    let mut compares = Vec::new();
    for &workload in workloads {
        compares.push(compare(&plain, &layer, workload, connections, rounds, length).await?);
    }
    Ok(compares)
}

/// The comparison as a Markdown table, one row per workload.
pub fn markdown_table(compares: &[HttpCompare]) -> String {
    let us = |d: Option<Duration>| {
        d.map_or("?".to_owned(), |d| {
            format!("{:.1} µs", d.as_secs_f64() * 1e6)
        })
    };
    let mut table = String::from(
        "| workload | req/s without | req/s with | ratio | p99 without | p99 with | ratio | server CPU/req without | with |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for c in compares {
        table.push_str(&format!(
            "| {} | {:.0} | {:.0} | {:.2}x | {:.2} ms | {:.2} ms | {:.2}x | {} | {} |\n",
            c.workload.name(),
            c.plain_throughput,
            c.layer_throughput,
            c.throughput_ratio,
            c.plain_p99.as_secs_f64() * 1e3,
            c.layer_p99.as_secs_f64() * 1e3,
            c.p99_ratio,
            us(c.plain_cpu),
            us(c.layer_cpu),
        ));
    }
    table
}

/// Runs `rounds` rounds of each variant, interleaved (plain, layer, layer, plain, ...), each
/// `length` long at `connections` connections.
pub async fn compare(
    plain: &ServerProcess,
    layer: &ServerProcess,
    workload: Workload,
    connections: usize,
    rounds: usize,
    length: Duration,
) -> Result<HttpCompare, String> {
    let mut pairs = Vec::with_capacity(rounds);
    for r in 0..rounds {
        // Alternate which goes first, so neither always runs on a warmer or colder machine.
        let (p, l) = if r % 2 == 0 {
            let p = round(plain, workload, connections, length).await?;
            (p, round(layer, workload, connections, length).await?)
        } else {
            let l = round(layer, workload, connections, length).await?;
            (round(plain, workload, connections, length).await?, l)
        };
        pairs.push((p, l));
    }
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let cpu = |pick: fn(&(Round, Round)) -> Option<Duration>| {
        let values: Option<Vec<f64>> = pairs.iter().map(|pair| pick(pair).map(us)).collect();
        values.map(|mut v| Duration::from_secs_f64(median(&mut v) / 1e6))
    };
    Ok(HttpCompare {
        workload,
        connections,
        rounds,
        plain_throughput: median(&mut pairs.iter().map(|(p, _)| p.throughput).collect::<Vec<_>>()),
        layer_throughput: median(&mut pairs.iter().map(|(_, l)| l.throughput).collect::<Vec<_>>()),
        throughput_ratio: median(
            &mut pairs
                .iter()
                .map(|(p, l)| l.throughput / p.throughput)
                .collect::<Vec<_>>(),
        ),
        plain_p99: Duration::from_secs_f64(
            median(&mut pairs.iter().map(|(p, _)| us(p.p99)).collect::<Vec<_>>()) / 1e6,
        ),
        layer_p99: Duration::from_secs_f64(
            median(&mut pairs.iter().map(|(_, l)| us(l.p99)).collect::<Vec<_>>()) / 1e6,
        ),
        p99_ratio: median(
            &mut pairs
                .iter()
                .map(|(p, l)| us(l.p99) / us(p.p99))
                .collect::<Vec<_>>(),
        ),
        plain_cpu: cpu(|(p, _)| p.cpu_per_request),
        layer_cpu: cpu(|(_, l)| l.cpu_per_request),
    })
}
