//! tokio-postgres and deadpool errors: as the store's setup error, and as the core `StoreError`.

use crate::error::{BACKEND, PostgresStoreError, is_transient_sqlstate};
use idempotency_core::StoreError;

impl From<deadpool_postgres::PoolError> for PostgresStoreError {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        PostgresStoreError::Pool(e)
    }
}

impl From<tokio_postgres::Error> for PostgresStoreError {
    fn from(e: tokio_postgres::Error) -> Self {
        PostgresStoreError::Query(e)
    }
}

/// Whether a statement error means "the server cannot answer now" (retryable).
fn is_transient(e: &tokio_postgres::Error) -> bool {
    if e.is_closed() {
        return true;
    }
    match e.code() {
        // No SQLSTATE: an I/O or protocol error on the connection.
        None => true,
        Some(code) => is_transient_sqlstate(code.code()),
    }
}

/// A statement error as a store error, retryable when the server cannot answer now.
pub(crate) fn query_error(e: tokio_postgres::Error) -> StoreError {
    StoreError::from_failure(BACKEND, is_transient(&e), e)
}

/// A pool error as a store error: the server's own error as [`query_error`] maps it; the rest
/// (a timeout, a closed pool) retryable.
pub(crate) fn pool_error(e: deadpool_postgres::PoolError) -> StoreError {
    use deadpool_postgres::PoolError;
    match e {
        PoolError::Backend(e) => query_error(e),
        other => StoreError::from_failure(BACKEND, true, other),
    }
}
