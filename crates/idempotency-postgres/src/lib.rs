//! The PostgreSQL [`IdempotencyStore`](idempotency_core::IdempotencyStore): ADR 009's table, amended (LOGGED by default), on
//! tokio-postgres and deadpool-postgres. Every store step is one round trip; every time is the
//! database's `now()`.
//!
//! ```no_run
//! use idempotency_postgres::{PostgresStore, TableMode};
//!
//! # async fn run() -> Result<(), idempotency_postgres::PostgresStoreError> {
//! let store = PostgresStore::builder("postgres://app@db.internal/app")
//!     .table_mode(TableMode::Logged)   // the default (the ADR chose Unlogged)
//!     .build()
//!     .await?;                          // refuses a standby / reader endpoint; no DDL
//! let report = store.migrate().await?;  // idempotent, under an advisory lock
//! println!("{report}");                 // says whether the pg_cron purge job is scheduled
//! # Ok(()) }
//! ```
//!
//! # Guarantees
//! - Atomic claims: one `INSERT .. ON CONFLICT .. DO UPDATE .. WHERE expired` takes a free key
//!   or an expired one; a live row is returned unchanged.
//! - Fencing: `complete` and `release` match the lease token and a running lease.
//! - Expiry on read by the database clock; [`purge_expired`](idempotency_core::IdempotencyStore::purge_expired) and the optional
//!   pg_cron job only reclaim space.
//! - Writer only: a standby or read-only server is refused when the store is built.
//! - **Crash loss (UNLOGGED):** a crash or immediate shutdown of a community PostgreSQL server
//!   empties the table, so retries of requests that completed before it run again. LOGGED keeps
//!   every committed record; LOGGED with async commit may lose the last moments. On Aurora,
//!   unlogged tables survive failover (AWS docs), so only the lease frees stale claims.

//!
//! # Two drivers
//! `PostgresStore` runs on tokio-postgres and deadpool (feature `tokio-postgres`, on by
//! default: its own pool, pipelined transactions, TLS with `tls`). With the `sqlx` feature,
//! `SqlxPostgresStore` runs on an application's existing `sqlx::PgPool`, and handlers write in a
//! `sqlx::Transaction` (`SqlxTransaction`); with default features off, an sqlx build compiles
//! neither tokio-postgres nor deadpool. Both send the same SQL text through the same store
//! operations, apply the same migrations by the same code, refuse a standby and notice a lost
//! table the same way; `docs/postgres.md` says how to choose.
//!
//! # Files
//! Written once, over a small driver interface: `driver.rs` (the interface: query, execute,
//! begin with a statement, commit with a statement), `primitives.rs` (the six store steps),
//! `open_transaction.rs` (a handler's writes and its response in one transaction, both modes),
//! `schema.rs` (the SQL text of every statement; `schema/names.rs`: names and table modes),
//! `migrate.rs` (the numbered migrations and the policy that applies them), `table.rs`
//! (settings, statements, reading a record), `session.rs` (setup statements), `status.rs`
//! (what the server and table look like), `state.rs` (the sentinel that notices a table emptied
//! by a crash), `error.rs`. The drivers: `tokio_store/` and `sqlx_store/`.

// With neither driver (`--no-default-features`) the crate still builds: the schema, migrations
// and their rendering, with no store to run them.
#![cfg_attr(
    not(any(feature = "tokio-postgres", feature = "sqlx")),
    allow(dead_code, unused_imports, unused_macros)
)]

mod driver;
mod error;
mod migrate;
mod open_transaction;
mod primitives;
mod schema;
mod session;
mod sqlstate;
#[cfg(feature = "sqlx")]
mod sqlx_store;
mod state;
mod status;
mod table;
#[cfg(feature = "tokio-postgres")]
mod tokio_store;

pub use error::PostgresStoreError;
pub use migrate::{MigrationReport, PurgeJob};
pub use schema::{StatementsSql, TableMode};
pub use sqlstate::is_permanent_sqlstate;
pub use status::{PurgeStatus, RecordTimes, StoreStatus};
#[cfg(feature = "raw-connection")]
pub use tokio_store::connect_raw;
#[cfg(feature = "tokio-postgres")]
pub use tokio_store::{PgTransaction, PostgresStore, PostgresStoreBuilder, SslMode};
#[cfg(feature = "tokio-postgres")]
pub use {deadpool_postgres, tokio_postgres};

#[cfg(feature = "sqlx")]
pub use sqlx;
#[cfg(feature = "sqlx")]
pub use sqlx_store::{SqlxPostgresStore, SqlxPostgresStoreBuilder, SqlxTransaction};

/// The default table name (the ADR's).
pub const DEFAULT_TABLE: &str = "idempotency_keys";
/// The default pg_cron schedule of the purge job: hourly, as the ADR says.
pub const DEFAULT_PURGE_SCHEDULE: &str = "0 * * * *";
