//! End-to-end scenarios: HTTP requests through the real layer into real handlers that count
//! their side effects, on each store against its real server. `tests/e2e.rs` runs every scenario
//! per store.
#![allow(clippy::unwrap_used)]

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, Method, Request, StatusCode, header};
use axum::routing::post;
use bytes::Bytes;
use http_body_util::BodyExt;
use idempotency::{
    IdempotencyLayer, IdempotencyLayerBuilder, IdempotencyStore, MemoryStore, PostgresStore,
    RedisStore, ScopeSet,
};
use idempotency_testkit::env::{postgres_url, redis_url, server_unreachable};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tower::ServiceExt;

/// Which store a scenario runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// In-process moka.
    Memory,
    /// The shared PostgreSQL server, a fresh schema per scenario.
    Postgres,
    /// The shared Redis server, a fresh key prefix per scenario.
    Redis,
}

/// A fresh place in a backend: stores made from one namespace share records (except memory,
/// where every store is its own process-local map, as in production).
#[derive(Debug)]
pub struct Namespace {
    backend: Backend,
    name: String,
}

impl Namespace {
    /// A new random namespace.
    pub fn new(backend: Backend) -> Self {
        Namespace {
            backend,
            name: format!("idem_e2e_{}", uuid::Uuid::new_v4().simple()),
        }
    }

    /// A new store instance (its own pool or connection) on this namespace.
    pub async fn store(&self) -> Arc<dyn IdempotencyStore> {
        match self.backend {
            Backend::Memory => Arc::new(MemoryStore::default()),
            Backend::Postgres => {
                let url = postgres_url();
                let store = PostgresStore::builder(&url)
                    .schema(&self.name)
                    .pool_size(16)
                    .build()
                    .await
                    .unwrap_or_else(|e| server_unreachable("PostgreSQL", &url, &e));
                store.migrate().await.unwrap();
                Arc::new(store)
            }
            Backend::Redis => {
                let url = redis_url();
                Arc::new(
                    RedisStore::builder(&url)
                        .key_prefix(format!("{}:", self.name))
                        .build()
                        .await
                        .unwrap_or_else(|e| server_unreachable("Redis", &url, &e)),
                )
            }
        }
    }

    /// Removes what the namespace left on the server (the Postgres schema; Redis keys expire).
    pub async fn cleanup(self) {
        if self.backend == Backend::Postgres {
            idempotency_testkit::drop_test_schema(&self.name).await;
        }
    }
}

/// How many times each handler's side effect ran.
#[derive(Clone, Debug, Default)]
pub struct Runs {
    /// POST /orders
    pub orders: Arc<AtomicUsize>,
    /// POST /flaky (503 on its first run)
    pub flaky: Arc<AtomicUsize>,
    /// POST /panics (panics on its first run)
    pub panics: Arc<AtomicUsize>,
    /// POST /slow (takes 300 ms)
    pub slow: Arc<AtomicUsize>,
    /// POST /slow-first (its first run takes 2 s, later runs are fast)
    pub slow_first: Arc<AtomicUsize>,
}

/// The user id the test puts where an authentication layer would.
#[derive(Clone, Copy, Debug)]
pub struct User(pub uuid::Uuid);

impl From<User> for idempotency::Scope {
    fn from(user: User) -> Self {
        idempotency::Scope::from(user.0)
    }
}

/// The layer builder, scope chosen, for [`counting_app_with`].
pub type Builder = IdempotencyLayerBuilder<Arc<dyn IdempotencyStore>, ScopeSet>;

/// An app whose handlers count their side effects in `runs`, with the layer's defaults.
pub fn counting_app(store: Arc<dyn IdempotencyStore>, runs: &Runs) -> Router {
    counting_app_with(store, runs, |b| b)
}

