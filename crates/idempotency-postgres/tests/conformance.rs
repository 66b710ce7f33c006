//! The conformance suite against the real PostgreSQL server, in each table mode. Every case
//! gets its own schema, dropped afterwards, so cases run in parallel.

use idempotency_conformance::env::{postgres_url, server_unreachable};
use idempotency_postgres::{PostgresStore, TableMode};
use std::sync::Arc;

async fn store(mode: TableMode) -> PostgresStore {
    let url = postgres_url();
    let schema = format!("idem_t_{}", uuid::Uuid::new_v4().simple());
    let store = PostgresStore::connect(&url)
        .schema(schema)
        .table_mode(mode)
        .pool_size(8)
        .build()
        .await
        .unwrap_or_else(|e| server_unreachable("PostgreSQL", &url, &e));
    store.migrate().await.expect("migrate a fresh schema");
    store
}

async fn drop_schema(store: Arc<PostgresStore>) {
    let client = store.pool().get().await.expect("connection for teardown");
    client
        .batch_execute(&format!("DROP SCHEMA \"{}\" CASCADE", store.schema()))
        .await
        .expect("drop the test schema");
}

mod unlogged {
    use super::*;
    idempotency_conformance::conformance_suite!(store(TableMode::Unlogged), drop_schema);
}

mod logged {
    use super::*;
    idempotency_conformance::conformance_suite!(store(TableMode::Logged), drop_schema);
}

mod logged_async_commit {
    use super::*;
    idempotency_conformance::conformance_suite!(store(TableMode::LoggedAsyncCommit), drop_schema);
}
