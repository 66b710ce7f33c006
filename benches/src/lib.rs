//! What the benches, the report and the load generator share: the stores under test, how to
//! reach them, and the same statements sent without the library (the floor).

pub mod contention;
pub mod http;
pub mod http_pg;
pub mod load;
pub mod wake;

use bytes::Bytes;
use idempotency::postgres::tokio_postgres;
use idempotency::redis::redis;
use idempotency::store::{Fingerprint, LeaseToken, StoredResponse};
use idempotency::{
    BodyCanonicalization, IdempotencyKey, IdempotencyStore, KeyFormat, MemoryStore, PostgresStore,
    RedisStore, Scope, TableMode,
};
use std::sync::Arc;
use std::time::Duration;

/// An error and its sources, as one line.
pub fn err(e: impl std::error::Error + 'static) -> String {
    idempotency::ErrorChain(&e).to_string()
}

/// A store (and table mode) under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// In-process moka.
    Memory,
    /// Redis single node.
    Redis,
    /// PostgreSQL in one of the table modes.
    Postgres(TableMode),
    /// PostgreSQL UNLOGGED with statements sent unnamed (`prepared_statements=false`), directly:
    /// what the pooler-compatible mode costs by itself.
    PostgresUnnamed,
    /// PostgreSQL UNLOGGED, unnamed statements, through a PgBouncer in transaction mode.
    PgBouncer,
}

impl Target {
    /// Every target, memory first.
    pub const ALL: [Target; 5] = [
        Target::Memory,
        Target::Redis,
        Target::Postgres(TableMode::Unlogged),
        Target::Postgres(TableMode::Logged),
        Target::Postgres(TableMode::LoggedAsyncCommit),
    ];

    /// The connection-pooler comparison: UNLOGGED prepared, unnamed, and through PgBouncer.
    pub const POOLER: [Target; 3] = [
        Target::Postgres(TableMode::Unlogged),
        Target::PostgresUnnamed,
        Target::PgBouncer,
    ];

    /// The id used in benchmark names and the report.
    pub fn name(self) -> &'static str {
        match self {
            Target::Memory => "memory",
            Target::Redis => "redis",
            Target::Postgres(TableMode::Unlogged) => "postgres_unlogged",
            Target::Postgres(TableMode::Logged) => "postgres_logged",
            Target::Postgres(TableMode::LoggedAsyncCommit) => "postgres_logged_async_commit",
            Target::PostgresUnnamed => "postgres_unlogged_unnamed",
            Target::PgBouncer => "postgres_unlogged_via_pgbouncer",
        }
    }
}

/// Where the servers are: the same environment variables and defaults as the tests.
#[derive(Clone, Debug)]
pub struct Servers {
    /// PostgreSQL URL.
    pub postgres: String,
    /// Redis URL.
    pub redis: String,
    /// A PgBouncer in transaction mode in front of the same PostgreSQL, if one is to be measured.
    pub pgbouncer: Option<String>,
}

impl Default for Servers {
    fn default() -> Self {
        Servers {
            postgres: idempotency_testkit::env::postgres_url(),
            redis: idempotency_testkit::env::redis_url(),
            pgbouncer: None,
        }
    }
}

/// A connected store, and what is needed to clean up after it.
#[allow(missing_debug_implementations)]
pub struct Connected {
    /// The store as the library uses it.
    pub store: Arc<dyn IdempotencyStore>,
    /// The Postgres store, for its pool and SQL.
    pub postgres: Option<PostgresStore>,
    /// The Redis key prefix, for the floor.
    pub redis_prefix: Option<String>,
}

