//! A load generator for the demo service over real HTTP on loopback: a duplicate-heavy mix of
//! fresh requests, sequential retries and bursts of concurrent duplicates, then a count of the
//! tasks actually created.

use bytes::Bytes;
use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use idempotency::{PostgresStore, TableMode};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::Mutex;

/// What to run.
#[derive(Clone, Debug)]
pub struct LoadConfig {
    /// The demo's `--store` (`memory`, `postgres://...`, `redis://...`,
    /// `redis+cluster://...`).
    pub store: String,
    /// For PostgreSQL: the table mode. UNLOGGED uses the demo's table (`public`); the others get
    /// a schema of their own (`idem_load_<mode>`), beside it in the same database.
    pub table_mode: TableMode,
    /// Logical requests: distinct keys, each a task to create once.
    pub logical: usize,
    /// Clients working at once.
    pub concurrency: usize,
    /// Distinct users the keys are spread over.
    pub users: usize,
    /// Duplicates in a burst.
    pub burst: usize,
}

/// What happened.
#[derive(Debug, Default)]
pub struct LoadReport {
    /// HTTP requests sent.
    pub requests: usize,
    /// Requests that repeated an earlier key (retries and burst duplicates).
    pub duplicates: usize,
    /// Tasks that exist beyond one per logical request (must be 0).
    pub double_executions: i64,
    /// Logical requests that never got a 201.
    pub never_created: usize,
    /// Answers that the protocol does not allow (must be empty).
    pub unexpected: Vec<String>,
    /// Count of each status received.
    pub statuses: HashMap<u16, usize>,
    /// Latency percentiles in microseconds: p50, p99.
    pub p50_us: u64,
    /// 99th percentile latency in microseconds.
    pub p99_us: u64,
    /// Wall time of the run.
    pub elapsed: Duration,
}

type HttpClient = Client<HttpConnector, Full<Bytes>>;

struct Shared {
    client: HttpClient,
    addr: SocketAddr,
    histogram: Mutex<Histogram<u64>>,
    requests: AtomicUsize,
    duplicates: AtomicUsize,
    never_created: AtomicUsize,
    unexpected: Mutex<Vec<String>>,
    statuses: Mutex<HashMap<u16, usize>>,
}

impl Shared {
    async fn send(
        &self,
        method: Method,
        path: &str,
        user: &str,
        key: Option<&str>,
        body: &str,
    ) -> Result<(StatusCode, Bytes), String> {
        let mut builder = Request::builder()
            .method(method)
            .uri(format!("http://{}{path}", self.addr))
            .header("authorization", format!("Bearer {user}"))
            .header("content-type", "application/json");
        if let Some(key) = key {
            builder = builder.header("idempotency-key", key);
        }
        let request = builder
            .body(Full::new(Bytes::from(body.to_owned())))
            .map_err(|e| e.to_string())?;
        let started = Instant::now();
        let response = tokio::time::timeout(Duration::from_secs(30), self.client.request(request))
            .await
            .map_err(|_| "a request took over 30 s".to_owned())?
            .map_err(|e| e.to_string())?;
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        let micros = started.elapsed().as_micros().max(1) as u64;
        let _ = self.histogram.lock().await.record(micros.min(60_000_000));
        self.requests.fetch_add(1, Ordering::Relaxed);
        *self
            .statuses
            .lock()
            .await
            .entry(status.as_u16())
            .or_default() += 1;
        Ok((status, body))
    }

    async fn unexpected(&self, what: String) {
        self.unexpected.lock().await.push(what);
    }
}

