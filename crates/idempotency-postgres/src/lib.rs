//! The PostgreSQL [`IdempotencyStore`]: ADR 009's `UNLOGGED` table, amended, on
//! tokio-postgres and deadpool-postgres. Every store step is one round trip; every time is the
//! database's `now()`.
//!
//! ```no_run
//! use idempotency_postgres::{PostgresStore, TableMode};
//!
//! # async fn run() -> Result<(), idempotency_postgres::PostgresStoreError> {
//! let store = PostgresStore::connect("postgres://app@db.internal/app")
//!     .table_mode(TableMode::Unlogged) // the ADR's choice, and the default
//!     .build()
//!     .await?;                          // refuses a standby / reader endpoint
//! let report = store.migrate().await?;  // idempotent, under an advisory lock
//! println!("{report}");                 // says whether the pg_cron purge job is scheduled
//! # Ok(()) }
//! ```
//!
//! # Guarantees
//! - Atomic claims: one `INSERT .. ON CONFLICT .. DO UPDATE .. WHERE expired` takes a free key
//!   or an expired one; a live row is returned unchanged.
//! - Fencing: `complete` and `release` match the lease token and a running lease.
//! - Expiry on read by the database clock; [`PostgresStore::purge_expired`] and the optional
//!   pg_cron job only reclaim space.
//! - Writer only: a standby or read-only server is refused when the store is built.
//! - **Crash loss (UNLOGGED):** a crash or immediate shutdown of a community PostgreSQL server
//!   empties the table, so retries of requests that completed before it run again. LOGGED keeps
//!   every committed record; LOGGED with async commit may lose the last moments. On Aurora,
//!   unlogged tables survive failover (AWS docs), so only the lease frees stale claims.

mod error;
mod schema;
mod transaction;

use async_trait::async_trait;
use bytes::Bytes;
use deadpool_postgres::{Hook, Manager, ManagerConfig, Pool, QueueMode, RecyclingMethod, Runtime};
use idempotency_core::{
    ClaimOutcome, CorruptRecord, FenceOutcome, Fingerprint, IdempotencyKey, IdempotencyStore,
    LeaseToken, Record, RecordState, Scope, StoreError, StoredResponse, TransactionalStore,
};
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio_postgres::{NoTls, Row};

pub use error::PostgresStoreError;
pub use schema::TableMode;
pub use transaction::PgTransaction;
pub use {deadpool_postgres, tokio_postgres};

use error::{BACKEND, pool_error, query_error};
use schema::{Statements, TableName};

/// The default table name (the ADR's).
pub const DEFAULT_TABLE: &str = "idempotency_keys";
/// The default pg_cron schedule of the purge job: hourly, as the ADR says.
pub const DEFAULT_PURGE_SCHEDULE: &str = "0 * * * *";

/// Where the store's connections come from.
enum Source {
    Url(String),
    Pool(Pool),
}

/// Builds a [`PostgresStore`].
pub struct PostgresStoreBuilder {
    source: Source,
    schema: String,
    table: String,
    mode: TableMode,
    pool_size: usize,
    connect_timeout: Duration,
    purge_schedule: String,
    transactions: bool,
}

impl fmt::Debug for PostgresStoreBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresStoreBuilder")
            .field("schema", &self.schema)
            .field("table", &self.table)
            .field("mode", &self.mode)
            .field("pool_size", &self.pool_size)
            .finish_non_exhaustive()
    }
}

impl PostgresStoreBuilder {
    fn new(source: Source) -> Self {
        PostgresStoreBuilder {
            source,
            schema: "public".to_owned(),
            table: DEFAULT_TABLE.to_owned(),
            mode: TableMode::default(),
            pool_size: 16,
            connect_timeout: Duration::from_secs(5),
            purge_schedule: DEFAULT_PURGE_SCHEDULE.to_owned(),
            transactions: true,
        }
    }

    /// Whether handlers are offered a transaction in which their writes commit together with
    /// the stored response ([`PgTransaction`]; default true). Off, every request is completed
    /// on its own statement, as with the other stores.
    pub fn transactions(mut self, offer: bool) -> Self {
        self.transactions = offer;
        self
    }

