//! The demo service (the ADR's task API) on each store: create, replay, 422, per-user tasks,
//! and two demo instances sharing PostgreSQL behaving as one.
#![allow(clippy::unwrap_used)]

use axum::Router;
use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use bytes::Bytes;
use http_body_util::BodyExt;
use idempotency_testkit::env::{postgres_url, redis_url};
use tower::ServiceExt;

async fn call(
    app: &Router,
    method: Method,
    path: &str,
    user: &str,
    key: Option<&str>,
    body: &str,
) -> (StatusCode, axum::http::HeaderMap, Bytes) {
    let mut builder = Request::builder()
        .method(method)
        .uri(path)
        .header(header::AUTHORIZATION, format!("Bearer {user}"))
        .header(header::CONTENT_TYPE, "application/json");
    if let Some(key) = key {
        builder = builder.header("Idempotency-Key", key);
    }
    let response = app
        .clone()
        .oneshot(builder.body(Body::from(body.to_owned())).unwrap())
        .await
        .unwrap();
    let (parts, body) = response.into_parts();
    (
        parts.status,
        parts.headers,
        body.collect().await.unwrap().to_bytes(),
    )
}

fn json(bytes: &Bytes) -> serde_json::Value {
    serde_json::from_slice(bytes).unwrap()
}

