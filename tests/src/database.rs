//! PostgreSQL for the tests: databases of their own, connections, migrated stores.

use idempotency::PostgresStore;
use idempotency_testkit::env::{postgres_url, server_unreachable};

/// A database of its own on the shared PostgreSQL server (the one `IDEMPOTENCY_TEST_POSTGRES_URL`
/// names), for tests that run the demo as a child process; dropped with
/// [`TestDatabase::drop`].
#[derive(Debug)]
pub struct TestDatabase {
    name: String,
    url: String,
}

impl TestDatabase {
    /// Creates `<prefix>_<random>`.
    pub async fn create(prefix: &str) -> TestDatabase {
        let admin = postgres_url();
        let name = format!("{prefix}_{}", uuid::Uuid::new_v4().simple());
        connect_postgres(&admin)
            .await
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .unwrap();
        let url = match admin.rsplit_once('/') {
            Some((server, _)) => format!("{server}/{name}"),
            None => panic!("IDEMPOTENCY_TEST_POSTGRES_URL must name a database: {admin}"),
        };
        TestDatabase { name, url }
    }

    /// Its URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// A new connection to it.
    pub async fn connect(&self) -> idempotency::postgres::tokio_postgres::Client {
        connect_postgres(&self.url).await
    }

    /// Drops it, closing the connections still open to it.
    pub async fn drop(self) {
        connect_postgres(&postgres_url())
            .await
            .batch_execute(&format!("DROP DATABASE {} WITH (FORCE)", self.name))
            .await
            .unwrap();
    }
}

/// A connection to `url`; a test fails with how to start the server when it is unreachable.
pub async fn connect_postgres(url: &str) -> idempotency::postgres::tokio_postgres::Client {
    use idempotency::postgres::tokio_postgres;
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| server_unreachable("PostgreSQL", url, &e));
    tokio::spawn(connection);
    client
}

/// A PostgreSQL store on a LOGGED key table in a schema of its own (dropped with the returned
/// [`TestSchema`](idempotency_testkit::TestSchema)), migrated; fails with how to start the
/// server when it cannot be reached.
pub async fn migrated_postgres_store(
    schema_prefix: &str,
) -> (PostgresStore, idempotency_testkit::TestSchema) {
    let schema = idempotency_testkit::TestSchema::new(schema_prefix);
    let url = schema.url();
    let store = PostgresStore::builder(url)
        .schema(schema.name())
        .table_mode(idempotency::TableMode::Logged)
        .build()
        .await
        .unwrap_or_else(|e| server_unreachable("PostgreSQL", url, &e));
    store.migrate().await.unwrap();
    (store, schema)
}

/// [`migrated_postgres_store`] with a `side_effects (body text)` table in the same schema,
/// standing in for a handler's business data; its qualified name.
pub async fn migrated_postgres_store_with_side_effects(
    schema_prefix: &str,
) -> (PostgresStore, idempotency_testkit::TestSchema, String) {
    let (store, schema) = migrated_postgres_store(schema_prefix).await;
    let table = format!("\"{}\".side_effects", schema.name());
    store
        .pool()
        .get()
        .await
        .unwrap()
        .batch_execute(&format!("CREATE TABLE {table} (body text NOT NULL)"))
        .await
        .unwrap();
    (store, schema, table)
}
