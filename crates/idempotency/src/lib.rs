#![doc = include_str!("../README.md")]
//!
//! [`connect`] picks a store from a URL; [`idempotency_core`] and [`idempotency_tower`] are the
//! crates behind this one.

#![cfg_attr(docsrs, feature(doc_cfg))]

/// `docs/http.md`, whose examples are compiled and run as this crate's doc tests.
#[cfg(all(doctest, feature = "axum", feature = "memory"))]
#[doc = include_str!("../../../docs/http.md")]
pub struct HttpGuide;

/// `docs/handlers.md` (a PostgreSQL handler under contention), compiled as doc tests.
#[cfg(all(doctest, feature = "axum", feature = "postgres"))]
#[doc = include_str!("../../../docs/handlers.md")]
pub struct HandlersGuide;

/// `docs/calling-other-services.md` (keys for a handler's downstream calls), compiled as doc tests.
#[cfg(all(doctest, feature = "axum", feature = "memory"))]
#[doc = include_str!("../../../docs/calling-other-services.md")]
pub struct CallingOtherServicesGuide;

use std::sync::Arc;

// Re-exported by name and by audience, never by glob: a name added to core reaches the
// umbrella only when it is listed here.

// An HTTP application: the key, the scope and the fingerprint it covers, the claim and the
// transaction a handler sees, and the errors it may meet.
pub use idempotency_core::{
    BodyCanonicalization, ClaimMode, ConfigError, DerivedKey, Drain, ErrorChain, FingerprintSpec,
    IDEMPOTENCY_REFUSAL, IDEMPOTENT_REPLAYED, IdempotencyKey, IdempotencyStore, JsonPointer,
    JsonPointerError, KeyClaim, KeyError, KeyFormat, LeaseToken, MAX_KEY_LEN, MAX_SCOPE_LEN,
    ReplayPolicy, Scope, ScopeError, StoreError, Transaction, TransactionAdmission,
    TransactionError, TransactionSlot, purge_periodically, redact_credentials,
};
// Jobs and messages (`Engine::once`), and driving the engine by hand (`Engine::begin`, whose
// request is a `Fingerprint` and whose answer a `StoredResponse`).
/// The readiness probe, the histogram buckets, the gauges' names and the store's footprint, as
/// `idempotency_core::monitoring`.
pub use idempotency_core::monitoring;
/// `Engine::once` and its context, as `idempotency_core::once`.
pub use idempotency_core::once;
/// What a store author (or a benchmark calling a store's primitives) needs:
/// `use idempotency::store::*;`, as `idempotency_core::store`.
pub use idempotency_core::store;
pub use idempotency_core::{
    Begin, BoxError, Completion, Engine, EngineConfig, Fingerprint, Guard, KeyStatus, OnceContext,
    OnceError, Outcome, Replayed, RollbackCause, ScopeLimit, StoredResponse, Superseded,
};
/// Re-exported so users name the same `http` and `bytes` versions.
pub use idempotency_core::{bytes, http};
#[cfg(feature = "axum")]
pub use idempotency_tower::{Claim, KeyClaimRejection, Tx, TxRejection};
pub use idempotency_tower::{
    Final, IdempotencyBody, IdempotencyLayer, IdempotencyLayerBuilder, IdempotencyService,
    KeyStatusService, NotStored, Profile, Refusal, RefusalKind, RenderRefusal, RequestBody,
    ScopeNotSet, ScopeSet, problem_json, stripe_error,
};

#[cfg(feature = "memory")]
pub use idempotency_memory::{self as memory, MemoryStore, MemoryStoreBuilder, ReplayTier};
#[cfg(feature = "postgres")]
#[allow(deprecated)]
pub use idempotency_postgres::PgTransaction;
#[cfg(feature = "sqlx")]
#[allow(deprecated)]
pub use idempotency_postgres::SqlxTransaction;
#[cfg(any(feature = "postgres", feature = "sqlx"))]
pub use idempotency_postgres::{self as postgres, TableMode};
#[cfg(feature = "postgres")]
pub use idempotency_postgres::{PostgresStore, PostgresTransaction};
#[cfg(feature = "sqlx")]
pub use idempotency_postgres::{SqlxPostgresStore, SqlxPostgresTransaction};
#[cfg(feature = "redis")]
pub use idempotency_redis::{self as redis, RedisStore};

/// Why [`connect`] could not make a store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The URL's scheme names no store this build has (see the crate features). Holds the
    /// scheme only, never the rest of the URL (which may carry a password).
    #[error(
        "unsupported store {0:?}: use `memory`, `postgres://...` (feature `postgres`) or `redis://...` (feature `redis`)"
    )]
    Unsupported(String),
    /// The PostgreSQL store could not be built.
    #[cfg(feature = "postgres")]
    #[error(transparent)]
    Postgres(#[from] idempotency_postgres::PostgresStoreError),
    /// The Redis store could not connect.
    #[cfg(feature = "redis")]
    #[error(transparent)]
    Redis(#[from] idempotency_redis::RedisStoreError),
}

/// Makes a store from a URL: `memory`, `postgres://...` / `postgresql://...` (TLS per
/// `sslmode`, feature `postgres-tls`), `redis://...` / `rediss://...` (TLS: feature `redis-tls`),
/// or a cluster, `redis+cluster://[user:password@]host1:port,host2:port` (`rediss+cluster://` for
/// TLS; the credentials apply to every node). Runs no DDL: create the PostgreSQL table with
/// `PostgresStore::migrate` (or the migrations' SQL) first.
pub async fn connect(url: &str) -> Result<Arc<dyn IdempotencyStore>, ConnectError> {
    let scheme = url.split_once("://").map_or(url, |(scheme, _)| scheme);
    match scheme {
        #[cfg(feature = "memory")]
        "memory" => Ok(Arc::new(MemoryStore::default())),
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => Ok(Arc::new(PostgresStore::connect(url).await?)),
        #[cfg(feature = "redis")]
        "redis" | "rediss" => Ok(Arc::new(RedisStore::connect(url).await?)),
        #[cfg(feature = "redis")]
        "redis+cluster" | "rediss+cluster" => Ok(Arc::new(
            RedisStore::connect_cluster(cluster_nodes(url)).await?,
        )),
        _ => Err(ConnectError::Unsupported(
            redact_credentials(scheme).into_owned(),
        )),
    }
}

/// `redis+cluster://[auth@]h1:p1,h2:p2` as one URL per node, each with the credentials.
#[cfg(any(feature = "redis", test))]
fn cluster_nodes(url: &str) -> Vec<String> {
    let (scheme, rest) = url.split_once("://").unwrap_or(("redis+cluster", url));
    let node_scheme = if scheme.starts_with("rediss") {
        "rediss"
    } else {
        "redis"
    };
    let (auth, hosts) = match rest.rsplit_once('@') {
        Some((auth, hosts)) => (format!("{auth}@"), hosts),
        None => (String::new(), rest),
    };
    hosts
        .split(',')
        .filter(|host| !host.is_empty())
        .map(|host| format!("{node_scheme}://{auth}{host}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::cluster_nodes;

    #[test]
    fn every_cluster_node_gets_the_credentials_and_the_scheme() {
        assert_eq!(
            cluster_nodes("redis+cluster://app:s3cret@10.0.0.1:6379,10.0.0.2:6379"),
            [
                "redis://app:s3cret@10.0.0.1:6379",
                "redis://app:s3cret@10.0.0.2:6379"
            ]
        );
        assert_eq!(
            cluster_nodes("rediss+cluster://n1:6380,n2:6380"),
            ["rediss://n1:6380", "rediss://n2:6380"]
        );
    }
}