    /// The schema of the table (default `public`). Letters, digits and underscores.
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = schema.into();
        self
    }

    /// The table name (default `idempotency_keys`). Letters, digits and underscores.
    pub fn table(mut self, table: impl Into<String>) -> Self {
        self.table = table.into();
        self
    }

    /// UNLOGGED (default), LOGGED, or LOGGED with asynchronous commit.
    pub fn table_mode(mut self, mode: TableMode) -> Self {
        self.mode = mode;
        self
    }

    /// Connections in the pool built from a URL (default 16).
    pub fn pool_size(mut self, size: usize) -> Self {
        self.pool_size = size.max(1);
        self
    }

    /// Bound on connecting and on waiting for a pooled connection (default 5 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The pg_cron schedule [`PostgresStore::migrate`] gives the purge job (default hourly,
    /// `0 * * * *`).
    pub fn purge_schedule(mut self, schedule: impl Into<String>) -> Self {
        self.purge_schedule = schedule.into();
        self
    }

    /// The SQL [`PostgresStore::migrate`] would apply, for teams that run their own migration
    /// tool. It does not connect.
    pub fn migration_sql(&self) -> Result<String, PostgresStoreError> {
        let name = TableName::new(&self.schema, &self.table)?;
        Ok(format!(
            "{}\n-- The state sentinel: a row that never expires, whose absence tells the store that \
             the table was emptied.\n{};\n\n-- Only where the pg_cron extension is installed:\n{}",
            schema::render_create_table(&name, self.mode),
            schema::sentinel_sql(&name),
            schema::render_schedule_purge(&name, &self.purge_schedule)
        ))
    }

    /// Builds the pool (for a URL), checks that the server is a writer and, for
    /// [`TableMode::LoggedAsyncCommit`], that commits are asynchronous.
    pub async fn build(self) -> Result<PostgresStore, PostgresStoreError> {
        let name = TableName::new(&self.schema, &self.table)?;
        let watch = Arc::new(StateWatch {
            sentinel: schema::sentinel_sql(&name),
            table: name.qualified(),
            losses: AtomicU64::new(0),
        });
        let pool = match self.source {
            Source::Pool(pool) => pool,
            Source::Url(url) => {
                let mut config = tokio_postgres::Config::from_str(&url)
                    .map_err(PostgresStoreError::InvalidUrl)?;
                config.connect_timeout(self.connect_timeout);
                if self.mode == TableMode::LoggedAsyncCommit {
                    let options = match config.get_options() {
                        Some(existing) => format!("{existing} -c synchronous_commit=off"),
                        None => "-c synchronous_commit=off".to_owned(),
                    };
                    config.options(&options);
                }
                let manager = Manager::from_config(
                    config,
                    NoTls,
                    ManagerConfig {
                        recycling_method: RecyclingMethod::Fast,
                    },
                );
                // LIFO hands out the connection used last: at low concurrency every step
                // reuses one warm connection (and one warm backend process) instead of
                // rotating through the whole pool.
                let hook_watch = Arc::clone(&watch);
                Pool::builder(manager)
                    .max_size(self.pool_size)
                    .queue_mode(QueueMode::Lifo)
                    // Every new connection checks the sentinel: after a crash every connection
                    // is new, so the first one notices that the table was emptied.
                    .post_create(Hook::async_fn(move |client, _| {
                        let watch = Arc::clone(&hook_watch);
                        Box::pin(async move {
                            watch.check(client).await;
                            Ok(())
                        })
                    }))
                    .runtime(Runtime::Tokio1)
                    .wait_timeout(Some(self.connect_timeout))
                    .create_timeout(Some(self.connect_timeout))
                    .build()
                    .map_err(PostgresStoreError::BuildPool)?
            }
        };
        let client = pool.get().await?;
        let row = client
            .query_one(
                "SELECT pg_is_in_recovery(), current_setting('transaction_read_only'), \
                        current_setting('synchronous_commit')",
                &[],
            )
            .await?;
        let in_recovery: bool = row.get(0);
        let read_only: String = row.get(1);
        let synchronous_commit: String = row.get(2);
        if in_recovery || read_only == "on" {
            return Err(PostgresStoreError::ReadOnlyServer);
        }
        if self.mode == TableMode::LoggedAsyncCommit && synchronous_commit != "off" {
            return Err(PostgresStoreError::SynchronousCommitOn {
                found: synchronous_commit,
            });
        }
        drop(client);
        Ok(PostgresStore {
            inner: Arc::new(Inner {
                watch,
                statements: Statements::new(&name),
                name,
                mode: self.mode,
                pool,
                purge_schedule: self.purge_schedule,
                transactions: self.transactions,
            }),
        })
    }
}

