//! Errors of the Postgres store's setup, and their mapping to the core `StoreError`.

use idempotency_core::StoreError;

pub(crate) const BACKEND: &str = "postgres";

/// Why the Postgres store could not be built or migrated.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PostgresStoreError {
    /// The database URL could not be parsed.
    #[cfg(feature = "tokio-postgres")]
    #[error("invalid PostgreSQL URL: {0}")]
    InvalidUrl(#[source] tokio_postgres::Error),
    /// The TLS settings of the URL are invalid or cannot be honoured (a bad `sslmode`, an
    /// unreadable `sslrootcert`, TLS asked of a build without the `tls` feature).
    #[error("TLS settings: {0}")]
    InvalidTls(String),
    /// A schema or table name is not a plain identifier.
    #[error(
        "invalid {what} name {name:?}: use 1 to 48 ASCII letters, digits or underscores, not starting with a digit"
    )]
    InvalidIdentifier {
        /// `"schema"` or `"table"`.
        what: &'static str,
        /// The name given.
        name: String,
    },
    /// A table mode read from text is none of `unlogged`, `logged`, `logged_async_commit`.
    #[error("unknown table mode {0:?}: use unlogged, logged or logged_async_commit")]
    UnknownTableMode(String),
    /// The pg_cron schedule is empty or holds `$`, `;` or control characters.
    #[error("invalid pg_cron schedule {0:?}: use cron syntax such as \"0 * * * *\"")]
    InvalidPurgeSchedule(String),
    /// The connection pool could not be built.
    #[cfg(feature = "tokio-postgres")]
    #[error("could not build the connection pool")]
    BuildPool(#[source] deadpool_postgres::BuildError),
    /// No connection could be taken from the pool (the server is down, refuses us, or the pool is
    /// exhausted).
    #[cfg(feature = "tokio-postgres")]
    #[error("could not get a PostgreSQL connection")]
    Pool(#[source] deadpool_postgres::PoolError),
    /// A statement failed.
    #[cfg(feature = "tokio-postgres")]
    #[error("PostgreSQL statement failed")]
    Query(#[source] tokio_postgres::Error),
    /// A statement failed, or no connection could be taken from the sqlx pool (the sqlx
    /// flavour of the store).
    #[cfg(feature = "sqlx")]
    #[error("PostgreSQL statement failed (sqlx)")]
    Sqlx(#[source] sqlx::Error),
    /// The server answered a setup or status query with something the store cannot read.
    #[error("unexpected answer from PostgreSQL: {0}")]
    UnexpectedAnswer(String),
    /// The server is a hot standby or read replica.
    #[error(
        "the PostgreSQL server is a read-only standby (in recovery) or in read-only mode; \
         the idempotency table is UNLOGGED and standbys cannot read unlogged tables \
         (\"cannot access temporary or unlogged relations during recovery\") nor write at all. \
         Connect the store to the writer: the primary, or on Aurora the cluster (writer) \
         endpoint, never the reader endpoint"
    )]
    ReadOnlyServer,
    /// The table exists with the other persistence than configured.
    #[error(
        "table {table} is {found} but the store is configured for {expected}; \
         change it with `ALTER TABLE {table} SET {expected}` (rewrites the table under an \
         exclusive lock) or configure the store's TableMode to match"
    )]
    TableModeMismatch {
        /// The qualified table name.
        table: String,
        /// Configured persistence (`LOGGED` or `UNLOGGED`).
        expected: &'static str,
        /// Found persistence.
        found: &'static str,
    },
    /// `TableMode::LoggedAsyncCommit` with a caller-built pool whose connections do not run with
    /// `synchronous_commit = off`.
    #[error(
        "TableMode::LoggedAsyncCommit needs synchronous_commit = off on the store's connections, \
         but it is {found:?}; build the store from a URL (the store sets it), or add \
         `options=-c synchronous_commit=off` to your pool's connection config"
    )]
    SynchronousCommitOn {
        /// The setting found.
        found: String,
    },
}

#[cfg(feature = "sqlx")]
impl From<sqlx::Error> for PostgresStoreError {
    fn from(e: sqlx::Error) -> Self {
        PostgresStoreError::Sqlx(e)
    }
}

/// Whether a SQLSTATE means "the server cannot answer now" (retryable) rather than "the
/// statement or data is wrong": 08 connection exception, 53 insufficient resources, 57 operator
/// intervention (shutdown, crash, cannot connect now), 40 transaction rollback (serialization,
/// deadlock), 25006 read-only transaction (failover in progress).
pub(crate) fn is_transient_sqlstate(code: &str) -> bool {
    matches!(code.get(..2), Some("08" | "53" | "57" | "40")) || code == READ_ONLY_SQL_TRANSACTION
}

/// SQLSTATE 25006: a write in a read-only transaction.
const READ_ONLY_SQL_TRANSACTION: &str = "25006";

/// A setup statement's error (the sentinel check) as a store error, retryable as the
/// underlying driver error is.
pub(crate) fn setup_error(e: PostgresStoreError) -> StoreError {
    match e {
        #[cfg(feature = "tokio-postgres")]
        PostgresStoreError::Query(e) => query_error(e),
        #[cfg(feature = "tokio-postgres")]
        PostgresStoreError::Pool(e) => pool_error(e),
        #[cfg(feature = "sqlx")]
        PostgresStoreError::Sqlx(e) => sqlx_error(e),
        other => StoreError::from_failure(BACKEND, false, other),
    }
}

#[cfg(feature = "tokio-postgres")]
impl From<deadpool_postgres::PoolError> for PostgresStoreError {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        PostgresStoreError::Pool(e)
    }
}

#[cfg(feature = "tokio-postgres")]
impl From<tokio_postgres::Error> for PostgresStoreError {
    fn from(e: tokio_postgres::Error) -> Self {
        PostgresStoreError::Query(e)
    }
}

/// A tokio-postgres statement error as a store error, retryable when the server cannot answer
/// now: the connection closed, an I/O or protocol error (no SQLSTATE), or a transient SQLSTATE.
#[cfg(feature = "tokio-postgres")]
pub(crate) fn query_error(e: tokio_postgres::Error) -> StoreError {
    let transient = e.is_closed()
        || e.code()
            .is_none_or(|code| is_transient_sqlstate(code.code()));
    StoreError::from_failure(BACKEND, transient, e)
}

/// A deadpool error as a store error: the server's own error as [`query_error`] maps it; the
/// rest (a timeout, a closed pool) retryable.
#[cfg(feature = "tokio-postgres")]
pub(crate) fn pool_error(e: deadpool_postgres::PoolError) -> StoreError {
    use deadpool_postgres::PoolError;
    match e {
        PoolError::Backend(e) => query_error(e),
        other => StoreError::from_failure(BACKEND, true, other),
    }
}

/// An sqlx error as a store error, retryable when the server cannot answer now.
#[cfg(feature = "sqlx")]
pub(crate) fn sqlx_error(e: sqlx::Error) -> StoreError {
    let transient = match &e {
        sqlx::Error::Database(db) => db.code().is_some_and(|code| is_transient_sqlstate(&code)),
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::BeginFailed => true,
        _ => false,
    };
    StoreError::from_failure(BACKEND, transient, e)
}
