//! Through a real PgBouncer in transaction pooling mode (Debian's package, started by the
//! testkit in front of the shared server): with `prepared_statements=false` the whole suite
//! passes, and a handler's writes commit with its stored response.

mod postgres {
    use bytes::Bytes;
    use idempotency_core::http::{HeaderMap, StatusCode};
    use idempotency_core::{
        Begin, BodyCanonicalization, Completion, Engine, EngineConfig, Fingerprint, IdempotencyKey,
        KeyFormat, Scope, StoredResponse,
    };
    use idempotency_postgres::tokio_postgres::types::Type;
    use idempotency_postgres::{PostgresStore, PostgresTransaction, TableMode};
    use idempotency_testkit::env::postgres_url;
    use idempotency_testkit::{PoolMode, TempPgBouncer, TestSchema, drop_test_schema};

    fn bouncer() -> TempPgBouncer {
        let upstream: idempotency_postgres::tokio_postgres::Config = postgres_url()
            .parse()
            .expect("IDEMPOTENCY_TEST_POSTGRES_URL");
        let port = upstream.get_ports().first().copied().unwrap_or(5432);
        TempPgBouncer::start(port, PoolMode::Transaction)
            .unwrap_or_else(|e| panic!("could not start PgBouncer: {e}"))
    }

    async fn store(url: &str, mode: TableMode, schema: &str) -> PostgresStore {
        let store = PostgresStore::builder(format!("{url}?prepared_statements=false"))
            .schema(schema)
            .table_mode(mode)
            .pool_size(8)
            .build()
            .await
            .unwrap_or_else(|e| panic!("through PgBouncer: {}", idempotency_core::ErrorChain(&e)));
        store.migrate().await.expect("migrate through PgBouncer");
        store
    }

    /// A URL without `prepared_statements=false` in front of PgBouncer in transaction mode
    /// (whose server connections do not keep this client's prepared statements): the store
    /// notices the lost statement, sends it again unnamed, and sends every later statement
    /// unnamed. Before, most requests failed with `prepared statement "s0" does not exist`
    /// (503 at the layer).
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn without_the_setting_the_store_switches_to_unnamed_statements() {
        let bouncer = bouncer();
        let schema = TestSchema::new("idem_named");
        let store = PostgresStore::builder(bouncer.url("postgres"))
            .schema(schema.name())
            .pool_size(8)
            .build()
            .await
            .unwrap_or_else(|e| panic!("through PgBouncer: {}", idempotency_core::ErrorChain(&e)));
        store.migrate().await.expect("migrate through PgBouncer");
        let engine =
            Engine::new(store.clone(), EngineConfig::default()).expect("valid engine settings");
        let fp = Fingerprint::of_request("POST", "/", b"", BodyCanonicalization::Raw);
        let mut requests = tokio::task::JoinSet::new();
        for i in 0..64 {
            let engine = engine.clone();
            requests.spawn(async move {
                let scope = Scope::new("bouncer").expect("scope");
                let key =
                    IdempotencyKey::parse(format!("named-{i}").as_bytes(), KeyFormat::opaque())
                        .expect("key");
                let guard = match engine.begin(scope, key, fp).await {
                    Ok(Begin::Proceed(guard)) => guard,
                    other => return Err(format!("claim {i}: {other:?}")),
                };
                let response =
                    StoredResponse::new(StatusCode::CREATED, HeaderMap::new(), Bytes::new());
                match guard.complete(response).await {
                    Completion::Stored => Ok(()),
                    other => Err(format!("complete {i}: {other:?}")),
                }
            });
        }
        let failures: Vec<String> = requests
            .join_all()
            .await
            .into_iter()
            .filter_map(Result::err)
            .collect();
        assert!(failures.is_empty(), "{failures:#?}");
        drop_test_schema(schema.name()).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn the_suite_passes_through_pgbouncer_in_transaction_mode() {
        let bouncer = bouncer();
        let url = bouncer.url("postgres");
        for mode in [TableMode::Unlogged, TableMode::Logged] {
            let schema = TestSchema::new("idem_bouncer");
            let name = schema.name().to_owned();
            idempotency_conformance::run_conformance!(store(&url, mode, &name));
            schema.drop().await;
        }
    }

    /// The request's transaction through PgBouncer: BEGIN and the check pipelined, the handler's
    /// write (sent unnamed, as it must be behind a transaction pooler), the completion and
    /// COMMIT pipelined: both exist afterwards, and the retry replays.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_transaction_commits_with_its_response_through_pgbouncer() {
        let bouncer = bouncer();
        let schema = TestSchema::new("idem_bouncer_tx");
        let store = store(&bouncer.url("postgres"), TableMode::Unlogged, schema.name()).await;
        let client = store.pool().get().await.expect("connection");
        client
            .batch_execute(&format!(
                "CREATE TABLE \"{}\".side_effects (key text NOT NULL)",
                schema.name()
            ))
            .await
            .expect("side-effect table");
        drop(client);
        let engine =
            Engine::new(store.clone(), EngineConfig::default()).expect("valid engine settings");
        let fp = Fingerprint::of_request("POST", "/", b"", BodyCanonicalization::Raw);
        for _ in 0..20 {
            let scope = Scope::new("bouncer").expect("scope");
            let key = IdempotencyKey::parse(
                uuid::Uuid::new_v4().to_string().as_bytes(),
                KeyFormat::UuidV4,
            )
            .expect("key");
            let Begin::Proceed(guard) = engine
                .begin(scope.clone(), key.clone(), fp)
                .await
                .expect("begin")
            else {
                panic!("a fresh key proceeds")
            };
            {
                let tx = guard
                    .transaction()
                    .expect("a transaction")
                    .open::<PostgresTransaction>()
                    .await
                    .expect("open through PgBouncer");
                tx.execute_typed(
                    &format!(
                        "INSERT INTO \"{}\".side_effects (key) VALUES ($1)",
                        schema.name()
                    ),
                    &[(&key.as_str(), Type::TEXT)],
                )
                .await
                .expect("the handler's write");
            }
            let response = StoredResponse::new(
                StatusCode::CREATED,
                HeaderMap::new(),
                Bytes::from_static(b"ok"),
            );
            assert_eq!(guard.complete(response.clone()).await, Completion::Stored);
            match engine.begin(scope, key, fp).await.expect("begin") {
                Begin::Replay(stored) => assert_eq!(stored, response),
                other => panic!("the retry must replay, got {other:?}"),
            }
        }
        let client = store.pool().get().await.expect("connection");
        let rows: i64 = client
            .query_typed_one(
                &format!("SELECT count(*) FROM \"{}\".side_effects", schema.name()),
                &[],
            )
            .await
            .expect("count")
            .get(0);
        assert_eq!(rows, 20);
        drop(client);
        drop_test_schema(schema.name()).await;
    }
}
