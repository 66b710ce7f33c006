//! The counters and histogram the crate docs promise are emitted, with their labels: the route
//! label is the route axum matched (`/x/{id}`), never the concrete path.
#![allow(clippy::unwrap_used)]

use axum::http::StatusCode;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use std::collections::HashMap;
use tower::ServiceExt;

mod observed;

use observed::{app, request};

#[test]
fn outcomes_completions_and_store_latency_are_recorded() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let app = app();
            for (body, user, status) in [
                ("a", true, StatusCode::CREATED),              // executed, stored
                ("a", true, StatusCode::CREATED),              // replayed
                ("b", true, StatusCode::UNPROCESSABLE_ENTITY), // mismatch
                ("a", false, StatusCode::UNAUTHORIZED),        // scope missing
            ] {
                assert_eq!(
                    app.clone()
                        .oneshot(request(body, user))
                        .await
                        .unwrap()
                        .status(),
                    status
                );
            }
        });
    });
    let mut counters: HashMap<String, u64> = HashMap::new();
    let mut histograms = 0;
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let key = key.key();
        let labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        let name = format!("{}{{{}}}", key.name(), labels.join(","));
        match value {
            DebugValue::Counter(n) => {
                counters.insert(name, n);
            }
            DebugValue::Histogram(values) if key.name() == "idempotency_store_duration_seconds" => {
                histograms += values.len()
            }
            _ => {}
        }
    }
    for (name, expected) in [
        (
            "idempotency_requests_total{outcome=executed,route=/x/{id}}",
            1,
        ),
        (
            "idempotency_requests_total{outcome=replayed,route=/x/{id}}",
            1,
        ),
        (
            "idempotency_requests_total{outcome=mismatch,route=/x/{id}}",
            1,
        ),
        (
            "idempotency_requests_total{outcome=scope_missing,route=/x/{id}}",
            1,
        ),
        ("idempotency_completions_total{result=stored}", 1),
    ] {
        assert_eq!(
            counters.get(name),
            Some(&expected),
            "{name} in {counters:?}"
        );
    }
    // Three claims and one completion were timed.
    assert_eq!(histograms, 4, "store latency samples");
}
