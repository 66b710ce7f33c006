//! Code written against an sqlx-only build of `idempotency-postgres` (default features off,
//! `sqlx` on), naming every driver-generic type the way such a build must. `.ci/run` checks it
//! alone (sqlx only) and the workspace builds it beside crates that turn `tokio-postgres` on:
//! Cargo unifies the features, and the code must mean the same in both builds (issue 47 item
//! 2: a plain `PostgresStore` once meant `PostgresStore<Sqlx>` here and
//! `PostgresStore<TokioPostgres>` there).

use idempotency_postgres::sqlx::PgPool;
use idempotency_postgres::{
    PostgresStore, PostgresStoreBuilder, PostgresStoreError, PostgresTransaction, Sqlx,
    SqlxPostgresStore, SqlxPostgresStoreBuilder, SqlxPostgresTransaction,
};

/// A store on the application's pool, named by its alias.
pub async fn store(pool: PgPool) -> Result<SqlxPostgresStore, PostgresStoreError> {
    let builder: SqlxPostgresStoreBuilder = PostgresStore::builder_from_sqlx_pool(pool);
    builder.build().await
}

/// The same store, named by the generic type and its driver.
pub fn generic(store: SqlxPostgresStore) -> PostgresStore<Sqlx> {
    store
}

/// The builder, named generically.
pub fn builder(pool: PgPool) -> PostgresStoreBuilder<Sqlx> {
    SqlxPostgresStore::builder_from_sqlx_pool(pool)
}

/// A handler's transaction type, by both of its names.
pub fn transaction(tx: SqlxPostgresTransaction) -> PostgresTransaction<Sqlx> {
    tx
}
