//! The task API the HTTP comparison serves is what each variant says it is: the plain app and
//! every layer answer a fresh key with 201; the memory stores replay a repeated key, the null
//! store (which keeps nothing) runs it again. And `serve-tasks --layer` takes the name each
//! variant gives itself, which the comparison passes to it.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use idempotency_bench::http::{LayerStore, tasks_app};
use tower::ServiceExt;

#[test]
fn each_store_s_name_is_the_one_serve_tasks_takes() {
    use clap::ValueEnum;
    for store in LayerStore::value_variants() {
        assert_eq!(
            LayerStore::from_str(store.name(), false).as_ref(),
            Ok(store),
            "`--layer {}`",
            store.name()
        );
    }
}

/// POSTs a task with `key` and returns the status and whether the answer was a replay.
async fn post(app: &axum::Router, key: &str) -> (StatusCode, bool) {
    let request = Request::post("/tasks")
        .header("x-user", "alice")
        .header("idempotency-key", key)
        .header("content-type", "text/plain")
        .body(Body::from("write the report"))
        .expect("request");
    let response = app.clone().oneshot(request).await.expect("response");
    let replayed = response.headers().contains_key("idempotent-replayed");
    (response.status(), replayed)
}

#[tokio::test]
async fn each_variant_answers_fresh_keys_and_replays_as_it_says() {
    let key = "8e03978e-40d5-43e8-bc93-6894a57f9324";
    let plain = tasks_app(None);
    assert_eq!(post(&plain, key).await, (StatusCode::CREATED, false));
    assert_eq!(post(&plain, key).await, (StatusCode::CREATED, false));
    for (store, replays) in [
        (LayerStore::Memory, true),
        (LayerStore::MemoryRoomy, true),
        (LayerStore::Null, false),
    ] {
        let app = tasks_app(Some(store));
        assert_eq!(
            post(&app, key).await,
            (StatusCode::CREATED, false),
            "{}: first request",
            store.name()
        );
        assert_eq!(
            post(&app, key).await,
            (StatusCode::CREATED, replays),
            "{}: the same key again",
            store.name()
        );
    }
}