/// Notices that the table lost its rows: a sentinel row that never expires is re-inserted when
/// missing, and each re-insertion counts as one loss.
struct StateWatch {
    sentinel: String,
    table: String,
    losses: AtomicU64,
}

impl StateWatch {
    /// Re-inserts the sentinel if missing; reports whether it was. Errors (the table does not
    /// exist yet, before `migrate`) are not losses.
    async fn check(&self, client: &tokio_postgres::Client) -> Option<bool> {
        let lost = !client.query(&self.sentinel, &[]).await.ok()?.is_empty();
        if lost {
            self.losses.fetch_add(1, Ordering::Relaxed);
            metrics::counter!("idempotency_store_state_lost_total", "backend" => BACKEND)
                .increment(1);
            tracing::error!(
                table = %self.table,
                "idempotency records were lost: the table was emptied (crash recovery of an UNLOGGED \
                 table, a failover, or a TRUNCATE). Every stored response and in-flight claim made \
                 before it is gone, so retries of those requests will run again"
            );
        }
        Some(lost)
    }
}

struct Inner {
    watch: Arc<StateWatch>,
    pool: Pool,
    name: TableName,
    mode: TableMode,
    statements: Statements,
    purge_schedule: String,
    transactions: bool,
}

/// The PostgreSQL store. Cheap to clone; clones share the pool.
#[derive(Clone)]
pub struct PostgresStore {
    inner: Arc<Inner>,
}

impl fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresStore")
            .field("table", &self.inner.name.qualified())
            .field("mode", &self.inner.mode)
            .finish_non_exhaustive()
    }
}

/// The SQL text of each store step; parameters are documented on each field.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct StatementsSql<'a> {
    /// `$1` scope, `$2` key, `$3` fingerprint bytes, `$4` token (uuid), `$5` lease seconds
    /// (float8).
    pub claim: &'a str,
    /// `$1` scope, `$2` key, `$3` token, `$4` status (int4), `$5` response bytes, `$6` retention
    /// seconds (float8).
    pub complete: &'a str,
    /// `$1` scope, `$2` key, `$3` token, `$4` lease seconds (float8).
    pub extend: &'a str,
    /// `$1` scope, `$2` key, `$3` token.
    pub release: &'a str,
    /// `$1` scope, `$2` key.
    pub get: &'a str,
    /// `$1` batch size (int8).
    pub purge: &'a str,
}

/// What [`PostgresStore::migrate`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct MigrationReport {
    /// Migrations applied by this call (empty when the schema was up to date).
    pub applied: Vec<&'static str>,
    /// Whether the pg_cron purge job is scheduled.
    pub purge_job: PurgeJob,
}

/// The state of the pg_cron purge job.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PurgeJob {
    /// The job is scheduled in pg_cron.
    Scheduled {
        /// The job's name in `cron.job`.
        job_name: String,
        /// Its schedule.
        schedule: String,
    },
    /// pg_cron is not installed in this database: nothing was scheduled.
    PgCronUnavailable {
        /// The database the store is connected to.
        database: String,
    },
}