/// An app whose handlers count their side effects in `runs`, with the layer configured by
/// `configure`.
pub fn counting_app_with(
    store: Arc<dyn IdempotencyStore>,
    runs: &Runs,
    configure: impl FnOnce(Builder) -> Builder,
) -> Router {
    let layer = configure(IdempotencyLayer::builder(store).scope_from_extension::<User>()).build();
    let orders = runs.orders.clone();
    let flaky = runs.flaky.clone();
    let panics = runs.panics.clone();
    let slow = runs.slow.clone();
    let slow_first = runs.slow_first.clone();
    Router::new()
        .route(
            "/slow-first",
            post(move || {
                let slow_first = slow_first.clone();
                async move {
                    let n = slow_first.fetch_add(1, Ordering::SeqCst) + 1;
                    if n == 1 {
                        tokio::time::sleep(Duration::from_millis(2000)).await;
                    }
                    (StatusCode::CREATED, format!("run {n}"))
                }
            }),
        )
        .route(
            "/orders",
            post(move |body: Bytes| {
                let orders = orders.clone();
                async move {
                    // Widen the window in which duplicates arrive while the first one runs.
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    let n = orders.fetch_add(1, Ordering::SeqCst) + 1;
                    let mut response = axum::response::Response::new(Body::from(format!(
                        "{{\"order\":{n},\"request\":{}}}",
                        String::from_utf8_lossy(&body)
                    )));
                    *response.status_mut() = StatusCode::CREATED;
                    let headers = response.headers_mut();
                    headers.insert(
                        header::CONTENT_TYPE,
                        HeaderValue::from_static("application/json"),
                    );
                    headers.insert(
                        header::LOCATION,
                        HeaderValue::from_str(&format!("/orders/{n}")).unwrap(),
                    );
                    response
                }
            }),
        )
        .route(
            "/flaky",
            post(move || {
                let flaky = flaky.clone();
                async move {
                    if flaky.fetch_add(1, Ordering::SeqCst) == 0 {
                        (StatusCode::SERVICE_UNAVAILABLE, "down")
                    } else {
                        (StatusCode::CREATED, "up")
                    }
                }
            }),
        )
        .route(
            "/panics",
            post(move || {
                let panics = panics.clone();
                async move {
                    if panics.fetch_add(1, Ordering::SeqCst) == 0 {
                        panic!("the first run panics");
                    }
                    (StatusCode::CREATED, "second run")
                }
            }),
        )
        .route(
            "/slow",
            post(move || {
                let slow = slow.clone();
                async move {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    slow.fetch_add(1, Ordering::SeqCst);
                    (StatusCode::CREATED, "slow done")
                }
            }),
        )
        .layer(layer)
}

/// A request as a client sends it.
pub fn request(path: &str, key: &str, user: User, body: &str) -> Request<Body> {
    let mut request = Request::builder()
        .method(Method::POST)
        .uri(path)
        .header("idempotency-key", key)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_owned()))
        .unwrap();
    request.extensions_mut().insert(user);
    request
}

