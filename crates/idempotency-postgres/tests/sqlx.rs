//! The sqlx flavour keeps what the tokio-postgres flavour keeps beyond the conformance suite: the
//! same migrations and history, the writer check (a standby is refused), the asynchronous-commit
//! check, the mode check, and noticing a table emptied by a crash or a `TRUNCATE`.

mod postgres {
    use bytes::Bytes;
    use idempotency_core::http::{HeaderMap, StatusCode};
    use idempotency_core::store::{ClaimOutcome, FenceOutcome};
    use idempotency_core::{
        BodyCanonicalization, ClaimMode, ConfigError, Engine, EngineConfig, Fingerprint,
        IdempotencyKey, IdempotencyStore, KeyFormat, LeaseToken, Scope, StoredResponse,
    };
    use idempotency_postgres::sqlx::PgPool;
    use idempotency_postgres::sqlx::postgres::PgPoolOptions;
    use idempotency_postgres::{PostgresStore, PostgresStoreError, SqlxPostgresStore, TableMode};
    use idempotency_testkit::env::server_unreachable;
    use idempotency_testkit::{TempPostgres, TestSchema};
    use std::time::Duration;

    const HOUR: Duration = Duration::from_secs(3600);

    async fn pool(url: &str) -> PgPool {
        PgPoolOptions::new()
            .max_connections(4)
            .connect(url)
            .await
            .unwrap_or_else(|e| server_unreachable("PostgreSQL", url, &e))
    }

    fn key(i: usize) -> IdempotencyKey {
        IdempotencyKey::parse(format!("key-{i}").as_bytes(), KeyFormat::opaque())
            .expect("valid key")
    }

    fn fp() -> Fingerprint {
        Fingerprint::of_request("POST", "/tasks", b"{}", BodyCanonicalization::Raw)
    }

    async fn complete_records(store: &SqlxPostgresStore, scope: &Scope, n: usize) {
        for i in 0..n {
            let token = LeaseToken::new();
            let claimed = store.claim(scope, &key(i), &fp(), token, HOUR).await;
            assert_eq!(claimed.expect("claim"), ClaimOutcome::Claimed);
            let response =
                StoredResponse::new(StatusCode::CREATED, HeaderMap::new(), Bytes::from("done"));
            let completed = store.complete(scope, &key(i), token, &response, HOUR).await;
            assert_eq!(completed.expect("complete"), FenceOutcome::Applied);
        }
    }

    /// Both flavours render the same migration script (a lazy pool never connects; it needs a
    /// runtime).
    #[tokio::test]
    async fn both_flavours_render_the_same_migrations() {
        let tokio = PostgresStore::builder("postgres://unused")
            .schema("app")
            .table_mode(TableMode::Logged)
            .migration_sql()
            .expect("render");
        let sqlx = SqlxPostgresStore::builder_from_sqlx_pool(
            PgPoolOptions::new()
                .connect_lazy("postgres://unused")
                .expect("a lazy pool"),
        )
        .schema("app")
        .table_mode(TableMode::Logged)
        .migration_sql()
        .expect("render");
        assert_eq!(tokio, sqlx);
    }

