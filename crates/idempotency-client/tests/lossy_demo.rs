//! The client against the real demo service (memory store) through a proxy that loses
//! requests and answers: every call ends with one final answer, each task is created once, and
//! calls whose answer was lost get the replay of their first run.
#![allow(clippy::unwrap_used)]

use idempotency_client::{Attempts, IdempotentRetry};
use idempotency_orders_demo::proxy::LossyProxy;
use std::time::Duration;
use tokio::net::TcpListener;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_call_through_a_lossy_proxy_ends_once_with_one_answer() {
    let app = idempotency_demo::build_app("memory").await.unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let demo = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let lossy = LossyProxy::start(demo).await.unwrap();
    let proxy = lossy.address();

    // One connection per attempt, so the proxy's turn decides each attempt's fate.
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let client = reqwest_middleware::ClientBuilder::new(http)
        .with(
            IdempotentRetry::builder()
                .max_attempts(6)
                .backoff(Duration::from_millis(1), Duration::from_millis(10))
                .build(),
        )
        .build();
    let user = uuid::Uuid::new_v4().to_string();
    const CALLS: usize = 30;
    let mut replays = 0;
    let mut ids = Vec::new();
    for call in 0..CALLS {
        let response = client
            .post(format!("http://{proxy}/tasks"))
            .header("authorization", format!("Bearer {user}"))
            .header("content-type", "application/json")
            .body(format!(r#"{{"title":"task {call}"}}"#))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 201, "call {call} ends created");
        let attempts = response.extensions().get::<Attempts>().unwrap().clone();
        replays += usize::from(attempts.replayed);
        let task: serde_json::Value = response.json().await.unwrap();
        assert_eq!(task["title"], format!("task {call}"));
        ids.push(task["id"].as_str().unwrap().to_owned());
    }
    let losses = lossy.losses();
    assert!(losses.requests_dropped > 0, "{losses:?}");
    assert!(losses.answers_dropped > 0, "{losses:?}");
    assert!(replays > 0, "lost answers were replayed, not run again");

    // What the service holds, asked directly: one task per call, the ones the calls got.
    let listed: Vec<serde_json::Value> = reqwest::Client::new()
        .get(format!("http://{demo}/tasks"))
        .header("authorization", format!("Bearer {user}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(listed.len(), CALLS, "each call created exactly one task");
    let mut listed: Vec<String> = listed
        .iter()
        .map(|task| task["id"].as_str().unwrap().to_owned())
        .collect();
    listed.sort();
    ids.sort();
    assert_eq!(listed, ids, "every caller got the task that was created");
}