/// One logical request: create a task once, whatever the client does.
async fn logical(shared: &Shared, i: usize, user: &str, burst: usize) -> Result<(), String> {
    let key = uuid::Uuid::new_v4().to_string();
    let body = format!(r#"{{"title":"task {i}"}}"#);
    let mut created: Option<Bytes> = None;
    match i % 10 {
        // Half: a fresh request, sent once.
        0..=4 => {
            let (status, bytes) = shared
                .send(Method::POST, "/tasks", user, Some(&key), &body)
                .await?;
            if status == StatusCode::CREATED {
                created = Some(bytes);
            } else {
                shared
                    .unexpected(format!("fresh request answered {status}"))
                    .await;
            }
        }
        // Three in ten: sent, then retried one or two times after the answer.
        5..=7 => {
            for attempt in 0..(1 + i % 2 + 1) {
                let (status, bytes) = shared
                    .send(Method::POST, "/tasks", user, Some(&key), &body)
                    .await?;
                if attempt > 0 {
                    shared.duplicates.fetch_add(1, Ordering::Relaxed);
                }
                match (status, &created) {
                    (StatusCode::CREATED, None) => created = Some(bytes),
                    (StatusCode::CREATED, Some(first)) if *first == bytes => {}
                    (status, _) => {
                        shared
                            .unexpected(format!(
                                "sequential retry answered {status} or other bytes"
                            ))
                            .await
                    }
                }
            }
        }
        // Two in ten: a burst of concurrent duplicates, then retried until one answer is final.
        _ => {
            let sends =
                (0..burst).map(|_| shared.send(Method::POST, "/tasks", user, Some(&key), &body));
            let answers = futures_util::future::join_all(sends).await;
            shared.duplicates.fetch_add(burst - 1, Ordering::Relaxed);
            for answer in answers {
                let (status, bytes) = answer?;
                match status {
                    StatusCode::CREATED => match &created {
                        None => created = Some(bytes),
                        Some(first) if *first == bytes => {}
                        Some(_) => {
                            shared
                                .unexpected("two different 201 bodies for one key".into())
                                .await
                        }
                    },
                    StatusCode::CONFLICT => {}
                    other => shared.unexpected(format!("burst answered {other}")).await,
                }
            }
            // Every duplicate got 409: the first may still be running; retry until it replays.
            let deadline = Instant::now() + Duration::from_secs(30);
            while created.is_none() && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(20)).await;
                let (status, bytes) = shared
                    .send(Method::POST, "/tasks", user, Some(&key), &body)
                    .await?;
                shared.duplicates.fetch_add(1, Ordering::Relaxed);
                match status {
                    StatusCode::CREATED => created = Some(bytes),
                    StatusCode::CONFLICT => {}
                    other => {
                        shared
                            .unexpected(format!("burst retry answered {other}"))
                            .await
                    }
                }
            }
        }
    }
    if created.is_none() {
        shared.never_created.fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}

/// Starts the demo on `config.store` on a free loopback port, runs the mix, counts the tasks.
pub async fn run(config: &LoadConfig) -> Result<LoadReport, String> {
    let app = if config.store.starts_with("postgres") && config.table_mode != TableMode::Unlogged {
        let store = PostgresStore::builder(&config.store)
            .schema(format!("idem_load_{}", config.table_mode.name()))
            .table_mode(config.table_mode)
            .pool_size(32)
            .build()
            .await
            .map_err(crate::err)?;
        store.migrate().await.map_err(crate::err)?;
        let tasks = idempotency_demo::tasks::TaskStore::postgres(store.pool().clone())
            .await
            .map_err(crate::err)?;
        idempotency_demo::router(Arc::new(store), tasks).map_err(|e| format!("{e:?}"))?
    } else {
        idempotency_demo::build_app(&config.store)
            .await
            .map_err(|e| format!("{e:?}"))?
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| e.to_string())?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let client: HttpClient = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(config.concurrency * config.burst)
        .build_http();
    let shared = Arc::new(Shared {
        client,
        addr,
        histogram: Mutex::new(
            Histogram::new_with_bounds(1, 60_000_000, 3).map_err(|e| e.to_string())?,
        ),
        requests: AtomicUsize::new(0),
        duplicates: AtomicUsize::new(0),
        never_created: AtomicUsize::new(0),
        unexpected: Mutex::new(Vec::new()),
        statuses: Mutex::new(HashMap::new()),
    });
    let users: Arc<Vec<String>> = Arc::new(
        (0..config.users)
            .map(|_| uuid::Uuid::new_v4().to_string())
            .collect(),
    );
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..config.concurrency {
        let (shared, users, next, config) =
            (shared.clone(), users.clone(), next.clone(), config.clone());
        workers.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= config.logical {
                    return Ok::<(), String>(());
                }
                logical(&shared, i, &users[i % users.len()], config.burst).await?;
            }
        }));
    }
    for w in workers {
        w.await.map_err(|e| e.to_string())??;
    }
    let elapsed = started.elapsed();
    let mut tasks = 0i64;
    for user in users.iter() {
        let (status, body) = shared.send(Method::GET, "/tasks", user, None, "").await?;
        if status != StatusCode::OK {
            return Err(format!("listing tasks answered {status}"));
        }
        let list: Vec<serde_json::Value> =
            serde_json::from_slice(&body).map_err(|e| e.to_string())?;
        tasks += list.len() as i64;
    }
    server.abort();
    let histogram = shared.histogram.lock().await;
    let never_created = shared.never_created.load(Ordering::Relaxed);
    Ok(LoadReport {
        requests: shared.requests.load(Ordering::Relaxed) - config.users,
        duplicates: shared.duplicates.load(Ordering::Relaxed),
        double_executions: tasks - (config.logical - never_created) as i64,
        never_created,
        unexpected: shared.unexpected.lock().await.clone(),
        statuses: shared.statuses.lock().await.clone(),
        p50_us: histogram.value_at_quantile(0.5),
        p99_us: histogram.value_at_quantile(0.99),
        elapsed,
    })
}
