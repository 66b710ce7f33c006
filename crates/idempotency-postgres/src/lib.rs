#![doc = include_str!("../README.md")]
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
//! # Two drivers, one store
//! [`PostgresStore<D>`](PostgresStore) is written once over a sealed [`Driver`]. The default,
//! `PostgresStore` = `PostgresStore<TokioPostgres>` (feature `tokio-postgres`, on by default),
//! runs on tokio-postgres with its own deadpool pool, pipelined transactions and TLS (`tls`).
//! With the `sqlx` feature, [`SqlxPostgresStore`] = `PostgresStore<Sqlx>` runs on an
//! application's existing `sqlx::PgPool`, and handlers write in a [`SqlxPostgresTransaction`] =
//! `PostgresTransaction<Sqlx>`; with default features off, an sqlx build compiles neither
//! tokio-postgres nor deadpool. A name means one type in every build: a plain `PostgresStore`
//! is always the tokio-postgres store (an sqlx-only build has no plain `PostgresStore`), so a
//! crate elsewhere in the dependency graph that turns `tokio-postgres` on changes no code's
//! meaning. Both send the same SQL text through the same store operations,
//! apply the same migrations by the same code, refuse a standby and notice a lost table the same
//! way; `docs/postgres.md` says how to choose.
//!
//! # Files, top-down
//! - the store: `store.rs` (`PostgresStore<D>` and the store trait), `builder.rs` (the settings
//!   both drivers share), `open_transaction.rs` (the handler's `PostgresTransaction<D>`: its writes
//!   and its response in one transaction; each claim mode's steps in a file of its own under
//!   `open_transaction/`: `lease.rs`, `one_transaction.rs`, `speculative.rs`), `tokio_store.rs` and `sqlx_store.rs` (what one driver alone
//!   offers: builders, its pool, the transaction's connection);
//! - written once over a driver: `primitives.rs` (the six store steps), `migrate.rs`,
//!   `status.rs`, `table.rs` (settings, rendered statements);
//! - the drivers: `driver.rs` (the interface), `tokio_driver/` (pool, statements, pipelining,
//!   TLS), `sqlx_driver/`;
//! - beneath them all: `schema.rs` (the SQL text of every statement; `schema/names.rs`: names
//!   and table modes), `record.rs` (a record from its columns), `sentinel.rs` (the sentinel that
//!   notices a table emptied by a crash), `session.rs` (setup statements), `error.rs`,
//!   `sqlstate.rs`.

// With neither driver (`--no-default-features`) the crate still builds: the schema, migrations
// and their rendering, with no store to run them.
#![cfg_attr(
    not(any(feature = "tokio-postgres", feature = "sqlx")),
    allow(dead_code, unused_imports, unused_macros)
)]

#[cfg(any(feature = "tokio-postgres", feature = "sqlx"))]
mod builder;
mod driver;
mod error;
#[cfg(any(feature = "tokio-postgres", feature = "sqlx"))]
mod flavour;
mod migrate;
#[cfg(any(feature = "tokio-postgres", feature = "sqlx"))]
mod open_transaction;
mod primitives;
mod record;
mod schema;
mod sentinel;
mod session;
mod sqlstate;
#[cfg(feature = "sqlx")]
mod sqlx_driver;
#[cfg(feature = "sqlx")]
mod sqlx_store;
mod status;
#[cfg(any(feature = "tokio-postgres", feature = "sqlx"))]
mod store;
mod table;
#[cfg(feature = "tokio-postgres")]
mod tokio_driver;
#[cfg(feature = "tokio-postgres")]
mod tokio_store;

#[cfg(any(feature = "tokio-postgres", feature = "sqlx"))]
pub use builder::PostgresStoreBuilder;
pub use driver::Driver;
pub use error::PostgresStoreError;
pub use migrate::{MigrationReport, PurgeJob};
#[cfg(any(feature = "tokio-postgres", feature = "sqlx"))]
pub use open_transaction::PostgresTransaction;
pub use schema::{StatementsSql, TableMode};
pub use sqlstate::is_permanent_sqlstate;
#[cfg(feature = "sqlx")]
pub use sqlx_driver::Sqlx;
#[cfg(feature = "sqlx")]
pub use sqlx_store::{SqlxPostgresStore, SqlxPostgresStoreBuilder, SqlxPostgresTransaction};
pub use status::{PurgeRun, PurgeStatus, RecordTimes, StoreStatus, TableContents};
#[cfg(any(feature = "tokio-postgres", feature = "sqlx"))]
pub use store::PostgresStore;
pub use table::{DEFAULT_PURGE_SCHEDULE, DEFAULT_TABLE};
#[cfg(feature = "raw-connection")]
pub use tokio_driver::connect_raw;
#[cfg(feature = "tokio-postgres")]
pub use tokio_driver::{SslMode, TokioPostgres};

/// The former name of [`PostgresTransaction`] (sqlx has a `PgTransaction` of its own).
#[cfg(feature = "tokio-postgres")]
#[deprecated(
    since = "0.1.0",
    note = "renamed `PostgresTransaction` (sqlx has a `PgTransaction` of its own)"
)]
pub type PgTransaction = PostgresTransaction<TokioPostgres>;
/// The former name of [`SqlxPostgresTransaction`].
#[cfg(feature = "sqlx")]
#[deprecated(
    since = "0.1.0",
    note = "renamed `SqlxPostgresTransaction`, after `SqlxPostgresStore`"
)]
pub type SqlxTransaction = SqlxPostgresTransaction;

#[cfg(feature = "sqlx")]
pub use sqlx;
#[cfg(feature = "tokio-postgres")]
pub use {deadpool_postgres, tokio_postgres};
