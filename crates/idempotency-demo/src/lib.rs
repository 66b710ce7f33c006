//! ADR 009's "create task" API behind the idempotency layer.
//!
//! - `Authorization: Bearer <user-uuid>`: the UUID is the user (and the idempotency scope).
//! - `POST /tasks {"title"}` -> 201 + `Location`; `GET /tasks`; `GET /tasks/{id}`;
//!   `PATCH /tasks/{id} {"title"?, "done"?}`; `DELETE /tasks/{id}` -> 204.
//! - `Idempotency-Key` (any 1..=255 visible-ASCII key; clients should send a UUID v4, as the
//!   ADR says) is required on POST, PATCH and DELETE.
//! - On PostgreSQL, each write runs in the request's idempotency transaction (`Tx`): the task
//!   and the stored response commit together, so a crash or a store fault between them cannot
//!   make a retry create a second task.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let app = idempotency_demo::build_app_with("memory", &Default::default()).await?;
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//! axum::serve(listener, app.router)
//!     .with_graceful_shutdown(async { let _ = tokio::signal::ctrl_c().await; })
//!     .await?;
//! // Requests whose client left are still running: let them finish and store their responses.
//! let _ = tokio::time::timeout(std::time::Duration::from_secs(30), app.drain.drained()).await;
//! # Ok(()) }
//! ```

mod api_error;
pub mod cli;
pub mod operations;
pub mod tasks;

use api_error::{ApiError, problem};
use axum::extract::{Path, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Json, Router};
use bytes::Bytes;
use idempotency::{
    ClaimMode, Drain, IdempotencyLayer, IdempotencyStore, PostgresStore, PostgresTransaction,
    Scope, TableMode, Tx,
};
use serde::Deserialize;
use std::sync::Arc;
use std::time::Duration;
use tasks::{TaskStore, TaskStoreError};
use uuid::Uuid;

/// Longest task title, in characters.
pub const MAX_TITLE_CHARS: usize = 200;

/// The authenticated user, put in the request extensions by the auth middleware.
#[derive(Clone, Copy, Debug)]
pub struct UserId(pub Uuid);

impl From<UserId> for Scope {
    fn from(user: UserId) -> Scope {
        Scope::from(user.0)
    }
}

/// Why the demo could not start.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// The idempotency store could not be made.
    #[error("could not open the idempotency store")]
    Store(#[from] idempotency::ConnectError),
    /// The task storage could not be made.
    #[error("could not open the task storage")]
    Tasks(#[from] TaskStoreError),
    /// The idempotency settings cannot run on the store (a lease shorter than three store
    /// timeouts, say).
    #[error("the idempotency settings cannot run on this store")]
    Config(#[from] idempotency::ConfigError),
}

/// How the demo runs.
#[derive(Clone, Debug)]
pub struct Options {
    /// The idempotency lease: how long a crashed request's key stays blocked (default 60 s).
    pub lease: Duration,
    /// How long responses are replayed (default 24 h).
    pub retention: Duration,
    /// Whether, on PostgreSQL, task writes run in the request's idempotency transaction
    /// (default true). Turned off, a task and its stored response commit separately, so a
    /// crash between them makes the retry create a second task: the hazard transactional
    /// completion removes, kept to be shown.
    pub tasks_in_transaction: bool,
    /// How each key is held. The default, [`ClaimMode::OneTransactionSpeculative`], keeps the
    /// key inside its request's one transaction and looks it up together with the handler's
    /// first statement: the demo's handlers write nothing but tasks in that transaction, so it
    /// is the fastest correct mode for them (`docs/benchmarks.md`). On a store without the
    /// one-transaction modes (memory, Redis), or with tasks outside the transaction, keys are
    /// claimed with a lease ([`ClaimMode::Lease`]) whatever this says.
    pub claim_mode: ClaimMode,
    /// The key table's persistence on PostgreSQL. `None` (the default): a new table is
    /// [`TableMode::Logged`] (in the one-transaction mode a key commits with its task for no
    /// extra fsync, and survives a database crash with it; `docs/benchmarks.md` measures both),
    /// and an existing table keeps its mode (an UNLOGGED one made by an earlier version is used
    /// as it is, with a warning saying how to switch it).
    pub table_mode: Option<TableMode>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            lease: Duration::from_secs(60),
            retention: Duration::from_secs(24 * 60 * 60),
            tasks_in_transaction: true,
            claim_mode: ClaimMode::OneTransactionSpeculative,
            table_mode: None,
        }
    }
}

