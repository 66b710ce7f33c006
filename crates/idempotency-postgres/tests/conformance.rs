//! The conformance suite against the real PostgreSQL server, in each table mode, on both drivers
//! (tokio-postgres, and sqlx with the `sqlx` feature). Every case gets its own schema, dropped
//! afterwards, so cases run in parallel. UNLOGGED runs once more through the local replay tier.

mod postgres {
    use idempotency_postgres::{PostgresStore, TableMode};
    use idempotency_testkit::TestSchema;
    use idempotency_testkit::env::server_unreachable;
    use std::sync::Arc;

    pub(super) async fn store(mode: TableMode) -> PostgresStore {
        let schema = TestSchema::new("idem_t");
        let url = schema.url();
        let store = PostgresStore::builder(url)
            .schema(schema.name())
            .table_mode(mode)
            .pool_size(8)
            .build()
            .await
            .unwrap_or_else(|e| server_unreachable("PostgreSQL", url, &e));
        store.migrate().await.expect("migrate a fresh schema");
        store
    }

    async fn drop_schema(store: Arc<PostgresStore>) {
        idempotency_testkit::drop_test_schema(store.schema()).await;
    }

    mod unlogged {
        use super::*;
        idempotency_conformance::conformance_suite!(store(TableMode::Unlogged), drop_schema);
    }

    mod logged {
        use super::*;
        idempotency_conformance::conformance_suite!(store(TableMode::Logged), drop_schema);
    }

    /// The suite through the local replay tier (`idempotency_memory::ReplayTier`): a store
    /// with the tier in front must keep every invariant the store keeps alone.
    mod unlogged_through_the_replay_tier {
        use super::*;
        use idempotency_memory::ReplayTier;

        async fn tiered() -> ReplayTier<PostgresStore> {
            ReplayTier::new(store(TableMode::Unlogged).await)
        }

        async fn drop_tiered(tier: Arc<ReplayTier<PostgresStore>>) {
            idempotency_testkit::drop_test_schema(tier.store().schema()).await;
        }

        idempotency_conformance::conformance_suite!(tiered(), drop_tiered);
    }

    mod logged_async_commit {
        use super::*;
        idempotency_conformance::conformance_suite!(
            store(TableMode::LoggedAsyncCommit),
            drop_schema
        );
    }
}

/// The sqlx flavour, on a `sqlx::PgPool` as an application would build it, migrated by itself.
#[cfg(feature = "sqlx")]
mod sqlx {
    use idempotency_postgres::sqlx::postgres::{PgConnectOptions, PgPoolOptions};
    use idempotency_postgres::{SqlxPostgresStore, TableMode};
    use idempotency_testkit::TestSchema;
    use idempotency_testkit::env::server_unreachable;
    use std::sync::Arc;

    pub(super) async fn store(mode: TableMode) -> SqlxPostgresStore {
        let schema = TestSchema::new("idem_sqlx");
        let url = schema.url();
        let mut options: PgConnectOptions = url.parse().expect("a valid URL");
        if mode == TableMode::LoggedAsyncCommit {
            options = options.options([("synchronous_commit", "off")]);
        }
        let pool = PgPoolOptions::new()
            .max_connections(8)
            .connect_with(options)
            .await
            .unwrap_or_else(|e| server_unreachable("PostgreSQL", url, &e));
        let store = SqlxPostgresStore::builder_from_sqlx_pool(pool)
            .schema(schema.name())
            .table_mode(mode)
            .build()
            .await
            .expect("build the sqlx store");
        store.migrate().await.expect("migrate a fresh schema");
        store
    }

    async fn drop_schema(store: Arc<SqlxPostgresStore>) {
        store.pool().close().await;
        idempotency_testkit::drop_test_schema(store.schema()).await;
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
        idempotency_conformance::conformance_suite!(
            store(TableMode::LoggedAsyncCommit),
            drop_schema
        );
    }
}

/// The transactional cases on tokio-postgres (`PostgresTransaction`), in both claim modes, with an
/// UNLOGGED and a LOGGED key table. The side effects are rows of a `side_effects` table in the
/// case's own schema, written through the request's transaction.
mod transactional {
    use idempotency_conformance::transactional::TransactionalHarness;
    use idempotency_core::{BoxError, TransactionSlot};
    use idempotency_postgres::{PostgresStore, PostgresTransaction, TableMode};