impl fmt::Display for MigrationReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.applied.is_empty() {
            f.write_str("idempotency schema up to date")?;
        } else {
            write!(f, "applied migrations: {}", self.applied.join(", "))?;
        }
        match &self.purge_job {
            PurgeJob::Scheduled { job_name, schedule } => {
                write!(
                    f,
                    "; pg_cron job {job_name:?} purges expired keys on {schedule:?}"
                )
            }
            PurgeJob::PgCronUnavailable { database } => write!(
                f,
                "; pg_cron is not installed in database {database:?}, so no purge job was \
                 scheduled: call PostgresStore::purge_expired periodically (expired keys are \
                 already ignored on read; purging only reclaims space), or install pg_cron \
                 (shared_preload_libraries = 'pg_cron', CREATE EXTENSION pg_cron) and migrate again"
            ),
        }
    }
}

impl PostgresStore {
    /// A store that builds its own pool from a `postgres://` URL.
    pub fn connect(url: impl Into<String>) -> PostgresStoreBuilder {
        PostgresStoreBuilder::new(Source::Url(url.into()))
    }

    /// A store on a pool the application already has. For
    /// [`TableMode::LoggedAsyncCommit`], its connections must run with
    /// `synchronous_commit = off`.
    pub fn from_pool(pool: Pool) -> PostgresStoreBuilder {
        PostgresStoreBuilder::new(Source::Pool(pool))
    }

    /// The pool the store uses.
    pub fn pool(&self) -> &Pool {
        &self.inner.pool
    }

    /// The table mode.
    pub fn table_mode(&self) -> TableMode {
        self.inner.mode
    }

