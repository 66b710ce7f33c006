//! What a client sees when axum rejects its request before the handler runs (a missing
//! `Content-Type`: 415; malformed JSON: 400), and then sends the corrected request with the same
//! key. Before issue 27 item 4 the rejection was stored for the key's retention, so the
//! corrected retry got the old 415 back (or 422 "key reused", its body being another), and the
//! handler never ran. Now a response with a status axum's extractors reject with is stored only
//! when the handler marked it `Final`.
#![allow(clippy::unwrap_used)]

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::post;
use axum::{Extension, Json, Router};
use http_body_util::BodyExt;
use idempotency_memory::MemoryStore;
use idempotency_tower::{Final, IdempotencyLayer};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use tower::ServiceExt;

/// The app: `POST /tasks` takes JSON and creates a task (counted); `POST /validate` answers 422
/// to a title that is too long, marked `Final` when `?final=1` (after counting a side effect).
fn app(layer: IdempotencyLayer<MemoryStore>, runs: Arc<AtomicUsize>) -> Router {
    let create = {
        let runs = Arc::clone(&runs);
        move |Json(task): Json<serde_json::Value>| {
            let runs = Arc::clone(&runs);
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                (StatusCode::CREATED, Json(task))
            }
        }
    };
    let validate = move |uri: axum::http::Uri, Json(task): Json<serde_json::Value>| {
        let runs = Arc::clone(&runs);
        async move {
            let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
            let body = format!("refused at run {n}: {task}");
            if uri.query() == Some("final=1") {
                (StatusCode::UNPROCESSABLE_ENTITY, Extension(Final), body).into_response()
            } else {
                (StatusCode::UNPROCESSABLE_ENTITY, body).into_response()
            }
        }
    };
    Router::new()
        .route("/tasks", post(create))
        .route("/validate", post(validate))
        .layer(layer)
}

fn layer() -> IdempotencyLayer<MemoryStore> {
    IdempotencyLayer::builder(MemoryStore::default())
        .unscoped()
        .build()
        .expect("valid idempotency layer settings")
}

async fn send(
    app: &Router,
    path: &str,
    key: &str,
    content_type: Option<&str>,
    body: &str,
) -> (StatusCode, bool, String) {
    let mut request = Request::post(path).header("idempotency-key", key);
    if let Some(content_type) = content_type {
        request = request.header(header::CONTENT_TYPE, content_type);
    }
    let response = app
        .clone()
        .oneshot(request.body(Body::from(body.to_owned())).unwrap())
        .await
        .unwrap();
    let replayed = response.headers().contains_key("idempotent-replayed");
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        replayed,
        String::from_utf8_lossy(&bytes).into_owned(),
    )
}

const JSON: Option<&str> = Some("application/json");