    struct Harness {
        store: PostgresStore,
        side_effects: String,
    }

    async fn harness(mode: TableMode) -> Harness {
        let store = super::postgres::store(mode).await;
        let side_effects = format!("\"{}\".side_effects", store.schema());
        let client = store.pool().get().await.expect("a connection");
        client
            .batch_execute(&format!("CREATE TABLE {side_effects} (tag text NOT NULL)"))
            .await
            .expect("create the side-effects table");
        drop(client);
        Harness {
            store,
            side_effects,
        }
    }

    #[async_trait::async_trait]
    impl TransactionalHarness for Harness {
        type Store = PostgresStore;

        fn store(&self) -> PostgresStore {
            self.store.clone()
        }

        async fn write(&self, slot: &TransactionSlot, tag: &str) -> Result<(), BoxError> {
            let tx = slot.open::<PostgresTransaction>().await?;
            let sql = format!("INSERT INTO {} (tag) VALUES ($1)", self.side_effects);
            tx.execute(&sql, &[&tag]).await?;
            Ok(())
        }

        async fn count(&self, tag: &str) -> u64 {
            let client = self.store.pool().get().await.expect("a connection");
            let sql = format!("SELECT count(*) FROM {} WHERE tag = $1", self.side_effects);
            let n: i64 = client.query_one(&sql, &[&tag]).await.expect("count").get(0);
            u64::try_from(n).expect("a count is not negative")
        }

        async fn teardown(&self) {
            idempotency_testkit::drop_test_schema(self.store.schema()).await;
        }
    }

    mod unlogged {
        use super::*;
        idempotency_conformance::transactional_suite!(
            harness(TableMode::Unlogged),
            lease,
            one_transaction,
            speculative
        );
    }

    mod logged {
        use super::*;
        idempotency_conformance::transactional_suite!(
            harness(TableMode::Logged),
            lease,
            one_transaction,
            speculative
        );
    }
}

/// The transactional cases on sqlx (`SqlxPostgresTransaction`), in both claim modes: the same logic
/// as tokio-postgres's, over the other driver.
#[cfg(feature = "sqlx")]
mod sqlx_transactional {
    use idempotency_conformance::transactional::TransactionalHarness;
    use idempotency_core::{BoxError, TransactionSlot};
    use idempotency_postgres::{SqlxPostgresStore, SqlxPostgresTransaction, TableMode};

    struct Harness {
        store: SqlxPostgresStore,
        side_effects: String,
    }

    async fn harness(mode: TableMode) -> Harness {
        let store = super::sqlx::store(mode).await;
        let side_effects = format!("\"{}\".side_effects", store.schema());
        sqlx::query(&format!("CREATE TABLE {side_effects} (tag text NOT NULL)"))
            .execute(store.pool())
            .await
            .expect("create the side-effects table");
        Harness {
            store,
            side_effects,
        }
    }

    #[async_trait::async_trait]
    impl TransactionalHarness for Harness {
        type Store = SqlxPostgresStore;

        fn store(&self) -> SqlxPostgresStore {
            self.store.clone()
        }

        async fn write(&self, slot: &TransactionSlot, tag: &str) -> Result<(), BoxError> {
            let mut tx = slot.open::<SqlxPostgresTransaction>().await?;
            let sql = format!("INSERT INTO {} (tag) VALUES ($1)", self.side_effects);
            sqlx::query(&sql).bind(tag).execute(&mut **tx).await?;
            Ok(())
        }

        async fn count(&self, tag: &str) -> u64 {
            let sql = format!("SELECT count(*) FROM {} WHERE tag = $1", self.side_effects);
            let n: i64 = sqlx::query_scalar(&sql)
                .bind(tag)
                .fetch_one(self.store.pool())
                .await
                .expect("count");
            u64::try_from(n).expect("a count is not negative")
        }

        async fn teardown(&self) {
            self.store.pool().close().await;
            idempotency_testkit::drop_test_schema(self.store.schema()).await;
        }
    }

    mod logged {
        use super::*;
        idempotency_conformance::transactional_suite!(
            harness(TableMode::Logged),
            lease,
            one_transaction
        );
    }
}