    /// The SQL of each store step, as rendered for this table (for `EXPLAIN`, for DBAs, and for
    /// the benchmark that runs the same statements without the library).
    pub fn statements(&self) -> StatementsSql<'_> {
        let s = &self.inner.statements;
        StatementsSql {
            claim: &s.claim,
            complete: &s.complete,
            extend: &s.extend,
            release: &s.release,
            get: &s.get,
            purge: &s.purge,
        }
    }

    /// Checks that the table still holds what it held: returns `true` (and logs an error and
    /// counts it in `idempotency_store_state_lost_total`) when the table was emptied since the
    /// last check, by crash recovery of an UNLOGGED table, a failover or a `TRUNCATE`. Pools built
    /// by the store run this on every new connection; call it periodically on a pool you passed
    /// in with [`PostgresStore::from_pool`].
    pub async fn check_state(&self) -> Result<bool, StoreError> {
        let client = self.client().await?;
        Ok(self.inner.watch.check(&client).await.unwrap_or(false))
    }

    /// How many times this store found its table emptied (see [`PostgresStore::check_state`]).
    pub fn state_losses(&self) -> u64 {
        self.inner.watch.losses.load(Ordering::Relaxed)
    }

    /// The schema of the table.
    pub fn schema(&self) -> &str {
        &self.inner.name.schema
    }

    /// The quoted, schema-qualified table name.
    pub fn table_name(&self) -> String {
        self.inner.name.qualified()
    }

    /// Creates the table and index if missing, and schedules the pg_cron purge job where pg_cron
    /// is installed. Idempotent; runs in one transaction under an advisory lock, so several
    /// instances starting at once do not collide. Fails if the existing table's persistence
    /// differs from the configured mode.
    pub async fn migrate(&self) -> Result<MigrationReport, PostgresStoreError> {
        let name = &self.inner.name;
        let mut client = self.inner.pool.get().await?;
        let tx = client.transaction().await?;
        tx.execute(
            "SELECT pg_advisory_xact_lock(hashtext($1))",
            &[&format!(
                "idempotency-migrate:{}.{}",
                name.schema, name.table
            )],
        )
        .await?;
        let schema_exists: bool = tx
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)",
                &[&name.schema],
            )
            .await?
            .get(0);
        if !schema_exists {
            tx.batch_execute(&format!(
                "CREATE SCHEMA IF NOT EXISTS {}",
                name.quoted_schema()
            ))
            .await?;
        }
        let migrations = name.migrations_table();
        tx.batch_execute(&format!(
            "CREATE TABLE IF NOT EXISTS {migrations} ( \
               version integer PRIMARY KEY, name text NOT NULL, \
               applied_at timestamptz NOT NULL DEFAULT now())"
        ))
        .await?;
        let applied_versions: Vec<i32> = tx
            .query(&format!("SELECT version FROM {migrations}"), &[])
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect();
        let mut applied = Vec::new();
        let record = format!("INSERT INTO {migrations} (version, name) VALUES ($1, $2)");
        let (version, migration, _) = schema::CREATE_TABLE;
        if !applied_versions.contains(&version) {
            tx.batch_execute(&schema::render_create_table(name, self.inner.mode))
                .await?;
            tx.execute(&record, &[&version, &migration]).await?;
            applied.push(migration);
        }
        // A fresh table gets its sentinel here, so creating it is not reported as a loss.
        tx.query(&schema::sentinel_sql(name), &[]).await?;
        let found: i8 = tx
            .query_one(
                "SELECT c.relpersistence::\"char\" FROM pg_class c \
                 JOIN pg_namespace n ON n.oid = c.relnamespace \
                 WHERE n.nspname = $1 AND c.relname = $2",
                &[&name.schema, &name.table],
            )
            .await?
            .get(0);
        let found = if found as u8 == b'u' {
            "UNLOGGED"
        } else {
            "LOGGED"
        };
        if found != self.inner.mode.persistence_name() {
            return Err(PostgresStoreError::TableModeMismatch {
                table: name.qualified(),
                expected: self.inner.mode.persistence_name(),
                found,
            });
        }
        let pg_cron: bool = tx
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'pg_cron')",
                &[],
            )
            .await?
            .get(0);
        let (version, migration, _) = schema::SCHEDULE_PURGE;
        let purge_job = if pg_cron {
            if !applied_versions.contains(&version) {
                tx.batch_execute(&schema::render_schedule_purge(
                    name,
                    &self.inner.purge_schedule,
                ))
                .await?;
                tx.execute(&record, &[&version, &migration]).await?;
                applied.push(migration);
            }
            PurgeJob::Scheduled {
                job_name: name.purge_job_name(),
                schedule: self.inner.purge_schedule.clone(),
            }
        } else {
            let database: String = tx.query_one("SELECT current_database()", &[]).await?.get(0);
            tracing::warn!(
                %database,
                "pg_cron is not installed: no purge job scheduled; call purge_expired periodically"
            );
            PurgeJob::PgCronUnavailable { database }
        };
        tx.commit().await?;
        Ok(MigrationReport { applied, purge_job })
    }

    async fn client(&self) -> Result<deadpool_postgres::Object, StoreError> {
        self.inner.pool.get().await.map_err(pool_error)
    }

    /// A pooled connection and `sql` prepared on it (once per connection, then cached).
    async fn prepared(
        &self,
        sql: &str,
    ) -> Result<(deadpool_postgres::Object, tokio_postgres::Statement), StoreError> {
        let client = self.client().await?;
        let statement = client.prepare_cached(sql).await.map_err(query_error)?;
        Ok((client, statement))
    }
}

fn record_from_row(row: &Row, offset: usize) -> Result<Record, StoreError> {
    let corrupt = |what| StoreError::corrupt(BACKEND, CorruptRecord::Field(what));
    let hash: &[u8] = row.try_get(offset).map_err(|_| corrupt("request_hash"))?;
    let fingerprint = Fingerprint::from_bytes(hash).map_err(|e| StoreError::corrupt(BACKEND, e))?;
    let lease_ms: Option<i64> = row
        .try_get(offset + 1)
        .map_err(|_| corrupt("locked_until"))?;
    let response: Option<Vec<u8>> = row.try_get(offset + 2).map_err(|_| corrupt("response"))?;
    let state = match (lease_ms, response) {
        (Some(ms), None) => RecordState::InFlight {
            lease_remaining: Duration::from_millis(ms.max(0) as u64),
        },
        (None, Some(bytes)) => RecordState::Completed {
            response: StoredResponse::decode(Bytes::from(bytes))
                .map_err(|e| StoreError::corrupt(BACKEND, e))?,
        },
        _ => return Err(corrupt("a row must be either in flight or completed")),
    };
    Ok(Record { fingerprint, state })
}