#[tokio::test]
async fn a_missing_content_type_is_not_stored_and_the_corrected_retry_runs() {
    let runs = Arc::new(AtomicUsize::new(0));
    let app = app(layer(), Arc::clone(&runs));
    let key = "rejected-415";
    let (status, _, _) = send(&app, "/tasks", key, None, r#"{"title":"a"}"#).await;
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let (status, replayed, body) = send(&app, "/tasks", key, JSON, r#"{"title":"a"}"#).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert!(!replayed, "the corrected retry runs");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    // From now on the key is the task's: its retry replays.
    let (status, replayed, _) = send(&app, "/tasks", key, JSON, r#"{"title":"a"}"#).await;
    assert_eq!((status, replayed), (StatusCode::CREATED, true));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn malformed_json_is_not_stored_and_the_corrected_retry_runs() {
    let runs = Arc::new(AtomicUsize::new(0));
    let app = app(layer(), Arc::clone(&runs));
    let key = "rejected-400";
    let (status, _, _) = send(&app, "/tasks", key, JSON, r#"{"title":"#).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, replayed, body) = send(&app, "/tasks", key, JSON, r#"{"title":"b"}"#).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert!(!replayed);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_handler_s_own_422_is_stored_only_when_marked_final() {
    let runs = Arc::new(AtomicUsize::new(0));
    let app = app(layer(), Arc::clone(&runs));
    // Unmarked: not stored, the retry runs the handler again.
    let (status, _, _) = send(&app, "/validate", "unmarked", JSON, r#"{"t":1}"#).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    let (status, replayed, _) = send(&app, "/validate", "unmarked", JSON, r#"{"t":1}"#).await;
    assert_eq!(
        (status, replayed),
        (StatusCode::UNPROCESSABLE_ENTITY, false)
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    // Marked `Final`: stored, the retry replays it and the handler does not run again.
    let (_, _, first) = send(&app, "/validate?final=1", "marked", JSON, r#"{"t":1}"#).await;
    let (status, replayed, again) =
        send(&app, "/validate?final=1", "marked", JSON, r#"{"t":1}"#).await;
    assert_eq!((status, replayed), (StatusCode::UNPROCESSABLE_ENTITY, true));
    assert_eq!(first, again);
    assert_eq!(runs.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn an_empty_list_of_rejection_statuses_stores_them_as_before() {
    let runs = Arc::new(AtomicUsize::new(0));
    let layer = IdempotencyLayer::builder(MemoryStore::default())
        .unscoped()
        .rejection_statuses([])
        .build()
        .expect("valid idempotency layer settings");
    let app = app(layer, Arc::clone(&runs));
    let (status, _, _) = send(&app, "/tasks", "stored-415", None, r#"{"title":"a"}"#).await;
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let (status, replayed, _) = send(&app, "/tasks", "stored-415", None, r#"{"title":"a"}"#).await;
    assert_eq!(
        (status, replayed),
        (StatusCode::UNSUPPORTED_MEDIA_TYPE, true)
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

/// Sends `method path` with `key` and a JSON body; the status and whether it was a replay.
async fn send_method(app: &Router, method: &str, path: &str, key: &str) -> (StatusCode, bool) {
    let request = Request::builder()
        .method(method)
        .uri(path)
        .header("idempotency-key", key)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(r#"{"title":"a"}"#))
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let replayed = response.headers().contains_key("idempotent-replayed");
    (response.status(), replayed)
}

/// The router's own answers (405 for a method a route does not serve, 404 for a path no route
/// serves) come before any handler: never stored, so the client that fixes its method or path
/// runs with the same key instead of getting the 405 back (or 422, its request being another)
/// for a day.
#[tokio::test]
async fn the_router_s_405_and_404_are_not_stored() {
    let runs = Arc::new(AtomicUsize::new(0));
    // As the README layers it: the matched routes only.
    let routed = app(layer(), Arc::clone(&runs));
    let route_layered = Router::new()
        .route(
            "/tasks",
            post(|| async { (StatusCode::CREATED, "created") }),
        )
        .route_layer(layer());
    for (app, name) in [(&routed, "layer"), (&route_layered, "route_layer")] {
        let key = format!("wrong-method-{name}");
        for method in ["DELETE", "PATCH", "PUT"] {
            let (status, replayed) = send_method(app, method, "/tasks", &key).await;
            assert_eq!(
                (status, replayed),
                (StatusCode::METHOD_NOT_ALLOWED, false),
                "{name} {method}"
            );
        }
        let (status, replayed) = send_method(app, "POST", "/tasks", &key).await;
        assert_eq!(
            (status, replayed),
            (StatusCode::CREATED, false),
            "{name}: the fixed method runs"
        );
    }
    let key = "unknown-path";
    let (status, replayed) = send_method(&routed, "POST", "/taks", key).await;
    assert_eq!((status, replayed), (StatusCode::NOT_FOUND, false));
    let (status, replayed) = send_method(&routed, "POST", "/tasks", key).await;
    assert_eq!(
        (status, replayed),
        (StatusCode::CREATED, false),
        "the fixed path runs"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}