    /// A table migrated by one flavour is up to date for the other (one history), and a mode
    /// that differs from the table's is refused by either.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_history_for_both_flavours_and_the_mode_is_checked() {
        let schema = TestSchema::new("idem_sqlx");
        let url = schema.url();
        let sqlx = SqlxPostgresStore::builder_from_sqlx_pool(pool(url).await)
            .schema(schema.name())
            .build()
            .await
            .expect("build");
        let report = sqlx.migrate().await.expect("migrate with sqlx");
        assert_eq!(report.applied.len(), 3, "{report}");
        let tokio = PostgresStore::builder(url)
            .schema(schema.name())
            .pool_size(1)
            .build()
            .await
            .expect("build");
        let report = tokio.migrate().await.expect("migrate with tokio-postgres");
        assert!(report.applied.is_empty(), "{report}");
        assert_eq!(sqlx.statements().claim, tokio.statements().claim);
        let unlogged = SqlxPostgresStore::builder_from_sqlx_pool(pool(url).await)
            .schema(schema.name())
            .table_mode(TableMode::Unlogged)
            .build()
            .await
            .expect("build");
        match unlogged.migrate().await {
            Err(PostgresStoreError::TableModeMismatch {
                expected, found, ..
            }) => assert_eq!((expected, found), ("UNLOGGED", "LOGGED")),
            other => panic!("a mode mismatch must be refused, got {other:?}"),
        }
        schema.drop().await;
    }

    /// `status()` and `record_times()` read the same through either flavour (one code over both
    /// drivers): a missing table, a migrated one, a completed record and an absent one.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn both_flavours_read_the_same_status_and_record_times() {
        let schema = TestSchema::new("idem_sqlxst");
        let url = schema.url();
        let sqlx = SqlxPostgresStore::builder_from_sqlx_pool(pool(url).await)
            .schema(schema.name())
            .build()
            .await
            .expect("build");
        let tokio = PostgresStore::builder(url)
            .schema(schema.name())
            .pool_size(1)
            .build()
            .await
            .expect("build");
        let missing = sqlx.status().await.expect("status");
        assert_eq!(missing.persistence, None);
        assert!(missing.applied.is_empty());
        assert_eq!(missing, tokio.status().await.expect("status"));

        sqlx.migrate().await.expect("migrate");
        let migrated = sqlx.status().await.expect("status");
        assert_eq!(migrated.persistence, Some("LOGGED"));
        assert!(
            !migrated.applied.is_empty() && migrated.pending.is_empty(),
            "{migrated}"
        );
        assert!(migrated.problems().is_empty(), "{:?}", migrated.problems());
        assert_eq!(migrated, tokio.status().await.expect("status"));

        let scope = Scope::new("user-1").expect("scope");
        complete_records(&sqlx, &scope, 1).await;
        let times = sqlx.record_times(&scope, &key(0)).await.expect("read");
        let times = times.expect("the completed record");
        assert!(times.created_at.ends_with('Z'), "{}", times.created_at);
        assert!(
            times.expires_in <= HOUR && times.expires_in > HOUR - Duration::from_secs(60),
            "{:?}",
            times.expires_in
        );
        let by_tokio = tokio.record_times(&scope, &key(0)).await.expect("read");
        assert_eq!(
            by_tokio.map(|t| t.created_at),
            Some(times.created_at.clone())
        );
        assert_eq!(
            sqlx.record_times(&scope, &key(1)).await.expect("read"),
            None
        );
        schema.drop().await;
    }

    /// LOGGED with asynchronous commit needs `synchronous_commit = off` on the pool's
    /// connections: a pool without it is refused, with the setting to add.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn async_commit_needs_the_setting_on_the_pool() {
        let url = idempotency_testkit::env::postgres_url();
        match SqlxPostgresStore::builder_from_sqlx_pool(pool(&url).await)
            .table_mode(TableMode::LoggedAsyncCommit)
            .build()
            .await
        {
            Err(e @ PostgresStoreError::SynchronousCommitOn { .. }) => {
                assert!(e.to_string().contains("synchronous_commit"), "{e}")
            }
            other => panic!("a synchronous pool must be refused, got {other:?}"),
        }
    }

    /// The claim modes sqlx cannot run are refused when the engine is built, never per request:
    /// the speculative mode (sqlx sends `BEGIN` on its own, so the key's lookup cannot ride the
    /// handler's first statement; before, it ran as the one-transaction mode while saying
    /// otherwise), and both one-transaction modes with transactions off. The one-transaction
    /// mode with transactions on is built.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_claim_modes_sqlx_cannot_run_are_refused_when_the_engine_is_built() {
        let schema = TestSchema::new("idem_sqlx");
        let store = |transactions: bool| {
            let url = schema.url().to_owned();
            let name = schema.name().to_owned();
            async move {
                SqlxPostgresStore::builder_from_sqlx_pool(pool(&url).await)
                    .schema(&name)
                    .transactions(transactions)
                    .build()
                    .await
                    .expect("build")
            }
        };
        let config = |mode| EngineConfig::default().claim_mode(mode);
        let refused = Engine::new(
            store(true).await,
            config(ClaimMode::OneTransactionSpeculative),
        )
        .expect_err("sqlx cannot speculate");
        assert_eq!(
            refused,
            ConfigError::SpeculativeUnsupported {
                backend: "postgres"
            }
        );
        assert!(
            refused
                .to_string()
                .contains("use ClaimMode::OneTransaction"),
            "{refused}"
        );
        let engine = Engine::new(store(true).await, config(ClaimMode::OneTransaction))
            .expect("sqlx runs the one-transaction mode");
        assert_eq!(engine.claim_mode(), ClaimMode::OneTransaction);
        for mode in [
            ClaimMode::OneTransaction,
            ClaimMode::OneTransactionSpeculative,
        ] {
            assert_eq!(
                Engine::new(store(false).await, config(mode)).expect_err("transactions are off"),
                ConfigError::OneTransactionUnsupported {
                    mode,
                    backend: "postgres"
                }
            );
        }
        schema.drop().await;
    }

    /// A `TRUNCATE` of the table is noticed by the next check and counted once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_emptied_table_is_noticed() {
        let schema = TestSchema::new("idem_sqlx");
        let store = SqlxPostgresStore::builder_from_sqlx_pool(pool(schema.url()).await)
            .schema(schema.name())
            .build()
            .await
            .expect("build");
        store.migrate().await.expect("migrate");
        let scope = Scope::new("user-1").expect("scope");
        complete_records(&store, &scope, 3).await;
        assert!(!store.check_state().await.expect("check"));
        idempotency_postgres::sqlx::raw_sql(&format!("TRUNCATE {}", store.table_name()))
            .execute(store.pool())
            .await
            .expect("truncate");
        assert!(store.check_state().await.expect("check"));
        assert!(!store.check_state().await.expect("check again"));
        assert_eq!(store.state_losses(), 1);
        schema.drop().await;
    }

    /// On a throwaway primary with a streaming standby: the standby is refused, naming the
    /// writer; after an immediate shutdown of the primary, a store built on a new pool notices
    /// that the UNLOGGED table was emptied, and the old pool's dead connections are retryable
    /// errors, never absent records.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_standby_is_refused_and_a_crash_is_noticed() {
        let primary = TempPostgres::start(&[])
            .unwrap_or_else(|e| panic!("could not start a throwaway PostgreSQL: {e}"));
        let url = primary.url("postgres");
        let store = SqlxPostgresStore::builder_from_sqlx_pool(pool(&url).await)
            .table_mode(TableMode::Unlogged)
            .build()
            .await
            .expect("build on the primary");
        store.migrate().await.expect("migrate");
        let scope = Scope::new("user-1").expect("scope");
        complete_records(&store, &scope, 10).await;

        let standby = primary
            .start_standby()
            .unwrap_or_else(|e| panic!("pg_basebackup standby: {e}\n{}", primary.log()));
        match SqlxPostgresStore::builder_from_sqlx_pool(pool(&standby.url("postgres")).await)
            .build()
            .await
        {
            Err(e @ PostgresStoreError::ReadOnlyServer) => {
                assert!(e.to_string().contains("writer"), "{e}")
            }
            other => panic!("a standby must be refused, got {other:?}"),
        }
        drop(standby);

        primary.crash().expect("pg_ctl stop -m immediate");
        primary.start_server().expect("restart after the crash");
        // The old pool's connections died with the server: errors, retryable, never "absent".
        match store.get(&scope, &key(0)).await {
            Err(e) => assert!(e.is_retryable(), "{e}"),
            // sqlx may already have replaced the dead connection; then the row is gone.
            Ok(record) => assert_eq!(record, None),
        }
        let after = SqlxPostgresStore::builder_from_sqlx_pool(pool(&url).await)
            .build()
            .await
            .expect("build after the crash");
        assert_eq!(after.state_losses(), 1, "the crash's loss is noticed");
        assert_eq!(after.get(&scope, &key(0)).await.expect("get"), None);
    }

    /// Checking the state of a table that was never migrated is an error that says so and is
    /// not retryable, on both flavours (retrying would not create the table).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn checking_a_missing_table_is_not_retryable() {
        let schema = TestSchema::new("idem_sqlx");
        let sqlx = SqlxPostgresStore::builder_from_sqlx_pool(pool(schema.url()).await)
            .schema(schema.name())
            .build()
            .await
            .expect("build");
        let tokio = PostgresStore::builder(schema.url())
            .schema(schema.name())
            .pool_size(1)
            .build()
            .await
            .expect("build");
        for (flavour, result) in [
            ("sqlx", sqlx.check_state().await),
            ("tokio-postgres", tokio.check_state().await),
        ] {
            match result {
                Err(e) => assert!(!e.is_retryable(), "{flavour}: {e}"),
                Ok(lost) => panic!("{flavour}: a missing table was checked: {lost}"),
            }
        }
        schema.drop().await;
    }
}
