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
    let pg = TempPostgres::start(&[]).unwrap();
    let url = pg.url("postgres");
    let demo = DemoProcess::start(
        env!("CARGO_BIN_EXE_demo-server"),
        &["--store", url.as_str()],
        &[],
    )
    .await;
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
    assert!(
        body.contains("the idempotency store is unavailable"),
        "{body}"
    );
    assert!(!body.contains("password"), "{body}");
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