/// Connects to a target (migrating a fresh bench schema for Postgres), or says why it cannot.
pub async fn connect(
    target: Target,
    servers: &Servers,
    pool_size: usize,
) -> Result<Connected, String> {
    match target {
        Target::Memory => Ok(Connected {
            store: Arc::new(
                MemoryStore::builder()
                    .max_stored_bytes(1 << 30)
                    .max_in_flight(1 << 20)
                    .build(),
            ),
            postgres: None,
            redis_prefix: None,
        }),
        Target::Redis => {
            let prefix = format!("idem-bench:{}:", uuid::Uuid::new_v4().simple());
            let store = RedisStore::builder(&servers.redis)
                .key_prefix(&prefix)
                .build()
                .await
                .map_err(|e| {
                    format!(
                        "Redis at {} unreachable: {}",
                        servers.redis,
                        idempotency::ErrorChain(&e)
                    )
                })?;
            Ok(Connected {
                store: Arc::new(store),
                postgres: None,
                redis_prefix: Some(prefix),
            })
        }
        Target::Postgres(_) | Target::PostgresUnnamed | Target::PgBouncer => {
            let (url, mode, prepared) = match target {
                Target::Postgres(mode) => (servers.postgres.as_str(), mode, true),
                Target::PgBouncer => (
                    servers
                        .pgbouncer
                        .as_deref()
                        .ok_or("no PgBouncer given (--pgbouncer URL)")?,
                    TableMode::Unlogged,
                    false,
                ),
                _ => (servers.postgres.as_str(), TableMode::Unlogged, false),
            };
            let schema = format!("idem_bench_{}", target.name());
            let store = PostgresStore::builder(url)
                .schema(&schema)
                .table_mode(mode)
                .pool_size(pool_size)
                .prepared_statements(prepared)
                .build()
                .await
                .map_err(|e| {
                    format!(
                        "PostgreSQL at {url} unusable: {}",
                        idempotency::ErrorChain(&e)
                    )
                })?;
            let client = store.pool().get().await.map_err(err)?;
            client
                .simple_query(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
                .await
                .map_err(err)?;
            drop(client);
            store.migrate().await.map_err(err)?;
            Ok(Connected {
                store: Arc::new(store.clone()),
                postgres: Some(store),
                redis_prefix: None,
            })
        }
    }
}

impl Connected {
    /// Drops the bench schema (Postgres); Redis keys expire by themselves.
    pub async fn cleanup(&self) {
        if let Some(pg) = &self.postgres
            && let Ok(client) = pg.pool().get().await
        {
            let _ = client
                .batch_execute(&format!(
                    "DROP SCHEMA IF EXISTS \"{}\" CASCADE",
                    pg.schema()
                ))
                .await;
        }
    }
}

/// The runtime the criterion benches run on: two workers, as the machines they are measured on.
pub fn bench_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("tokio runtime: {e}"))
}

/// The median of `values` (sorted in place; the mean of the middle two for an even count; NaN
/// when empty). Every figure of the benches is a median of this one kind.
pub fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

/// A fresh random key.
pub fn fresh_key() -> IdempotencyKey {
    let mut buf = uuid::Uuid::encode_buffer();
    let text = uuid::Uuid::new_v4().hyphenated().encode_lower(&mut buf);
    IdempotencyKey::parse(text.as_bytes(), KeyFormat::UuidV4)
        .unwrap_or_else(|_| unreachable!("a v4 UUID is a valid key"))
}

/// The scope every bench request uses.
pub fn bench_scope() -> Scope {
    Scope::from(uuid::Uuid::from_u128(
        0x6f1c2e0a_5d4b_4c3e_9a8f_1b2c3d4e5f60,
    ))
}

/// A typical request's fingerprint.
pub fn bench_fingerprint() -> Fingerprint {
    Fingerprint::of_request(
        "POST",
        "/tasks",
        br#"{"title":"Buy milk"}"#,
        BodyCanonicalization::Json,
    )
}

/// A typical stored response: a created task, about 200 bytes.
pub fn bench_response() -> StoredResponse {
    let mut headers = idempotency::http::HeaderMap::new();
    headers.insert(
        idempotency::http::header::CONTENT_TYPE,
        idempotency::http::HeaderValue::from_static("application/json"),
    );
    headers.insert(
        idempotency::http::header::LOCATION,
        idempotency::http::HeaderValue::from_static("/tasks/a999fb56-95bd-4f11-8498-c878d3824f21"),
    );
    StoredResponse::new(
        idempotency::http::StatusCode::CREATED,
        headers,
        Bytes::from_static(
            br#"{"id":"a999fb56-95bd-4f11-8498-c878d3824f21","title":"Buy milk","done":false,"created_at":"2026-11-29T13:37:24.318269Z"}"#,
        ),
    )
}

/// The Postgres store's claim and complete of a fresh `key`, sent on `client` with its
/// prepared statements: the raw-driver side of the floors.
pub async fn pg_claim_complete(
    client: &tokio_postgres::Client,
    claim: &tokio_postgres::Statement,
    complete: &tokio_postgres::Statement,
    key: &str,
    response: &[u8],
) -> Result<(), String> {
    let scope = bench_scope();
    let fp = bench_fingerprint().to_bytes();
    let token = LeaseToken::new();
    client
        .query(
            claim,
            &[
                &scope.as_str(),
                &key,
                &&fp[..],
                &token.as_uuid(),
                &LEASE.as_secs_f64(),
            ],
        )
        .await
        .map_err(err)?;
    client
        .execute(
            complete,
            &[
                &scope.as_str(),
                &key,
                &token.as_uuid(),
                &201i32,
                &response,
                &RETENTION.as_secs_f64(),
            ],
        )
        .await
        .map_err(err)?;
    Ok(())
}

