//! What the person on call scrapes and probes, on the demo's real endpoints (a child process):
//! `/metrics` shows the library's series after one request, `/health/live` never touches the
//! store, and `/health/ready` turns not-ready within seconds of the store going away and ready
//! again after it returns.
#![allow(clippy::unwrap_used)]

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::StatusCode;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use idempotency_e2e::DemoProcess;
use idempotency_testkit::TempPostgres;
use std::net::SocketAddr;
use std::time::Duration;

type HttpClient = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// `GET path`: its status and body, or `None` when it did not answer within 5 s.
async fn get(client: &HttpClient, addr: SocketAddr, path: &str) -> Option<(StatusCode, String)> {
    let request = hyper::Request::get(format!("http://{addr}{path}"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    tokio::time::timeout(Duration::from_secs(5), async {
        let response = client.request(request).await.ok()?;
        let (parts, body) = response.into_parts();
        let body = body.collect().await.ok()?.to_bytes();
        Some((parts.status, String::from_utf8_lossy(&body).into_owned()))
    })
    .await
    .ok()
    .flatten()
}

async fn create_task(client: &HttpClient, addr: SocketAddr) -> StatusCode {
    let request = hyper::Request::post(format!("http://{addr}/tasks"))
        .header("authorization", format!("Bearer {}", uuid::Uuid::new_v4()))
        .header("idempotency-key", uuid::Uuid::new_v4().to_string())
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(br#"{"title":"scraped"}"#)))
        .unwrap();
    client.request(request).await.unwrap().status()
}

/// The value of the series `name{labels}` (labels in the exporter's order), if exported.
fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().find_map(|line| {
        let (name, value) = line.rsplit_once(' ')?;
        (name == series).then(|| value.parse().ok())?
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_show_the_library_series_after_one_request() {
    let demo = DemoProcess::start(env!("CARGO_BIN_EXE_demo-server"), &[], &[]).await;
    let client = client();
    assert_eq!(create_task(&client, demo.addr()).await, StatusCode::CREATED);
    let (status, metrics) = get(&client, demo.addr(), "/metrics").await.unwrap();
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        sample(
            &metrics,
            r#"idempotency_requests_total{outcome="executed",route="/tasks"}"#
        ),
        Some(1.0),
        "{metrics}"
    );
    assert_eq!(
        sample(
            &metrics,
            r#"idempotency_completions_total{result="stored"}"#
        ),
        Some(1.0),
        "{metrics}"
    );
    // Nothing held in flight once the request is answered, in the series of the demo's one
    // engine; the store's footprint is read at the scrape: the one record the request stored.
    assert_eq!(
        sample(&metrics, r#"idempotency_keys_in_flight{engine="memory-1"}"#),
        Some(0.0),
        "{metrics}"
    );
    assert_eq!(
        sample(
            &metrics,
            r#"idempotency_oldest_key_in_flight_start_timestamp_seconds{engine="memory-1"}"#
        ),
        Some(0.0),
        "{metrics}"
    );
    // What the store holds, as its last check saw it (every 5 s in the background: a scrape
    // never waits on the store).
    let until = std::time::Instant::now() + Duration::from_secs(10);
    let metrics = loop {
        let (_, metrics) = get(&client, demo.addr(), "/metrics").await.unwrap();
        let records = sample(&metrics, r#"idempotency_store_records{backend="memory"}"#);
        if records == Some(1.0) || std::time::Instant::now() > until {
            break metrics;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(
        sample(&metrics, r#"idempotency_store_records{backend="memory"}"#),
        Some(1.0),
        "{metrics}"
    );
    assert!(
        sample(&metrics, r#"idempotency_store_bytes{backend="memory"}"#).is_some_and(|b| b > 0.0),
        "{metrics}"
    );
    // The store-latency histogram has the library's buckets, not the exporter's summary.
    for op in ["claim", "complete"] {
        let buckets: Vec<&str> = metrics
            .lines()
            .filter(|line| {
                line.starts_with("idempotency_store_duration_seconds_bucket{")
                    && line.contains(&format!(r#"op="{op}""#))
            })
            .collect();
        assert_eq!(
            buckets.len(),
            idempotency::monitoring::STORE_DURATION_BUCKETS.len() + 1,
            "{op}: one line per bucket and +Inf: {metrics}"
        );
        assert!(
            buckets.iter().any(|line| line.contains(r#"le="0.0005""#)),
            "{op}: {buckets:?}"
        );
    }
    let (status, body) = get(&client, demo.addr(), "/health/live").await.unwrap();
    assert_eq!((status, body.as_str()), (StatusCode::OK, "live\n"));
    let (status, body) = get(&client, demo.addr(), "/health/ready").await.unwrap();
    assert_eq!((status, body.as_str()), (StatusCode::OK, "ready\n"));
}

/// A throwaway PostgreSQL server and the demo on it.
async fn demo_on_postgres() -> (TempPostgres, DemoProcess) {
    let pg = TempPostgres::start(&[]).unwrap();
    let url = pg.url("postgres");
    let demo = DemoProcess::start(
        env!("CARGO_BIN_EXE_demo-server"),
        &["--store", url.as_str()],
        &[],
    )
    .await;
    (pg, demo)
}

/// Polls `/health/ready` every 100 ms until it answers `want`; how long that took, or `None`
/// after `within`.
async fn ready_becomes(
    client: &HttpClient,
    addr: SocketAddr,
    want: StatusCode,
    within: Duration,
) -> Option<(Duration, String)> {
    let started = tokio::time::Instant::now();
    while started.elapsed() < within {
        if let Some((status, body)) = get(client, addr, "/health/ready").await
            && status == want
        {
            return Some((started.elapsed(), body));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_follows_the_store_and_liveness_does_not() {
    let (pg, demo) = demo_on_postgres().await;
    let client = client();
    let (status, body) = get(&client, demo.addr(), "/health/ready").await.unwrap();
    assert_eq!((status, body.as_str()), (StatusCode::OK, "ready\n"));

    pg.stop().unwrap();
    let (after, body) = ready_becomes(
        &client,
        demo.addr(),
        StatusCode::SERVICE_UNAVAILABLE,
        Duration::from_secs(10),
    )
    .await
    .expect("not-ready within 10 s of the store going away");
    // The kind of failure only: the store's words (roles, schemas, tables) stay in the log.
    assert_eq!(
        body, "not ready: the idempotency store cannot be reached\n",
        "{body}"
    );
    let (status, _) = get(&client, demo.addr(), "/health/live").await.unwrap();
    assert_eq!(
        status,
        StatusCode::OK,
        "liveness does not depend on the store"
    );
    eprintln!("not ready {after:?} after the store stopped: {body}");

    pg.start_server().unwrap();
    let (after, _) = ready_becomes(
        &client,
        demo.addr(),
        StatusCode::OK,
        Duration::from_secs(20),
    )
    .await
    .expect("ready again within 20 s of the store's return");
    eprintln!("ready again {after:?} after the store restarted");
    assert_eq!(create_task(&client, demo.addr()).await, StatusCode::CREATED);
}

/// A file of the repository's `ops/` folder (the shipped rules and dashboard).
fn ops_file(path: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../ops")
        .join(path)
}

/// Runs `promtool` with `args`; panics with its output when it fails.
fn promtool(args: &[&std::ffi::OsStr]) {
    let output = std::process::Command::new("promtool")
        .args(args)
        .output()
        .unwrap_or_else(|error| {
            panic!(
                "promtool could not run ({error}): install Debian's `prometheus` package \
                 (`scripts/services.sh --install` does)"
            )
        });
    assert!(
        output.status.success(),
        "promtool {args:?} failed:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The dashboard's queries, with its `$job` variable as a regex matching every job.
fn dashboard_queries() -> Vec<String> {
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(ops_file("grafana/idempotency.json")).unwrap(),
    )
    .unwrap();
    let mut queries = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            queries.push(target["expr"].as_str().unwrap().replace("$job", ".*"));
        }
    }
    queries
}

#[test]
fn the_shipped_rules_pass_their_promtool_tests() {
    let tests = ops_file("prometheus/idempotency.rules.test.yml");
    promtool(&["test".as_ref(), "rules".as_ref(), tests.as_os_str()]);
}

/// Every query of the dashboard is valid PromQL: each becomes a recording rule of a throwaway
/// rules file, which `promtool check rules` parses.
#[test]
fn the_dashboard_s_queries_are_valid_promql() {
    let queries = dashboard_queries();
    assert!(queries.len() >= 9, "{queries:?}");
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, query) in queries.iter().enumerate() {
        rules.push_str(&format!(
            "      - record: dashboard:query{i}\n        expr: {}\n",
            serde_json::Value::String(query.clone())
        ));
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("dashboard.rules.yml");
    std::fs::write(&file, rules).unwrap();
    promtool(&["check".as_ref(), "rules".as_ref(), file.as_os_str()]);
}

/// The metric names a rules file or a dashboard names: `idempotency_...` words (recording
/// rules' own names, `idempotency:...`, are not metrics).
fn metric_names(text: &str) -> std::collections::BTreeSet<String> {
    let mut names = std::collections::BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("idempotency_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        // Only a whole word: not the end of another name.
        let whole = at == 0 || !rest.as_bytes()[at - 1].is_ascii_alphanumeric();
        if whole {
            names.insert(tail[..end].to_owned());
        }
        rest = &tail[end..];
    }
    names
}

/// Every series the shipped rules and the dashboard name is exported by the demo after a short
/// run, on the PostgreSQL store (state-loss and purge series included), so renaming a metric
/// breaks this test rather than the alerts and the panels.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_series_the_rules_and_the_dashboard_name_is_exported_by_the_demo() {
    let rules = std::fs::read_to_string(ops_file("prometheus/idempotency.rules.yml")).unwrap();
    let mut named = metric_names(&rules);
    assert!(named.len() >= 6, "{named:?}");
    let from_dashboard = metric_names(&dashboard_queries().join("\n"));
    assert!(from_dashboard.len() >= 6, "{from_dashboard:?}");
    named.extend(from_dashboard);
    let (_pg, demo) = demo_on_postgres().await;
    let client = client();
    assert_eq!(create_task(&client, demo.addr()).await, StatusCode::CREATED);
    let (status, metrics) = get(&client, demo.addr(), "/metrics").await.unwrap();
    assert_eq!(status, StatusCode::OK);
    let exported: std::collections::BTreeSet<&str> = metrics
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| line.split(['{', ' ']).next())
        .collect();
    let missing: Vec<&String> = named
        .iter()
        .filter(|name| !exported.contains(name.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "the rules or the dashboard name series the demo does not export: {missing:?}\n\
         exported: {exported:?}"
    );
}

/// A scrape is answered from memory while the database is frozen (issue 46 item 5): before,
/// each scrape waited up to 2 s on the database for the store's footprint, so with a 1 s scrape
/// every scrape failed for the whole freeze and the in-flight gauges went blank exactly while
/// keys were held. Now the store is checked in the background, and `idempotency_store_up` says
/// it is down; the pool's gauges are read from memory at each scrape.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scrape_is_answered_from_memory_while_the_database_is_frozen() {
    let (pg, demo) = demo_on_postgres().await;
    let client = client();
    assert_eq!(create_task(&client, demo.addr()).await, StatusCode::CREATED);
    let (_, metrics) = get(&client, demo.addr(), "/metrics").await.unwrap();
    assert_eq!(
        sample(&metrics, r#"idempotency_store_up{backend="postgres"}"#),
        Some(1.0),
        "{metrics}"
    );
    assert!(
        sample(
            &metrics,
            r#"idempotency_store_pool_max_connections{backend="postgres"}"#
        )
        .is_some_and(|max| max >= 1.0),
        "{metrics}"
    );
    pg.freeze().unwrap();
    let mut slowest = Duration::ZERO;
    let mut down_after = None;
    let frozen = std::time::Instant::now();
    while frozen.elapsed() < Duration::from_secs(15) {
        let started = std::time::Instant::now();
        let answer = get(&client, demo.addr(), "/metrics").await;
        slowest = slowest.max(started.elapsed());
        let (status, metrics) = answer.expect("a scrape during the freeze is answered");
        assert_eq!(status, StatusCode::OK);
        if sample(&metrics, r#"idempotency_store_up{backend="postgres"}"#) == Some(0.0) {
            down_after = Some(frozen.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    pg.thaw().unwrap();
    eprintln!("slowest scrape during the freeze: {slowest:?}; store down after {down_after:?}");
    assert!(
        down_after.is_some(),
        "idempotency_store_up never read 0 during a 15 s freeze"
    );
    // Loose on a shared machine: the point is that no scrape waits on the database (2 s before).
    assert!(
        slowest < Duration::from_millis(500),
        "a scrape waited {slowest:?} during the freeze"
    );
}
