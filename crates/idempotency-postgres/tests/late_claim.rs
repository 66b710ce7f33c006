//! A claim whose caller gave up (the engine's store timeout) can still land: the client-side
//! timeout does not cancel the statement on the server. Here it waits on another transaction's
//! uncommitted row of the same key; the engine's background release meanwhile finds nothing to
//! release and stops; then the other transaction rolls back and the claim inserts its row. Before
//! issue 26 item 6 that row blocked the key for the claim's whole lease although no request held
//! it. Now the store sends the release on the claim's own connection, so the server runs it after
//! the claim, whenever the claim ends: the key is free as soon as the claim lands.

mod postgres {
    use idempotency_core::{
        Begin, BodyCanonicalization, Engine, EngineConfig, Fingerprint, IdempotencyKey,
        IdempotencyStore, KeyFormat, LeaseToken, Scope, StoreError,
    };
    use idempotency_postgres::tokio_postgres::{self, NoTls};
    use idempotency_postgres::{PostgresStore, TableMode};
    use idempotency_testkit::TestSchema;
    use idempotency_testkit::env::{postgres_url, server_unreachable};
    use std::time::Duration;

    /// The engine's store timeout: how long the claim is waited for.
    const STORE_TIMEOUT: Duration = Duration::from_millis(300);
    /// The lease the late claim would hold the key for.
    const LEASE: Duration = Duration::from_secs(30);

    fn fp() -> Fingerprint {
        Fingerprint::of_request("POST", "/tasks", b"{}", BodyCanonicalization::Raw)
    }

    /// Runs the scenario on `store`, whose claim statement is `claim_sql`.
    async fn a_claim_that_lands_after_its_caller_gave_up_is_released<S>(store: S, claim_sql: String)
    where
        S: IdempotencyStore + Clone + 'static,
    {
        let url = postgres_url();
        let (other, connection) = tokio_postgres::connect(&url, NoTls)
            .await
            .unwrap_or_else(|e| server_unreachable("PostgreSQL", &url, &e));
        tokio::spawn(connection);
        let claim_sql = claim_sql.replace("$5", "$5::float8");
        let scope = Scope::new("late-claim").expect("scope");
        let key = IdempotencyKey::parse(b"late-claim-key", KeyFormat::opaque()).expect("key");

        // Several idle connections in the pool, so a later call may take another connection
        // than the claim's (as under load).
        let warm = || store.get(&scope, &key);
        let _ = tokio::join!(warm(), warm(), warm(), warm());

        // Another transaction inserts the key and stays open: our claim will wait on its row.
        other.batch_execute("BEGIN").await.expect("BEGIN");
        other
            .query(
                &claim_sql,
                &[
                    &scope.as_str(),
                    &key.as_str(),
                    &fp().to_bytes().to_vec(),
                    &LeaseToken::new().as_uuid(),
                    &60.0f64,
                ],
            )
            .await
            .expect("the other transaction's claim");

        let engine = Engine::new(
            store.clone(),
            EngineConfig::default()
                .lease(LEASE)
                .store_timeout(STORE_TIMEOUT),
        )
        .expect("valid engine settings");
        let answer = engine.begin(scope.clone(), key.clone(), fp()).await;
        assert!(
            matches!(answer, Err(StoreError::Timeout { .. })),
            "the claim waits on the other transaction, past the store timeout: {answer:?}"
        );
        // The engine's release (fenced by the claim's token) has found nothing to release.
        tokio::time::sleep(Duration::from_millis(500)).await;

        // The other transaction gives the key up: the waiting claim inserts its row now.
        other.batch_execute("ROLLBACK").await.expect("ROLLBACK");

        // The late claim lands and its release runs after it on the same connection: within
        // moments (a busy machine may take a while), far from the claim's lease.
        let fresh = Engine::new(store, EngineConfig::default()).expect("valid engine settings");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            match fresh.begin(scope.clone(), key.clone(), fp()).await {
                Ok(Begin::Proceed(guard)) => {
                    drop(guard);
                    break;
                }
                Ok(Begin::InFlight { .. }) if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                other => panic!(
                    "the key must be free once the abandoned claim landed, not held for its \
                     {LEASE:?} lease: got {other:?}"
                ),
            }
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn on_tokio_postgres() {
        let schema = TestSchema::new("idem_late_tokio");
        let store = PostgresStore::builder(postgres_url())
            .schema(schema.name())
            .table_mode(TableMode::Logged)
            .build()
            .await
            .expect("store");
        store.migrate().await.expect("migrate");
        let claim = store.statements().claim.to_owned();
        a_claim_that_lands_after_its_caller_gave_up_is_released(store, claim).await;
        schema.drop().await;
    }

    #[cfg(feature = "sqlx")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn on_sqlx() {
        use idempotency_postgres::SqlxPostgresStore;
        use idempotency_postgres::sqlx::postgres::PgPoolOptions;
        let schema = TestSchema::new("idem_late_sqlx");
        let url = postgres_url();
        let pool = PgPoolOptions::new()
            .max_connections(4)
            .connect(&url)
            .await
            .unwrap_or_else(|e| server_unreachable("PostgreSQL", &url, &e));
        let store = SqlxPostgresStore::builder_from_sqlx_pool(pool)
            .schema(schema.name())
            .table_mode(TableMode::Logged)
            .build()
            .await
            .expect("store");
        store.migrate().await.expect("migrate");
        let claim = store.statements().claim.to_owned();
        a_claim_that_lands_after_its_caller_gave_up_is_released(store, claim).await;
        schema.drop().await;
    }
}