/// The demo's `POST /tasks` for `user` (a Bearer UUID) with idempotency key `key`, whose task is
/// titled with the key (so tasks can be counted per key).
pub fn create_task(user: &str, key: &str) -> Request<Body> {
    Request::builder()
        .method(Method::POST)
        .uri("/tasks")
        .header(header::AUTHORIZATION, format!("Bearer {user}"))
        .header("idempotency-key", key)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(format!(r#"{{"title":"{key}"}}"#)))
        .unwrap()
}

/// Sends a request and reads the whole response.
pub async fn send(app: &Router, request: Request<Body>) -> (StatusCode, HeaderMap, Bytes) {
    let response = app.clone().oneshot(request).await.unwrap();
    let (parts, body) = response.into_parts();
    (
        parts.status,
        parts.headers,
        body.collect().await.unwrap().to_bytes(),
    )
}

/// What a persistent client saw while sending one logical request until it succeeded.
#[derive(Debug, Default)]
pub struct Attempts {
    /// Every status received, in order.
    pub statuses: Vec<StatusCode>,
    /// Whether every 503 and 409 carried `Retry-After`.
    pub retry_after_always_present: bool,
    /// The longest single response time.
    pub slowest: Duration,
    /// The final 2xx body, if one came.
    pub body: Option<Bytes>,
}

/// Sends `make()` until a 2xx arrives or `deadline` passes, like a client that retries 503 and
/// 409 (after a short pause) and never retries once it has its answer. Each send is bounded by
/// `per_request`; a send that takes longer fails the test.
pub async fn send_until_done(
    app: &Router,
    make: impl Fn() -> Request<Body>,
    deadline: Duration,
    per_request: Duration,
) -> Attempts {
    let until = tokio::time::Instant::now() + deadline;
    let mut attempts = Attempts {
        retry_after_always_present: true,
        ..Attempts::default()
    };
    while tokio::time::Instant::now() < until {
        let started = tokio::time::Instant::now();
        let (status, headers, body) = tokio::time::timeout(per_request, send(app, make()))
            .await
            .unwrap_or_else(|_| panic!("a request hung for more than {per_request:?}"));
        attempts.slowest = attempts.slowest.max(started.elapsed());
        attempts.statuses.push(status);
        if status.is_success() {
            attempts.body = Some(body);
            break;
        }
        if matches!(
            status,
            StatusCode::SERVICE_UNAVAILABLE | StatusCode::CONFLICT
        ) {
            attempts.retry_after_always_present &= headers.contains_key(header::RETRY_AFTER);
            tokio::time::sleep(Duration::from_millis(100)).await;
        } else {
            panic!(
                "unexpected status {status}: {}",
                String::from_utf8_lossy(&body)
            );
        }
    }
    attempts
}

/// A fresh UUID v4 key.
pub fn key() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// A fresh user.
pub fn user() -> User {
    User(uuid::Uuid::new_v4())
}

/// The demo service as a child process, listening on a free loopback port.
#[derive(Debug)]
pub struct DemoProcess {
    child: tokio::process::Child,
    addr: std::net::SocketAddr,
}

impl DemoProcess {
    /// Starts `binary` (the test crate's `demo-server`, from `env!("CARGO_BIN_EXE_demo-server")`)
    /// with `--listen 127.0.0.1:0` and `args`, and `envs` in its environment; waits until it
    /// says where it listens.
    pub async fn start(binary: &str, args: &[&str], envs: &[(&str, &str)]) -> DemoProcess {
        use std::process::Stdio;
        use tokio::io::{AsyncBufReadExt, BufReader};
        let mut child = tokio::process::Command::new(binary)
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .envs(envs.iter().copied())
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let addr = tokio::time::timeout(Duration::from_secs(30), async {
            while let Some(line) = lines.next_line().await.unwrap() {
                if let Some((_, rest)) = line.split_once("listening on http://") {
                    let addr = rest.split_whitespace().next().unwrap();
                    return addr.parse::<std::net::SocketAddr>().unwrap();
                }
            }
            panic!("the demo exited before listening");
        })
        .await
        .expect("the demo did not start listening within 30 s");
        // Keep draining its output so it never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        DemoProcess { child, addr }
    }

    /// Where it listens.
    pub fn addr(&self) -> std::net::SocketAddr {
        self.addr
    }

    /// SIGKILL: no shutdown, no completion, no release.
    pub async fn kill(mut self) {
        self.child.kill().await.unwrap();
    }

    /// SIGTERM, then waits up to `within` for the process to exit on its own; its exit status.
    pub async fn terminate(mut self, within: Duration) -> std::process::ExitStatus {
        let pid = self
            .child
            .id()
            .expect("the demo is still running")
            .to_string();
        let sent = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap();
        assert!(sent.success(), "kill -TERM {pid} failed");
        tokio::time::timeout(within, self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("the demo did not exit within {within:?} of SIGTERM"))
            .unwrap()
    }
}

/// A database of its own on the shared PostgreSQL server (the one `IDEMPOTENCY_TEST_POSTGRES_URL`
/// names), for tests that run the demo as a child process; dropped with
/// [`TestDatabase::drop`].
#[derive(Debug)]
pub struct TestDatabase {
    name: String,
    url: String,
}

impl TestDatabase {
    /// Creates `<prefix>_<random>`.
    pub async fn create(prefix: &str) -> TestDatabase {
        let admin = postgres_url();
        let name = format!("{prefix}_{}", uuid::Uuid::new_v4().simple());
        connect_postgres(&admin)
            .await
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .unwrap();
        let url = match admin.rsplit_once('/') {
            Some((server, _)) => format!("{server}/{name}"),
            None => panic!("IDEMPOTENCY_TEST_POSTGRES_URL must name a database: {admin}"),
        };
        TestDatabase { name, url }
    }

    /// Its URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// A new connection to it.
    pub async fn connect(&self) -> idempotency::postgres::tokio_postgres::Client {
        connect_postgres(&self.url).await
    }

    /// Drops it, closing the connections still open to it.
    pub async fn drop(self) {
        connect_postgres(&postgres_url())
            .await
            .batch_execute(&format!("DROP DATABASE {} WITH (FORCE)", self.name))
            .await
            .unwrap();
    }
}

/// A connection to `url`; a test fails with how to start the server when it is unreachable.
pub async fn connect_postgres(url: &str) -> idempotency::postgres::tokio_postgres::Client {
    use idempotency::postgres::tokio_postgres;
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| server_unreachable("PostgreSQL", url, &e));
    tokio::spawn(connection);
    client
}

/// Over real HTTP to the demo at `addr`: creates a task with a fresh key, sends it again, and lists the user's tasks: 201, a replayed
/// 201 with the same body, and one task.
pub async fn create_replay_list(addr: std::net::SocketAddr) {
    use http_body_util::Full;
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let user = uuid::Uuid::new_v4().to_string();
    let key = uuid::Uuid::new_v4().to_string();
    let send = |method: Method, path: &str, key: Option<&str>| {
        let mut builder = hyper::Request::builder()
            .method(method)
            .uri(format!("http://{addr}{path}"))
            .header("authorization", format!("Bearer {user}"))
            .header("content-type", "application/json");
        if let Some(key) = key {
            builder = builder.header("idempotency-key", key);
        }
        let request = builder
            .body(Full::new(Bytes::from_static(br#"{"title":"over TLS"}"#)))
            .unwrap();
        let client = client.clone();
        async move {
            let response = client.request(request).await.unwrap();
            let (parts, body) = response.into_parts();
            (parts, body.collect().await.unwrap().to_bytes())
        }
    };
    let (first, first_body) = send(Method::POST, "/tasks", Some(&key)).await;
    assert_eq!(first.status, StatusCode::CREATED, "{first_body:?}");
    let (replay, replay_body) = send(Method::POST, "/tasks", Some(&key)).await;
    assert_eq!(replay.status, StatusCode::CREATED);
    assert_eq!(replay.headers.get("idempotent-replayed").unwrap(), "true");
    assert_eq!(replay_body, first_body);
    let (list, body) = send(Method::GET, "/tasks", None).await;
    assert_eq!(list.status, StatusCode::OK);
    let tasks: Vec<serde_json::Value> = serde_json::from_slice(&body).unwrap();
    assert_eq!(tasks.len(), 1);
}

/// A PostgreSQL store on a LOGGED key table in a schema of its own (dropped with the returned
/// [`TestSchema`](idempotency_testkit::TestSchema)), migrated; fails with how to start the
/// server when it cannot be reached.
pub async fn migrated_postgres_store(
    schema_prefix: &str,
) -> (PostgresStore, idempotency_testkit::TestSchema) {
    let schema = idempotency_testkit::TestSchema::new(schema_prefix);
    let url = schema.url();
    let store = PostgresStore::builder(url)
        .schema(schema.name())
        .table_mode(idempotency::TableMode::Logged)
        .build()
        .await
        .unwrap_or_else(|e| server_unreachable("PostgreSQL", url, &e));
    store.migrate().await.unwrap();
    (store, schema)
}
