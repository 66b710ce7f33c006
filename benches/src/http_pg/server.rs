//! The server side of the PostgreSQL comparison: the create-task handlers of each variant, and
//! the schema they write in.

use super::*;
use crate::err;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::{Json, Router};
use bytes::Bytes;
use idempotency::postgres::deadpool_postgres::{Object, Pool};
use idempotency::postgres::tokio_postgres;
use idempotency::{IdempotencyLayer, PostgresStore, PostgresTransaction, Scope, TableMode, Tx};
use std::net::SocketAddr;

#[derive(Clone)]
pub(super) struct App {
    pool: Pool,
    autocommit: bool,
    keys: String,
}

pub(super) const INSERT: &str =
    "INSERT INTO idempotency_http_bench.bench_tasks (user_id, title) VALUES ($1, $2) RETURNING id";

pub(super) fn user_and_title(headers: &HeaderMap, body: &Bytes) -> (String, String) {
    let user = headers
        .get("x-user")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("anonymous")
        .to_owned();
    (user, String::from_utf8_lossy(body).into_owned())
}

pub(super) fn created(id: i64, title: String) -> (StatusCode, Json<serde_json::Value>) {
    (
        StatusCode::CREATED,
        Json(serde_json::json!({ "id": id, "title": title })),
    )
}