/// The demo's routes and what its shutdown waits for.
pub struct App {
    /// The task API, behind authentication and the idempotency layer.
    pub router: Router,
    /// Awaited after the server stops accepting requests: handlers still running (those whose
    /// client left included) finish and their responses are stored, so a deploy never cuts a
    /// side effect in half or leaves a key claimed until its lease runs out.
    pub drain: Drain,
    /// The idempotency store, for the operations endpoints (its readiness, what it holds).
    pub store: Arc<dyn IdempotencyStore>,
}

impl std::fmt::Debug for App {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("App")
            .field("router", &self.router)
            .field("drain", &self.drain)
            .field("store", &self.store.backend())
            .finish()
    }
}

/// The app on the store named by `store_url` (`memory`, `postgres://...`, `redis://...`). With
/// PostgreSQL, tasks live in a `tasks` table in the same database, so several demo processes
/// share tasks and keys; otherwise tasks live in this process.
pub async fn build_app(store_url: &str) -> Result<Router, DemoError> {
    Ok(build_app_with(store_url, &Options::default()).await?.router)
}

/// [`build_app`] with `options`, and the handle its shutdown waits on.
pub async fn build_app_with(store_url: &str, options: &Options) -> Result<App, DemoError> {
    let (store, tasks): (Arc<dyn IdempotencyStore>, _) = if store_url.starts_with("postgres") {
        let store = postgres_store(store_url, options).await?;
        let tasks = TaskStore::postgres(store.pool().clone()).await?;
        (Arc::new(store), tasks)
    } else {
        (idempotency::connect(store_url).await?, TaskStore::memory())
    };
    router_with(store, tasks, options)
}

/// The PostgreSQL store of `options`, migrated. Without `--table-mode` the library's default
/// applies: a new key table is LOGGED, and an existing UNLOGGED one is kept with a warning.
async fn postgres_store(url: &str, options: &Options) -> Result<PostgresStore, DemoError> {
    let mut builder = PostgresStore::builder(url)
        .pool_size(32)
        .transactions(options.tasks_in_transaction);
    if let Some(mode) = options.table_mode {
        builder = builder.table_mode(mode);
    }
    let store = builder
        .build()
        .await
        .map_err(idempotency::ConnectError::from)?;
    let migrated = store
        .migrate()
        .await
        .map_err(idempotency::ConnectError::from)?;
    if matches!(
        migrated.purge_job,
        idempotency::postgres::PurgeJob::PgCronUnavailable { .. }
    ) {
        // No pg_cron to delete expired keys: the demo does it, hourly, so a flood of keys does
        // not grow the table for good.
        let purged = store.clone();
        tokio::spawn(async move {
            idempotency::purge_periodically(&purged, PURGE_EVERY, 10_000).await;
        });
    }
    Ok(store)
}

/// How often the demo deletes expired keys when pg_cron does not.
const PURGE_EVERY: std::time::Duration = std::time::Duration::from_secs(3600);

/// The app on a given idempotency store and task storage.
pub fn router(store: Arc<dyn IdempotencyStore>, tasks: TaskStore) -> Result<Router, DemoError> {
    Ok(router_with(store, tasks, &Options::default())?.router)
}

/// [`router`] with `options`, and the handle its shutdown waits on. The claim mode of
/// `options` where the store runs it: the lease mode where the store cannot hold a key in a
/// transaction (the memory and Redis stores), the one-transaction mode where it cannot
/// speculate (sqlx).
pub fn router_with(
    store: Arc<dyn IdempotencyStore>,
    tasks: TaskStore,
    options: &Options,
) -> Result<App, DemoError> {
    let transactions = store
        .transactional()
        .filter(|store| options.tasks_in_transaction && store.supports_one_transaction());
    let claim_mode = match (transactions, options.claim_mode) {
        (None, _) => ClaimMode::Lease,
        (Some(store), ClaimMode::OneTransactionSpeculative) if !store.supports_speculative() => {
            ClaimMode::OneTransaction
        }
        (Some(_), mode) => mode,
    };
    let probe = store.clone();
    let idempotency = IdempotencyLayer::builder(store)
        .scope_from_extension::<UserId>()
        .claim_mode(claim_mode)
        .lease(options.lease)
        .retention(options.retention)
        .build()?;
    let drain = idempotency.drain();
    let router = Router::new()
        .route("/tasks", get(list_tasks).post(create_task))
        .route(
            "/tasks/{id}",
            get(get_task).patch(update_task).delete(delete_task),
        )
        // The matched routes only: an unknown path stays 404, never a stored answer.
        .route_layer(idempotency.clone())
        // What became of one of the caller's keys (GET, the key in `Idempotency-Key`): added
        // after the idempotency layer, so it is not covered, and before authentication, so it
        // has the caller.
        .route_service("/idempotency-status", idempotency.key_status_service())
        // Added last, so it runs first: the idempotency layer needs the user.
        .layer(middleware::from_fn(authenticate))
        .with_state(tasks)
        // Outside authentication and the idempotency layer: probes carry no user and no key.
        .merge(operations::health_routes(probe.clone()));
    Ok(App {
        router,
        drain,
        store: probe,
    })
}

