//! Errors of the Redis store's setup, and the mapping of the driver's errors to `StoreError`.

use idempotency_core::{CorruptRecord, StoreError};
use redis::RedisError;

pub(crate) const BACKEND: &str = "redis";

/// Why the Redis store could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RedisStoreError {
    /// The URL is invalid or the server could not be reached.
    #[error("could not connect to Redis")]
    Connect(#[source] RedisError),
    /// The key prefix contains `{` or `}`, which would take over the cluster hash tag.
    #[error("the key prefix {0:?} must not contain '{{' or '}}'")]
    InvalidPrefix(String),
    /// TLS was asked for (`rediss://`, a root certificate) and cannot be given: the build lacks
    /// the `tls` feature, or the root certificate cannot be read.
    #[error("TLS settings: {0}")]
    InvalidTls(String),
}

pub(crate) fn redis_error(e: RedisError) -> StoreError {
    let transient = e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_cluster_error()
        || !e.is_unrecoverable_error() && !matches!(e.retry_method(), redis::RetryMethod::NoRetry);
    StoreError::from_failure(BACKEND, transient, e)
}

pub(crate) fn corrupt(what: &'static str) -> StoreError {
    StoreError::corrupt(BACKEND, CorruptRecord::Field(what))
}
