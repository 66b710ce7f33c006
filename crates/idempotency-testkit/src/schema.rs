//! A schema of its own on the shared PostgreSQL server, for a test or a bench.

use crate::env::{postgres_url, server_unreachable};

/// A fresh, randomly named schema on the shared server (`IDEMPOTENCY_TEST_POSTGRES_URL`): give
/// its [`name`](TestSchema::name) to the store under test, and [`drop`](TestSchema::drop) it at
/// the end. Tests that each use their own schema run in parallel against one server.
#[derive(Debug)]
pub struct TestSchema {
    name: String,
    url: String,
}

impl TestSchema {
    /// A new name, `<prefix>_<random>`; the store creates the schema when it migrates.
    pub fn new(prefix: &str) -> Self {
        TestSchema {
            name: format!("{prefix}_{}", uuid::Uuid::new_v4().simple()),
            url: postgres_url(),
        }
    }

    /// The schema's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The server's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Drops the schema and everything in it.
    pub async fn drop(self) {
        drop_test_schema(&self.name).await;
    }
}

/// Drops the schema `name` on the shared server, and everything in it (for a teardown that
/// only has the store, which knows its schema's name).
pub async fn drop_test_schema(name: &str) {
    let url = postgres_url();
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| server_unreachable("PostgreSQL", &url, &e));
    let connection = tokio::spawn(connection);
    if let Err(error) = client
        .batch_execute(&format!("DROP SCHEMA IF EXISTS \"{name}\" CASCADE"))
        .await
    {
        panic!("could not drop the test schema {name}: {error}");
    }
    drop(client);
    let _ = connection.await;
}