async fn authenticate(mut request: Request, next: Next) -> Response {
    let user = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .and_then(|token| Uuid::parse_str(token.trim()).ok());
    match user {
        Some(user) => {
            request.extensions_mut().insert(UserId(user));
            next.run(request).await
        }
        None => {
            let mut response = problem(
                StatusCode::UNAUTHORIZED,
                "unauthenticated",
                "Authentication required",
                "Send `Authorization: Bearer <your user UUID>`.",
            );
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            response
        }
    }
}

/// Parses a JSON body: malformed JSON is 400, well-formed JSON of the wrong shape is 422.
fn parse_json<T: for<'de> Deserialize<'de>>(body: &Bytes) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| match e.classify() {
        serde_json::error::Category::Data => ApiError::InvalidTask(e.to_string()),
        _ => ApiError::MalformedJson(e.to_string()),
    })
}

fn validate_title(title: String) -> Result<String, ApiError> {
    let chars = title.chars().count();
    if title.trim().is_empty() || chars > MAX_TITLE_CHARS {
        return Err(ApiError::InvalidTask(format!(
            "title must be 1 to {MAX_TITLE_CHARS} characters and not blank"
        )));
    }
    Ok(title)
}

fn task_id(raw: &str) -> Result<Uuid, ApiError> {
    Uuid::parse_str(raw).map_err(|_| ApiError::NotFound)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewTask {
    title: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TaskChange {
    title: Option<String>,
    done: Option<bool>,
}

async fn create_task(
    State(tasks): State<TaskStore>,
    Extension(user): Extension<UserId>,
    tx: Option<Tx<PostgresTransaction>>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let new: NewTask = parse_json(&body)?;
    let title = validate_title(new.title)?;
    let task = tasks.create(tx.as_deref(), user.0, title).await?;
    let location = format!("/tasks/{}", task.id);
    let mut response = (StatusCode::CREATED, Json(task)).into_response();
    if let Ok(value) = HeaderValue::from_str(&location) {
        response.headers_mut().insert(header::LOCATION, value);
    }
    Ok(response)
}

async fn list_tasks(
    State(tasks): State<TaskStore>,
    Extension(user): Extension<UserId>,
) -> Result<Response, ApiError> {
    Ok(Json(tasks.list(user.0).await?).into_response())
}

async fn get_task(
    State(tasks): State<TaskStore>,
    Extension(user): Extension<UserId>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let task = tasks.get(user.0, task_id(&id)?).await?;
    Ok(Json(task.ok_or(ApiError::NotFound)?).into_response())
}

async fn update_task(
    State(tasks): State<TaskStore>,
    Extension(user): Extension<UserId>,
    Path(id): Path<String>,
    tx: Option<Tx<PostgresTransaction>>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let id = task_id(&id)?;
    let change: TaskChange = parse_json(&body)?;
    if change.title.is_none() && change.done.is_none() {
        return Err(ApiError::InvalidTask("send `title`, `done` or both".into()));
    }
    let title = change.title.map(validate_title).transpose()?;
    let task = tasks
        .update(tx.as_deref(), user.0, id, title, change.done)
        .await?;
    Ok(Json(task.ok_or(ApiError::NotFound)?).into_response())
}

async fn delete_task(
    State(tasks): State<TaskStore>,
    Extension(user): Extension<UserId>,
    Path(id): Path<String>,
    tx: Option<Tx<PostgresTransaction>>,
) -> Result<StatusCode, ApiError> {
    if tasks.delete(tx.as_deref(), user.0, task_id(&id)?).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::NotFound)
    }
}