pub(super) async fn bare(
    State(app): State<App>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<(StatusCode, Json<serde_json::Value>), StatusCode> {
    let (user, title) = user_and_title(&headers, &body);
    let unavailable = |_| StatusCode::SERVICE_UNAVAILABLE;
    let mut client = app
        .pool
        .get()
        .await
        .map_err(|_| StatusCode::SERVICE_UNAVAILABLE)?;
    let statement = client.prepare_cached(INSERT).await.map_err(unavailable)?;
    let id: i64 = if app.autocommit {
        client
            .query_one(&statement, &[&user, &title])
            .await
            .map_err(unavailable)?
            .get(0)
    } else {
        let tx = client.transaction().await.map_err(unavailable)?;
        let id = tx
            .query_one(&statement, &[&user, &title])
            .await
            .map_err(unavailable)?
            .get(0);
        tx.commit().await.map_err(unavailable)?;
        id
    };
    Ok(created(id, title))
}

/// The request's idempotency key, as the hand-written handlers read it.
fn idempotency_key(headers: &HeaderMap) -> Result<String, StatusCode> {
    headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .ok_or(StatusCode::BAD_REQUEST)
}

/// The hand-written handlers' statements on `client`: the key's plain lookup, the task's insert,
/// the completed key's plain insert (into `keys`).
async fn hand_statements(
    client: &Object,
    keys: &str,
) -> Result<[tokio_postgres::Statement; 3], tokio_postgres::Error> {
    Ok([
        client
            .prepare_cached(&format!(
                "SELECT response FROM {keys} WHERE user_id = $1 AND key = $2 AND expires_at > now()"
            ))
            .await?,
        client.prepare_cached(INSERT).await?,
        client
            .prepare_cached(&format!(
                "INSERT INTO {keys} (user_id, key, request_hash, status_code, response, expires_at) \
                 VALUES ($1, $2, $3, $4, $5, now() + interval '1 day')"
            ))
            .await?,
    ])
}

/// The completed key's insert pipelined with `COMMIT` (one round trip); a refused insert aborts
/// the transaction, so the `COMMIT` rolls it back.
async fn insert_key_and_commit(
    client: &Object,
    insert_key: &tokio_postgres::Statement,
    user: &str,
    key: &str,
    answer: &serde_json::Value,
) -> Result<(), tokio_postgres::Error> {
    let stored = serde_json::to_vec(answer).unwrap_or_default();
    let hash = [0u8; 33];
    let (hash, status) = (&hash[..], 201i32);
    let key_params: [&(dyn tokio_postgres::types::ToSql + Sync); 5] =
        [&user, &key, &hash, &status, &stored];
    let (inserted, committed) = tokio::join!(
        client.execute(insert_key, &key_params),
        client.batch_execute("COMMIT")
    );
    inserted?;
    committed
}

/// The one-transaction mode's SQL without the library: what the mode costs at the SQL level.
pub(super) async fn hand_written(
    State(app): State<App>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<(StatusCode, Json<serde_json::Value>), StatusCode> {
    by_hand(&app, &headers, &body, false).await
}

/// The speculative mode's SQL by hand: `BEGIN`, the key's lookup and the task in one round
/// trip (the lookup's answer read after the task's), the key's insert and `COMMIT` in the next.
pub(super) async fn hand_written_speculative(
    State(app): State<App>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<(StatusCode, Json<serde_json::Value>), StatusCode> {
    by_hand(&app, &headers, &body, true).await
}

/// The one-transaction modes by hand: `BEGIN` pipelined with a plain lookup (and, `speculative`,
/// with the task); a key found taken rolls back and answers the stored record; otherwise the
/// task, then a plain insert of the key pipelined with `COMMIT`.
async fn by_hand(
    app: &App,
    headers: &HeaderMap,
    body: &Bytes,
    speculative: bool,
) -> Result<(StatusCode, Json<serde_json::Value>), StatusCode> {
    let (user, title) = user_and_title(headers, body);
    let key = idempotency_key(headers)?;
    let unavailable = |_| StatusCode::SERVICE_UNAVAILABLE;
    let client = app
        .pool
        .get()
        .await
        .map_err(|_| StatusCode::SERVICE_UNAVAILABLE)?;
    let [lookup, task, insert_key] = hand_statements(&client, &app.keys)
        .await
        .map_err(unavailable)?;
    let lookup_params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&user, &key];
    let task_params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&user, &title];
    let (begun, found, inserted) = if speculative {
        let (begun, found, inserted) = tokio::join!(
            client.batch_execute("BEGIN"),
            client.query_opt(&lookup, &lookup_params),
            client.query_one(&task, &task_params)
        );
        (begun, found, Some(inserted))
    } else {
        let (begun, found) = tokio::join!(
            client.batch_execute("BEGIN"),
            client.query_opt(&lookup, &lookup_params)
        );
        (begun, found, None)
    };
    begun.map_err(unavailable)?;
    if let Some(row) = found.map_err(unavailable)? {
        let _ = client.batch_execute("ROLLBACK").await;
        let stored: Vec<u8> = row.get(0);
        return Ok((
            StatusCode::CREATED,
            Json(serde_json::from_slice(&stored).unwrap_or_default()),
        ));
    }
    let inserted = match inserted {
        Some(inserted) => inserted,
        None => client.query_one(&task, &task_params).await,
    };
    let id: i64 = inserted.map_err(unavailable)?.get(0);
    let answer = serde_json::json!({ "id": id, "title": title });
    insert_key_and_commit(&client, &insert_key, &user, &key, &answer)
        .await
        .map_err(unavailable)?;
    Ok((StatusCode::CREATED, Json(answer)))
}

pub(super) async fn in_tx(
    tx: Tx<PostgresTransaction>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<(StatusCode, Json<serde_json::Value>), StatusCode> {
    let (user, title) = user_and_title(&headers, &body);
    let unavailable = |_| StatusCode::SERVICE_UNAVAILABLE;
    let statement = tx.prepare_cached(INSERT).await.map_err(unavailable)?;
    let id: i64 = tx
        .query_one(&statement, &[&user, &title])
        .await
        .map_err(unavailable)?
        .get(0);
    Ok(created(id, title))
}

/// The app of `variant` on the database at `url`, with a pool of `pool` connections.
pub async fn app(variant: PgVariant, url: &str, pool: usize) -> Result<Router, String> {
    let table = match variant {
        PgVariant::Layer { table, .. } => table,
        PgVariant::HandWritten | PgVariant::HandWrittenSpeculative => TableMode::Logged,
        _ => TableMode::Unlogged,
    };
    let store = PostgresStore::builder(url)
        .schema(SCHEMA)
        .table(match table {
            TableMode::Logged | TableMode::LoggedAsyncCommit => "keys_logged",
            _ => "keys_unlogged",
        })
        .table_mode(table)
        .pool_size(pool)
        .build()
        .await
        .map_err(err)?;
    store.migrate().await.map_err(err)?;
    let router = match variant {
        PgVariant::BareAutocommit | PgVariant::BareTransaction => {
            Router::new().route("/tasks", post(bare)).with_state(App {
                pool: store.pool().clone(),
                autocommit: variant == PgVariant::BareAutocommit,
                keys: store.table_name(),
            })
        }
        PgVariant::HandWritten => Router::new()
            .route("/tasks", post(hand_written))
            .with_state(App {
                pool: store.pool().clone(),
                autocommit: false,
                keys: store.table_name(),
            }),
        PgVariant::HandWrittenSpeculative => Router::new()
            .route("/tasks", post(hand_written_speculative))
            .with_state(App {
                pool: store.pool().clone(),
                autocommit: false,
                keys: store.table_name(),
            }),
        PgVariant::Layer { mode, .. } => {
            fn scope(parts: &axum::http::request::Parts) -> Option<Scope> {
                parts
                    .headers
                    .get("x-user")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|u| Scope::new(u).ok())
            }
            let layer = IdempotencyLayer::builder(store)
                .scope_with(scope)
                .claim_mode(mode)
                .build()
                .expect("valid idempotency layer settings");
            Router::new().route("/tasks", post(in_tx).layer(layer))
        }
    };
    Ok(router)
}

/// Creates the bench's schema and task table afresh.
pub async fn prepare(url: &str) -> Result<(), String> {
    let client = connect(url).await?;
    client
        .batch_execute(&format!(
            "DROP SCHEMA IF EXISTS {SCHEMA} CASCADE; CREATE SCHEMA {SCHEMA}; \
             CREATE TABLE {SCHEMA}.bench_tasks (id bigserial PRIMARY KEY, user_id text NOT NULL, \
               title text NOT NULL, created_at timestamptz NOT NULL DEFAULT now())"
        ))
        .await
        .map_err(err)
}

/// Drops the bench's schema.
pub async fn cleanup(url: &str) -> Result<(), String> {
    connect(url)
        .await?
        .batch_execute(&format!("DROP SCHEMA IF EXISTS {SCHEMA} CASCADE"))
        .await
        .map_err(err)
}

pub(super) async fn connect(url: &str) -> Result<tokio_postgres::Client, String> {
    // The store's own connector: the URL's `sslmode` and `sslrootcert` as the store reads them.
    idempotency::postgres::connect_raw(url).await.map_err(err)
}

/// Serves `variant` on `listen` and prints `listening on <addr>` once bound.
pub async fn serve(
    listen: SocketAddr,
    variant: PgVariant,
    url: &str,
    pool: usize,
) -> Result<(), String> {
    let app = app(variant, url, pool).await?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| e.to_string())?;
    println!(
        "listening on {}",
        listener.local_addr().map_err(|e| e.to_string())?
    );
    axum::serve(listener, app).await.map_err(|e| e.to_string())
}
