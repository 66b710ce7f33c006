//! Errors of the Redis store's setup, and the mapping of the driver's errors to `StoreError`.

use idempotency_core::StoreError;
use idempotency_core::store::CorruptRecord;
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
    /// The server (or a master of the cluster) has a `maxmemory-policy` that can evict
    /// idempotency records, and [`allow_eviction`](crate::RedisStoreBuilder::allow_eviction) was
    /// not given.
    #[error(
        "Redis at {node} has maxmemory-policy {policy}: under memory pressure it evicts idempotency \
         records, in-flight claims included, and their retries run the request again; set \
         maxmemory-policy noeviction (on ElastiCache: in the parameter group), or accept the risk \
         with RedisStoreBuilder::allow_eviction"
    )]
    EvictingPolicy {
        /// The node (its address on a cluster, `server` otherwise).
        node: String,
        /// Its `maxmemory-policy`.
        policy: String,
    },
    /// The server's eviction settings could not be read (`INFO memory`, `INFO stats`): the
    /// user may lack the permission (ACL `+info`).
    #[error("could not read Redis' eviction settings (INFO memory / INFO stats)")]
    Inspect(#[source] RedisError),
    /// [`wait_for_replicas`](crate::RedisStoreBuilder::wait_for_replicas) asks for more
    /// replicas than a master has connected, or for a timeout the response timeout would cut.
    #[error("wait_for_replicas: {0}")]
    ReplicaWait(String),
    /// TLS was asked for (`rediss://`, a root certificate) and cannot be given: the build lacks
    /// the `tls` feature, or the root certificate cannot be read.
    #[error("TLS settings: {0}")]
    InvalidTls(String),
}

pub(crate) fn redis_error(e: RedisError) -> StoreError {
    // At `maxmemory` under `noeviction` Redis refuses writes: the store is full until records
    // expire, which a retry later can get past (503 with Retry-After at the HTTP layer).
    if e.code() == Some("OOM") {
        return StoreError::Full {
            backend: BACKEND,
            reason: format!(
                "Redis is at maxmemory and refuses writes (maxmemory-policy noeviction): {e}"
            ),
        };
    }
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
