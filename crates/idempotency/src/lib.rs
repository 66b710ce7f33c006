//! Idempotency-Key handling for Rust web services: a retried `POST`, `PATCH` or `DELETE` runs
//! its side effect once, and the retry gets the first response back, byte for byte.
//!
//! Add this crate, pick a store with a feature, and wrap your router's routes in the layer:
//!
//! | feature | what it adds |
//! | --- | --- |
//! | `memory` (default) | the in-process store, and the local replay tier |
//! | `postgres` | the PostgreSQL store on tokio-postgres and deadpool-postgres |
//! | `sqlx` | the PostgreSQL store on your `sqlx::PgPool` (without tokio-postgres and deadpool) |
//! | `postgres-tls` | TLS for PostgreSQL (rustls; `sslmode` in the URL) |
//! | `redis` | the Redis store (single node and Cluster) |
//! | `redis-tls` | TLS for Redis (rustls; `rediss://`) |
//! | `axum` | the `Tx` extractor: a handler's writes in the request's idempotency transaction |
//! | `full` | all of the above |
//!
//! ```
//! use axum::{Router, routing::post};
//! use idempotency::{IdempotencyLayer, MemoryStore};
//!
//! let app: Router = Router::new()
//!     .route("/tasks", post(|| async { "created" }))
//!     .route_layer( // the matched routes only: an unknown path stays 404
//!         IdempotencyLayer::builder(MemoryStore::default())
//!             .scope_from_extension::<uuid::Uuid>() // the user id your auth layer inserted
//!             .build(),
//!     );
//! ```
//!
//! For several instances of a service, use a shared store: `PostgresStore` (the ADR's choice;
//! `SqlxPostgresStore` with the `sqlx` feature, on your app's `sqlx::PgPool`) or `RedisStore`. [`connect`] picks one from a URL at run time.
//!
//! Crates behind this one: [`idempotency_core`] (types, the store trait, the protocol engine),
//! [`idempotency_tower`] (the layer), and one crate per store.

#![cfg_attr(docsrs, feature(doc_cfg))]

/// `docs/http.md`, whose examples are compiled and run as this crate's doc tests.
#[cfg(all(doctest, feature = "axum", feature = "memory"))]
#[doc = include_str!("../../../docs/http.md")]
pub struct HttpGuide;

use std::sync::Arc;

pub use idempotency_core::*;
pub use idempotency_tower::{
    Final, IdempotencyBody, IdempotencyLayer, IdempotencyLayerBuilder, IdempotencyService,
    NotStored, Profile, Refusal, RefusalKind, RenderRefusal, RequestBody, ScopeNotSet, ScopeSet,
    problem_json, stripe_error,
};
#[cfg(feature = "axum")]
pub use idempotency_tower::{Tx, TxRejection};

#[cfg(feature = "memory")]
pub use idempotency_memory::{self as memory, MemoryStore, MemoryStoreBuilder, ReplayTier};
#[cfg(any(feature = "postgres", feature = "sqlx"))]
pub use idempotency_postgres::{self as postgres, TableMode};
#[cfg(feature = "postgres")]
pub use idempotency_postgres::{PgTransaction, PostgresStore};
#[cfg(feature = "sqlx")]
pub use idempotency_postgres::{SqlxPostgresStore, SqlxTransaction};
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