fn fenced(rows: u64) -> FenceOutcome {
    if rows == 1 {
        FenceOutcome::Applied
    } else {
        FenceOutcome::Stale
    }
}

#[async_trait]
impl IdempotencyStore for PostgresStore {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    async fn claim(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        token: LeaseToken,
        lease: Duration,
    ) -> Result<ClaimOutcome, StoreError> {
        let (client, statement) = self.prepared(&self.inner.statements.claim).await?;
        let hash = fingerprint.to_bytes();
        let lease_secs = lease.as_secs_f64();
        // A row inserted by a transaction that committed after this statement's snapshot was
        // taken conflicts with our insert but is invisible to the read half, so the statement
        // returns nothing; the next attempt sees it. Bounded, and rare outside of races.
        for _ in 0..8 {
            let rows = client
                .query(
                    &statement,
                    &[
                        &scope.as_str(),
                        &key.as_str(),
                        &&hash[..],
                        &token.as_uuid(),
                        &lease_secs,
                    ],
                )
                .await
                .map_err(query_error)?;
            if let Some(row) = rows.first() {
                let claimed: bool = row.get(0);
                return if claimed {
                    Ok(ClaimOutcome::Claimed)
                } else {
                    record_from_row(row, 1).map(ClaimOutcome::Existing)
                };
            }
        }
        Err(StoreError::Unavailable {
            backend: BACKEND,
            source: "the claim kept racing with concurrent claims of the same key".into(),
        })
    }

    async fn complete(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        token: LeaseToken,
        response: &StoredResponse,
        retention: Duration,
    ) -> Result<FenceOutcome, StoreError> {
        let (client, statement) = self.prepared(&self.inner.statements.complete).await?;
        let encoded = response.encode();
        let rows = client
            .execute(
                &statement,
                &[
                    &scope.as_str(),
                    &key.as_str(),
                    &token.as_uuid(),
                    &i32::from(response.status().as_u16()),
                    &&encoded[..],
                    &retention.as_secs_f64(),
                ],
            )
            .await
            .map_err(query_error)?;
        Ok(fenced(rows))
    }

    async fn extend(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        token: LeaseToken,
        lease: Duration,
    ) -> Result<FenceOutcome, StoreError> {
        let (client, statement) = self.prepared(&self.inner.statements.extend).await?;
        let rows = client
            .execute(
                &statement,
                &[
                    &scope.as_str(),
                    &key.as_str(),
                    &token.as_uuid(),
                    &lease.as_secs_f64(),
                ],
            )
            .await
            .map_err(query_error)?;
        Ok(fenced(rows))
    }

    async fn release(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        token: LeaseToken,
    ) -> Result<FenceOutcome, StoreError> {
        let (client, statement) = self.prepared(&self.inner.statements.release).await?;
        let rows = client
            .execute(
                &statement,
                &[&scope.as_str(), &key.as_str(), &token.as_uuid()],
            )
            .await
            .map_err(query_error)?;
        Ok(fenced(rows))
    }

    async fn get(&self, scope: &Scope, key: &IdempotencyKey) -> Result<Option<Record>, StoreError> {
        let (client, statement) = self.prepared(&self.inner.statements.get).await?;
        let row = client
            .query_opt(&statement, &[&scope.as_str(), &key.as_str()])
            .await
            .map_err(query_error)?;
        row.map(|row| record_from_row(&row, 0)).transpose()
    }

    async fn purge_expired(&self, limit: usize) -> Result<u64, StoreError> {
        let (client, statement) = self.prepared(&self.inner.statements.purge).await?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        client
            .execute(&statement, &[&limit])
            .await
            .map_err(query_error)
    }

    /// Unless turned off with [`PostgresStoreBuilder::transactions`]: a handler's writes and
    /// its stored response can commit in one transaction on the store's pool (see
    /// [`PgTransaction`]).
    fn transactional(&self) -> Option<&dyn TransactionalStore> {
        if self.inner.transactions {
            Some(self)
        } else {
            None
        }
    }
}
