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
//! [`PostgresStore`] runs on tokio-postgres and deadpool (its own pool, pipelined
//! transactions). With the `sqlx` feature, `SqlxPostgresStore` runs on an application's
//! existing `sqlx::PgPool`, and handlers write in a `sqlx::Transaction` (`SqlxTransaction`).
//! Both send the same SQL text, apply the same migrations by the same code, refuse a standby and
//! notice a lost table the same way; `docs/postgres.md` says how to choose.
//!
//! # Files
//! `builder.rs` (pool, settings, writer check), `store.rs` (the six primitives),
//! `transaction.rs` (a handler's writes and its response in one transaction), `migrate.rs` (the
//! numbered migrations and the policy that applies them), `schema.rs` (names, modes, the SQL of
//! every statement), `table.rs` (what both drivers share: settings, statements, reading a
//! record), `session.rs` (setup statements over either driver), `state.rs` (the sentinel that
//! notices a table emptied by a crash), `error.rs`; `sqlx_store/` (the sqlx flavour).

mod builder;
mod driver;
mod error;
mod migrate;
mod open_transaction;
mod primitives;
mod schema;
mod session;
#[cfg(feature = "sqlx")]
mod sqlx_store;
mod state;
mod status;
mod store;
mod table;
mod tls;
mod transaction;

pub use builder::PostgresStoreBuilder;
pub use error::PostgresStoreError;
pub use migrate::{MigrationReport, PurgeJob};
pub use schema::TableMode;
pub use status::{PurgeStatus, RecordTimes, StoreStatus};
pub use store::{PostgresStore, StatementsSql};
pub use tls::SslMode;
#[cfg(feature = "raw-connection")]
pub use tls::connect_raw;
pub use transaction::PgTransaction;
pub use {deadpool_postgres, tokio_postgres};

#[cfg(feature = "sqlx")]
pub use sqlx;
#[cfg(feature = "sqlx")]
pub use sqlx_store::{SqlxPostgresStore, SqlxPostgresStoreBuilder, SqlxTransaction};

/// The default table name (the ADR's).
pub const DEFAULT_TABLE: &str = "idempotency_keys";
/// The default pg_cron schedule of the purge job: hourly, as the ADR says.
pub const DEFAULT_PURGE_SCHEDULE: &str = "0 * * * *";
