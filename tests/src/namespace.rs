//! Where a scenario's records live: a backend and a fresh namespace in it.

use idempotency::{IdempotencyStore, MemoryStore, PostgresStore, RedisStore};
use idempotency_testkit::env::{postgres_url, redis_url, server_unreachable};
use std::sync::Arc;

/// Which store a scenario runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// In-process moka.
    Memory,
    /// The shared PostgreSQL server, a fresh schema per scenario.
    Postgres,
    /// The shared Redis server, a fresh key prefix per scenario.
    Redis,
}

/// A fresh place in a backend: stores made from one namespace share records (except memory,
/// where every store is its own process-local map, as in production).
#[derive(Debug)]
pub struct Namespace {
    backend: Backend,
    name: String,
}

impl Namespace {
    /// A new random namespace.
    pub fn new(backend: Backend) -> Self {
        Namespace {
            backend,
            name: format!("idem_e2e_{}", uuid::Uuid::new_v4().simple()),
        }
    }

    /// A new store instance (its own pool or connection) on this namespace.
    pub async fn store(&self) -> Arc<dyn IdempotencyStore> {
        match self.backend {
            Backend::Memory => Arc::new(MemoryStore::default()),
            Backend::Postgres => {
                let url = postgres_url();
                let store = PostgresStore::builder(&url)
                    .schema(&self.name)
                    .pool_size(16)
                    .build()
                    .await
                    .unwrap_or_else(|e| server_unreachable("PostgreSQL", &url, &e));
                store.migrate().await.unwrap();
                Arc::new(store)
            }
            Backend::Redis => {
                let url = redis_url();
                Arc::new(
                    RedisStore::builder(&url)
                        .key_prefix(format!("{}:", self.name))
                        .build()
                        .await
                        .unwrap_or_else(|e| server_unreachable("Redis", &url, &e)),
                )
            }
        }
    }

    /// Removes what the namespace left on the server (the Postgres schema; Redis keys expire).
    pub async fn cleanup(self) {
        if self.backend == Backend::Postgres {
            idempotency_testkit::drop_test_schema(&self.name).await;
        }
    }
}