async fn the_task_api_runs_each_write_once(store_url: &str) {
    let app = idempotency_demo::build_app(store_url).await.unwrap();
    let user = uuid::Uuid::new_v4().to_string();
    let key = uuid::Uuid::new_v4().to_string();

    let (status, headers, body) = call(
        &app,
        Method::POST,
        "/tasks",
        &user,
        Some(&key),
        r#"{"title":"Buy milk"}"#,
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    let task = json(&body);
    assert_eq!(task["title"], "Buy milk");
    assert_eq!(task["done"], false);
    let location = headers
        .get(header::LOCATION)
        .unwrap()
        .to_str()
        .unwrap()
        .to_owned();
    assert_eq!(location, format!("/tasks/{}", task["id"].as_str().unwrap()));

    let (status, headers, replay) = call(
        &app,
        Method::POST,
        "/tasks",
        &user,
        Some(&key),
        r#"{"title":"Buy milk"}"#,
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(replay, body);
    assert_eq!(headers.get("idempotent-replayed").unwrap(), "true");
    for name in ["idempotency-original-date", "idempotency-key-expires"] {
        let value = headers.get(name).unwrap().to_str().unwrap();
        assert!(httpdate::parse_http_date(value).is_ok(), "{name}: {value}");
    }

    // The caller asks what became of its key, and learns the status, never the body; another
    // caller asking for the same key learns what it would of a key nobody used.
    let (status, _, answer) = call(
        &app,
        Method::GET,
        "/idempotency-status",
        &user,
        Some(&key),
        "",
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let answer = json(&answer);
    assert_eq!(answer["state"], "completed", "{answer}");
    assert_eq!(answer["status"], 201);
    assert!(answer.get("title").is_none() && !answer.to_string().contains("Buy milk"));
    let stranger = uuid::Uuid::new_v4().to_string();
    let theirs = call(
        &app,
        Method::GET,
        "/idempotency-status",
        &stranger,
        Some(&key),
        "",
    )
    .await;
    let unused = uuid::Uuid::new_v4().to_string();
    let nobodys = call(
        &app,
        Method::GET,
        "/idempotency-status",
        &stranger,
        Some(&unused),
        "",
    )
    .await;
    assert_eq!(theirs.0, StatusCode::OK);
    assert_eq!(json(&theirs.2)["state"], "absent");
    assert_eq!((theirs.1, theirs.2), (nobodys.1, nobodys.2));

    let (status, _, problem) = call(
        &app,
        Method::POST,
        "/tasks",
        &user,
        Some(&key),
        r#"{"title":"Buy bread"}"#,
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(json(&problem)["type"], "urn:idempotency:problem:key-reused");

    let (status, _, list) = call(&app, Method::GET, "/tasks", &user, None, "").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        json(&list).as_array().unwrap().len(),
        1,
        "exactly one task was created"
    );

    // Another user sees none of it.
    let (_, _, other) = call(
        &app,
        Method::GET,
        "/tasks",
        &uuid::Uuid::new_v4().to_string(),
        None,
        "",
    )
    .await;
    assert_eq!(json(&other).as_array().unwrap().len(), 0);

    // PATCH and DELETE are idempotent too, and require a key.
    let (status, _, _) = call(
        &app,
        Method::PATCH,
        &location,
        &user,
        None,
        r#"{"done":true}"#,
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let patch_key = uuid::Uuid::new_v4().to_string();
    let (status, _, patched) = call(
        &app,
        Method::PATCH,
        &location,
        &user,
        Some(&patch_key),
        r#"{"done":true}"#,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(json(&patched)["done"], true);
    let delete_key = uuid::Uuid::new_v4().to_string();
    assert_eq!(
        call(
            &app,
            Method::DELETE,
            &location,
            &user,
            Some(&delete_key),
            ""
        )
        .await
        .0,
        StatusCode::NO_CONTENT
    );
    let (status, headers, _) = call(
        &app,
        Method::DELETE,
        &location,
        &user,
        Some(&delete_key),
        "",
    )
    .await;
    assert_eq!(
        status,
        StatusCode::NO_CONTENT,
        "a retried DELETE replays its 204, not a 404"
    );
    assert_eq!(headers.get("idempotent-replayed").unwrap(), "true");
    let other_key = uuid::Uuid::new_v4().to_string();
    assert_eq!(
        call(&app, Method::DELETE, &location, &user, Some(&other_key), "")
            .await
            .0,
        StatusCode::NOT_FOUND
    );

    // Validation and authentication answers.
    let k = uuid::Uuid::new_v4().to_string();
    assert_eq!(
        call(&app, Method::POST, "/tasks", &user, Some(&k), "{not json")
            .await
            .0,
        StatusCode::BAD_REQUEST
    );
    let k = uuid::Uuid::new_v4().to_string();
    assert_eq!(
        call(
            &app,
            Method::POST,
            "/tasks",
            &user,
            Some(&k),
            r#"{"title":""}"#
        )
        .await
        .0,
        StatusCode::UNPROCESSABLE_ENTITY
    );
    let k = uuid::Uuid::new_v4().to_string();
    assert_eq!(
        call(
            &app,
            Method::POST,
            "/tasks",
            "not-a-uuid",
            Some(&k),
            r#"{"title":"x"}"#
        )
        .await
        .0,
        StatusCode::UNAUTHORIZED
    );
}

mod memory {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn the_task_api_runs_each_write_once() {
        super::the_task_api_runs_each_write_once("memory").await;
    }
}

mod postgres {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn the_task_api_runs_each_write_once() {
        super::the_task_api_runs_each_write_once(&postgres_url()).await;
    }

    /// Two demo processes on one PostgreSQL database share tasks and keys: 32 concurrent creates
    /// with one key, split between them, make one task.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn two_demo_instances_create_one_task() {
        let url = postgres_url();
        let a = idempotency_demo::build_app(&url).await.unwrap();
        let b = idempotency_demo::build_app(&url).await.unwrap();
        let user = uuid::Uuid::new_v4().to_string();
        let key = uuid::Uuid::new_v4().to_string();
        let tasks: Vec<_> = (0..32)
            .map(|i| {
                let app = if i % 2 == 0 { a.clone() } else { b.clone() };
                let (user, key) = (user.clone(), key.clone());
                tokio::spawn(async move {
                    call(
                        &app,
                        Method::POST,
                        "/tasks",
                        &user,
                        Some(&key),
                        r#"{"title":"once"}"#,
                    )
                    .await
                    .0
                })
            })
            .collect();
        for t in tasks {
            let status = t.await.unwrap();
            assert!(
                matches!(status, StatusCode::CREATED | StatusCode::CONFLICT),
                "{status}"
            );
        }
        let (_, _, list_a) = call(&a, Method::GET, "/tasks", &user, None, "").await;
        let (_, _, list_b) = call(&b, Method::GET, "/tasks", &user, None, "").await;
        assert_eq!(json(&list_a).as_array().unwrap().len(), 1);
        assert_eq!(list_a, list_b);
    }

    /// Without pg_cron (this server has none), the demo deletes expired keys itself: a
    /// flood of keys does not grow the table for good (issue 28 item 1).
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn the_demo_purges_expired_keys_without_pg_cron() {
        use idempotency::{
            BodyCanonicalization, Fingerprint, IdempotencyKey, IdempotencyStore, KeyFormat,
            LeaseToken, PostgresStore, Scope, StoredResponse,
        };
        let db = idempotency_e2e::TestDatabase::create("demo_purge").await;
        let store = PostgresStore::connect(db.url()).await.unwrap();
        store.migrate().await.unwrap();
        let (scope, token) = (Scope::new("expired").unwrap(), LeaseToken::new());
        let key = IdempotencyKey::parse(b"expired-key", KeyFormat::opaque()).unwrap();
        let fp = Fingerprint::of_request("POST", "/tasks", b"", BodyCanonicalization::Raw);
        let lease = std::time::Duration::from_secs(60);
        store.claim(&scope, &key, &fp, token, lease).await.unwrap();
        let response = StoredResponse::new(StatusCode::CREATED, Default::default(), Bytes::new());
        let retention = std::time::Duration::from_millis(1);
        let completed = store
            .complete(&scope, &key, token, &response, retention)
            .await
            .unwrap();
        assert_eq!(completed, idempotency::store::FenceOutcome::Applied);
        let client = db.connect().await;
        let rows = || async {
            let row = client
                .query_one(
                    "SELECT count(*) FROM idempotency_keys WHERE key = 'expired-key'",
                    &[],
                )
                .await;
            row.unwrap().get::<_, i64>(0)
        };
        assert_eq!(rows().await, 1, "the expired record is in the table");

        let _app = idempotency_demo::build_app(db.url()).await.unwrap();
        let until = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        while rows().await != 0 {
            assert!(tokio::time::Instant::now() < until, "the demo never purged");
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        drop(client);
        db.drop().await;
    }
}

mod redis {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn the_task_api_runs_each_write_once() {
        super::the_task_api_runs_each_write_once(&redis_url()).await;
    }
}

/// On the memory store the demo bounds its task list: one user's flood of creates ends in
/// `507 task-list-full` at the per-user limit (not in the process's memory), that refusal is
/// not stored (a retry after a delete runs), and other users are not affected. Unmatched paths
/// stay 404.
#[tokio::test]
async fn the_memory_task_list_is_bounded_per_user() {
    use idempotency_demo::tasks::MAX_MEMORY_TASKS_PER_USER;
    let app = idempotency_demo::build_app("memory").await.unwrap();
    let flooder = uuid::Uuid::new_v4().to_string();
    let mut last = None;
    for i in 0..MAX_MEMORY_TASKS_PER_USER {
        let key = format!("flood-{i}");
        let (status, _, body) = call(
            &app,
            Method::POST,
            "/tasks",
            &flooder,
            Some(&key),
            r#"{"title":"t"}"#,
        )
        .await;
        assert_eq!(status, StatusCode::CREATED, "{i}");
        last = Some(json(&body)["id"].as_str().unwrap().to_owned());
    }
    let one_more = |key: &'static str| {
        let (app, flooder) = (app.clone(), flooder.clone());
        async move {
            call(
                &app,
                Method::POST,
                "/tasks",
                &flooder,
                Some(key),
                r#"{"title":"t"}"#,
            )
            .await
        }
    };
    let (status, _, body) = one_more("flood-over").await;
    assert_eq!(status, StatusCode::INSUFFICIENT_STORAGE);
    assert_eq!(
        json(&body)["type"],
        "urn:idempotency-demo:problem:task-list-full"
    );
    // Another user still creates tasks.
    let other = uuid::Uuid::new_v4().to_string();
    let (status, _, _) = call(
        &app,
        Method::POST,
        "/tasks",
        &other,
        Some("k"),
        r#"{"title":"t"}"#,
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    // After a delete, the same key runs: the 507 was not stored.
    let path = format!("/tasks/{}", last.unwrap());
    let (status, _, _) = call(&app, Method::DELETE, &path, &flooder, Some("del"), "").await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, headers, _) = one_more("flood-over").await;
    assert_eq!(status, StatusCode::CREATED);
    assert!(headers.get("idempotent-replayed").is_none());
    // A path that matches no route is the router's 404, not a key error.
    let (status, _, _) = call(&app, Method::POST, "/nope", &flooder, None, "{}").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}