/// Lease and retention used by the benches.
pub const LEASE: Duration = Duration::from_secs(60);
/// Retention used by the benches.
pub const RETENTION: Duration = Duration::from_secs(24 * 3600);

/// The floor: the store's own statements sent with the driver directly, no library in between.
/// (The Redis key name is built the same way the store builds it; bench scopes and keys are
/// UUIDs, which need no escaping.)
#[allow(missing_debug_implementations)]
pub enum Raw {
    /// One tokio-postgres connection with the claim and complete statements prepared.
    Postgres {
        /// The connection.
        client: tokio_postgres::Client,
        /// Prepared claim.
        claim: tokio_postgres::Statement,
        /// Prepared complete.
        complete: tokio_postgres::Statement,
    },
    /// One multiplexed Redis connection and the store's scripts.
    Redis {
        /// The connection.
        connection: redis::aio::MultiplexedConnection,
        /// Claim script.
        claim: redis::Script,
        /// Complete script.
        complete: redis::Script,
        /// Key prefix.
        prefix: String,
    },
}

impl Raw {
    /// Opens the floor for a connected Postgres or Redis target.
    pub async fn open(connected: &Connected, servers: &Servers) -> Result<Option<Raw>, String> {
        if let Some(pg) = &connected.postgres {
            let client = idempotency::postgres::connect_raw(&servers.postgres)
                .await
                .map_err(err)?;
            if pg.table_mode() == TableMode::LoggedAsyncCommit {
                client
                    .batch_execute("SET synchronous_commit = off")
                    .await
                    .map_err(err)?;
            }
            let claim = client.prepare(pg.statements().claim).await.map_err(err)?;
            let complete = client
                .prepare(pg.statements().complete)
                .await
                .map_err(err)?;
            return Ok(Some(Raw::Postgres {
                client,
                claim,
                complete,
            }));
        }
        if let Some(prefix) = &connected.redis_prefix {
            let client = redis::Client::open(servers.redis.as_str()).map_err(err)?;
            let connection = client
                .get_multiplexed_async_connection()
                .await
                .map_err(err)?;
            return Ok(Some(Raw::Redis {
                connection,
                // The store's own scripts, read from its crate.
                claim: redis::Script::new(include_str!(
                    "../../crates/idempotency-redis/lua/claim.lua"
                )),
                complete: redis::Script::new(include_str!(
                    "../../crates/idempotency-redis/lua/complete.lua"
                )),
                prefix: prefix.clone(),
            }));
        }
        Ok(None)
    }

    /// One claim and one complete of a fresh key, as the store sends them.
    pub async fn claim_complete(&mut self, key: &str, response: &[u8]) -> Result<(), String> {
        let scope = bench_scope();
        let fp = bench_fingerprint().to_bytes();
        let token = LeaseToken::new();
        match self {
            Raw::Postgres {
                client,
                claim,
                complete,
            } => pg_claim_complete(client, claim, complete, key, response).await?,
            Raw::Redis {
                connection,
                claim,
                complete,
                prefix,
            } => {
                let name = format!("{prefix}{{{}:{key}}}", scope.as_str());
                let _: redis::Value = claim
                    .key(&name)
                    .arg(&fp[..])
                    .arg(&token.as_bytes()[..])
                    .arg(LEASE.as_millis() as u64)
                    .invoke_async(connection)
                    .await
                    .map_err(err)?;
                let _: i64 = complete
                    .key(&name)
                    .arg(&token.as_bytes()[..])
                    .arg(response)
                    .arg(RETENTION.as_millis() as u64)
                    .arg(format!("{prefix}settled"))
                    .invoke_async(connection)
                    .await
                    .map_err(err)?;
            }
        }
        Ok(())
    }

    /// One trivial round trip: `SELECT 1` or `PING`.
    pub async fn ping(&mut self) -> Result<(), String> {
        match self {
            Raw::Postgres { client, .. } => client
                .simple_query("SELECT 1")
                .await
                .map(|_| ())
                .map_err(err),
            Raw::Redis { connection, .. } => redis::cmd("PING")
                .query_async::<String>(connection)
                .await
                .map(|_| ())
                .map_err(err),
        }
    }
}
