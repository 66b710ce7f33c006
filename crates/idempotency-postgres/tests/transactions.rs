//! Transactional completion against the real server, in every table mode and on both drivers
//! (tokio-postgres's `PostgresTransaction`, sqlx's `SqlxPostgresTransaction`): the handler's writes and the
//! stored response commit together or not at all, whatever happens before the commit. Each test
//! gets its own schema with a `side_effects` table standing in for business data; each case is
//! written once, generic over the driver.

mod postgres {
    use bytes::Bytes;
    use idempotency_core::http::{HeaderMap, StatusCode};
    use idempotency_core::store::StoreTransaction;
    use idempotency_core::{
        Begin, BodyCanonicalization, ClaimMode, Completion, Engine, EngineConfig, Fingerprint,
        Guard, IdempotencyKey, IdempotencyStore, KeyFormat, KeyStatus, RollbackCause, Scope,
        StoredResponse, Superseded, TransactionError, TransactionSlot,
    };
    use idempotency_postgres::{PostgresStore, PostgresTransaction, TableMode};
    use idempotency_testkit::TestSchema;
    use idempotency_testkit::env::{postgres_url, server_unreachable};
    use std::time::Duration;

    const MODES: [TableMode; 3] = [
        TableMode::Unlogged,
        TableMode::Logged,
        TableMode::LoggedAsyncCommit,
    ];

    /// What the cases need of a driver: its store, and a handler's statements in its transaction.
    #[async_trait::async_trait]
    trait Driver: IdempotencyStore + Clone + Sized + 'static {
        /// The driver's transaction type.
        type Tx: StoreTransaction;
        /// A store on `schema`.
        async fn build(url: &str, schema: &str, mode: TableMode, transactions: bool) -> Self;
        /// The store's own migration.
        async fn migrate_table(&self);
        /// Runs `sql` (`$1` = `key`) in the request's transaction; whether it succeeded.
        async fn try_write(slot: &TransactionSlot, sql: &str, key: &str) -> bool;
        /// Runs `sql` (`$1` = `key`) in the request's transaction, which must succeed.
        async fn write(slot: &TransactionSlot, sql: &str, key: &str) {
            assert!(
                Self::try_write(slot, sql, key).await,
                "write in the transaction"
            );
        }
        /// Runs `sql` (no parameters, maybe several statements) in the request's transaction.
        async fn raw(slot: &TransactionSlot, sql: &str);
        /// Whether a connection of the store's pool is inside a transaction.
        async fn pool_has_open_transaction(&self) -> bool;
        /// Runs `sql` on a connection of the store's pool.
        async fn sql(&self, sql: &str);
        /// The first column of the first row of `sql` (`$1` = `key`), a count.
        async fn count(&self, sql: &str, key: &str) -> i64;
    }

    /// The probe of `pool_has_open_transaction`: over the simple protocol, a statement outside a
    /// transaction starts its own, so its start and the transaction's are the same instant;
    /// inside an older transaction they differ.
    const IN_TRANSACTION: &str = "SELECT now() <> statement_timestamp()";

    #[async_trait::async_trait]
    impl Driver for PostgresStore {
        type Tx = PostgresTransaction;

        async fn build(url: &str, schema: &str, mode: TableMode, transactions: bool) -> Self {
            PostgresStore::builder(url)
                .schema(schema)
                .table_mode(mode)
                .pool_size(4)
                .transactions(transactions)
                .build()
                .await
                .unwrap_or_else(|e| server_unreachable("PostgreSQL", url, &e))
        }

        async fn migrate_table(&self) {
            self.migrate().await.expect("migrate a fresh schema");
        }

        async fn try_write(slot: &TransactionSlot, sql: &str, key: &str) -> bool {
            let tx = slot
                .open::<PostgresTransaction>()
                .await
                .expect("open the transaction");
            tx.execute(sql, &[&key]).await.is_ok()
        }

        async fn raw(slot: &TransactionSlot, sql: &str) {
            let tx = slot
                .open::<PostgresTransaction>()
                .await
                .expect("open the transaction");
            tx.batch_execute(sql).await.expect("run in the transaction");
        }

        async fn pool_has_open_transaction(&self) -> bool {
            let mut clients = Vec::new();
            for _ in 0..4 {
                clients.push(self.pool().get().await.expect("connection"));
            }
            for client in &clients {
                let rows = client
                    .simple_query(IN_TRANSACTION)
                    .await
                    .expect("probe the connection");
                let in_transaction = rows.iter().any(|m| match m {
                    tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0) == Some("t"),
                    _ => false,
                });
                if in_transaction {
                    return true;
                }
            }
            false
        }

        async fn sql(&self, sql: &str) {
            let client = self.pool().get().await.expect("connection");
            client.batch_execute(sql).await.expect("run SQL");
        }

        async fn count(&self, sql: &str, key: &str) -> i64 {
            let client = self.pool().get().await.expect("connection");
            client.query_one(sql, &[&key]).await.expect("count").get(0)
        }
    }

    #[cfg(feature = "sqlx")]
    #[async_trait::async_trait]
    impl Driver for idempotency_postgres::SqlxPostgresStore {
        type Tx = idempotency_postgres::SqlxPostgresTransaction;

        async fn build(url: &str, schema: &str, mode: TableMode, transactions: bool) -> Self {
            use idempotency_postgres::sqlx::postgres::{PgConnectOptions, PgPoolOptions};
            let mut options: PgConnectOptions = url.parse().expect("a valid URL");
            if mode == TableMode::LoggedAsyncCommit {
                options = options.options([("synchronous_commit", "off")]);
            }
            let pool = PgPoolOptions::new()
                .max_connections(4)
                .connect_with(options)
                .await
                .unwrap_or_else(|e| server_unreachable("PostgreSQL", url, &e));
            idempotency_postgres::SqlxPostgresStore::builder_from_sqlx_pool(pool)
                .schema(schema)
                .table_mode(mode)
                .transactions(transactions)
                .build()
                .await
                .expect("build the sqlx store")
        }

        async fn migrate_table(&self) {
            self.migrate().await.expect("migrate a fresh schema");
        }

        async fn try_write(slot: &TransactionSlot, sql: &str, key: &str) -> bool {
            let mut tx = slot
                .open::<idempotency_postgres::SqlxPostgresTransaction>()
                .await
                .expect("open the transaction");
            idempotency_postgres::sqlx::query(sql)
                .bind(key)
                .execute(&mut **tx)
                .await
                .is_ok()
        }

        async fn raw(slot: &TransactionSlot, sql: &str) {
            let mut tx = slot
                .open::<idempotency_postgres::SqlxPostgresTransaction>()
                .await
                .expect("open the transaction");
            // `Executor::execute` on the connection: `raw_sql(..).execute(conn)` inside an
            // async-trait future trips sqlx's higher-ranked `Executor` bound.
            use idempotency_postgres::sqlx::Executor;
            let connection: &mut idempotency_postgres::sqlx::PgConnection = &mut tx;
            connection
                .execute(idempotency_postgres::sqlx::raw_sql(sql))
                .await
                .expect("run in the transaction");
        }

        async fn pool_has_open_transaction(&self) -> bool {
            let mut connections = Vec::new();
            for _ in 0..4 {
                connections.push(self.pool().acquire().await.expect("connection"));
            }
            for connection in &mut connections {
                use idempotency_postgres::sqlx::{Executor, Row};
                let connection: &mut idempotency_postgres::sqlx::PgConnection = connection;
                let row = connection
                    .fetch_one(idempotency_postgres::sqlx::raw_sql(IN_TRANSACTION))
                    .await
                    .expect("probe the connection");
                let in_transaction: bool = row.try_get(0).expect("a boolean");
                if in_transaction {
                    return true;
                }
            }
            false
        }

        async fn sql(&self, sql: &str) {
            idempotency_postgres::sqlx::raw_sql(sql)
                .execute(self.pool())
                .await
                .expect("run SQL");
        }

        async fn count(&self, sql: &str, key: &str) -> i64 {
            idempotency_postgres::sqlx::query_scalar(sql)
                .bind(key)
                .fetch_one(self.pool())
                .await
                .expect("count")
        }
    }

    struct Fixture<S> {
        store: S,
        schema: String,
    }

    impl<S: Driver> Fixture<S> {
        async fn new(mode: TableMode) -> Fixture<S> {
            let test_schema = TestSchema::new("idem_tx");
            let (url, schema) = (test_schema.url(), test_schema.name().to_owned());
            let store = S::build(url, &schema, mode, true).await;
            store.migrate_table().await;
            let f = Fixture { store, schema };
            f.sql("CREATE TABLE \"{schema}\".side_effects (key text NOT NULL)")
                .await;
            f
        }

        /// The claim modes the driver runs: all three on tokio-postgres; sqlx cannot speculate
        /// (the engine refuses the speculative mode there).
        fn claim_modes(&self) -> Vec<ClaimMode> {
            let speculates = self
                .store
                .transactional()
                .is_some_and(|store| store.supports_speculative());
            [
                ClaimMode::Lease,
                ClaimMode::OneTransaction,
                ClaimMode::OneTransactionSpeculative,
            ]
            .into_iter()
            .filter(|mode| speculates || *mode != ClaimMode::OneTransactionSpeculative)
            .collect()
        }

        fn engine(&self, config: EngineConfig) -> Engine<S> {
            Engine::new(self.store.clone(), config).expect("valid engine settings")
        }

        /// How many side effects `key` has.
        async fn side_effects(&self, key: &IdempotencyKey) -> i64 {
            let sql = format!(
                "SELECT count(*) FROM \"{}\".side_effects WHERE key = $1",
                self.schema
            );
            self.store.count(&sql, key.as_str()).await
        }

        /// Runs SQL on a pooled connection; `{schema}` is the test's schema.
        async fn sql(&self, sql: &str) {
            self.store.sql(&sql.replace("{schema}", &self.schema)).await;
        }

        /// Every pooled connection is outside any transaction (none went back to the pool open).
        async fn assert_pool_clean(&self) {
            assert!(
                !self.store.pool_has_open_transaction().await,
                "a connection went back to the pool inside a transaction"
            );
        }

        async fn drop(self) {
            idempotency_testkit::drop_test_schema(&self.schema).await;
        }
    }

    fn scope() -> Scope {
        Scope::new(format!("tx:{}", uuid::Uuid::new_v4())).expect("valid scope")
    }

    fn key() -> IdempotencyKey {
        IdempotencyKey::parse(
            uuid::Uuid::new_v4().to_string().as_bytes(),
            KeyFormat::UuidV4,
        )
        .expect("valid key")
    }

    fn fp() -> Fingerprint {
        Fingerprint::of_request("POST", "/tasks", b"{}", BodyCanonicalization::Raw)
    }

    fn response(status: u16) -> StoredResponse {
        StoredResponse::new(
            StatusCode::from_u16(status).expect("valid status"),
            HeaderMap::new(),
            Bytes::from_static(b"{\"id\":1}"),
        )
    }

    async fn proceed<S: Driver>(
        engine: &Engine<S>,
        scope: &Scope,
        key: &IdempotencyKey,
    ) -> Guard<S> {
        match engine
            .begin(scope.clone(), key.clone(), fp())
            .await
            .expect("begin")
        {
            Begin::Proceed(guard) => guard,
            other => panic!("a free key must proceed, got {other:?}"),
        }
    }

    /// The key is released within 5 s (in the background): a new request proceeds. Lease and
    /// lookup-first modes only: in the speculative mode `begin` proceeds before the key's lookup
    /// answers, so a proceed proves nothing there (use `runs_again_once`).
    async fn assert_released<S: Driver>(engine: &Engine<S>, s: &Scope, k: &IdempotencyKey) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            match engine
                .begin(s.clone(), k.clone(), fp())
                .await
                .expect("begin")
            {
                Begin::Proceed(_) => return,
                Begin::InFlight { .. } if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                other => panic!("the key must be released, got {other:?}"),
            }
        }
    }

    /// What the retry of a completed key is answered: the stored response, by `begin`, or in the
    /// speculative mode (which proceeds before the lookup answers) when its guard ends.
    async fn replay_of<S: Driver>(
        engine: &Engine<S>,
        s: &Scope,
        k: &IdempotencyKey,
    ) -> StoredResponse {
        match engine.begin(s.clone(), k.clone(), fp()).await {
            Ok(Begin::Replay(stored)) => stored.into_response(),
            Ok(Begin::Proceed(guard)) => match guard.complete(response(500)).await {
                Completion::Superseded(Superseded::Replay(stored)) => stored.into_response(),
                other => panic!("the retry must replay, its guard ended {other:?}"),
            },
            other => panic!("the retry must replay, got {other:?}"),
        }
    }

    /// The key is free (within 5 s): a retry proceeds, writes and stores; one side effect.
    async fn runs_again_once<S: Driver>(
        engine: &Engine<S>,
        f: &Fixture<S>,
        s: &Scope,
        k: &IdempotencyKey,
    ) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            match engine
                .begin(s.clone(), k.clone(), fp())
                .await
                .expect("begin")
            {
                Begin::Proceed(guard) => {
                    let slot = guard.transaction().expect("a transaction");
                    let written = S::try_write(
                        slot,
                        &format!(
                            "INSERT INTO \"{}\".side_effects (key) VALUES ($1)",
                            f.schema
                        ),
                        k.as_str(),
                    )
                    .await;
                    match guard.complete(response(201)).await {
                        Completion::Stored => {
                            assert!(written, "the stored retry wrote");
                            break;
                        }
                        Completion::Superseded(Superseded::InFlight { .. })
                            if tokio::time::Instant::now() < deadline => {}
                        other => panic!("the retry must run, got {other:?}"),
                    }
                }
                Begin::InFlight { .. } if tokio::time::Instant::now() < deadline => {}
                other => panic!("the retry must run, got {other:?}"),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(f.side_effects(k).await, 1, "the retry ran once");
    }

    /// The handler's side effect, written in the request's transaction.
    async fn write_side_effect<S: Driver>(guard: &Guard<S>, schema: &str) {
        let slot = guard
            .transaction()
            .expect("the PostgreSQL store offers a transaction");
        S::write(
            slot,
            &format!("INSERT INTO \"{schema}\".side_effects (key) VALUES ($1)"),
            guard.claim().key().as_str(),
        )
        .await;
    }

    /// The pool probe the other cases rely on sees a connection left inside a transaction.
    async fn the_pool_probe_sees_a_connection_left_in_a_transaction<S: Driver>() {
        let f = Fixture::<S>::new(TableMode::Unlogged).await;
        assert!(!f.store.pool_has_open_transaction().await);
        // A connection of the pool, left inside a transaction.
        f.sql("BEGIN").await;
        tokio::time::sleep(Duration::from_millis(5)).await;
        assert!(f.store.pool_has_open_transaction().await);
        f.sql("ROLLBACK").await;
        f.drop().await;
    }

    async fn a_commit_keeps_the_side_effect_and_the_response_together<S: Driver>() {
        for mode in MODES {
            let f = Fixture::<S>::new(mode).await;
            let engine = f.engine(EngineConfig::default());
            let (s, k) = (scope(), key());
            let guard = proceed(&engine, &s, &k).await;
            write_side_effect(&guard, &f.schema).await;
            // Not visible outside the transaction before the commit.
            assert_eq!(f.side_effects(&k).await, 0, "{mode:?}");
            assert_eq!(
                guard.complete(response(201)).await,
                Completion::Stored,
                "{mode:?}"
            );
            assert_eq!(f.side_effects(&k).await, 1, "{mode:?}");
            match engine.begin(s, k, fp()).await.expect("begin") {
                Begin::Replay(stored) => assert_eq!(stored, response(201), "{mode:?}"),
                other => panic!("{mode:?}: the retry must replay, got {other:?}"),
            }
            f.assert_pool_clean().await;
            f.drop().await;
        }
    }

    /// The lease runs out during the handler and another request takes the key over: the commit is
    /// refused, and the first handler's write is rolled back.
    async fn a_lease_taken_over_before_the_commit_rolls_the_writes_back<S: Driver>() {
        for mode in MODES {
            let f = Fixture::<S>::new(mode).await;
            let short = f.engine(
                EngineConfig::default()
                    .lease(Duration::from_millis(300))
                    .heartbeat(false),
            );
            let (s, k) = (scope(), key());
            let first = proceed(&short, &s, &k).await;
            // Busy with statements while its lease runs out: a transaction idle for longer than
            // the lease would be ended by the database before its commit is fenced.
            for _ in 0..6 {
                write_side_effect(&first, &f.schema).await;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let second = proceed(&short, &s, &k).await;
            assert_eq!(
                first.complete(response(201)).await,
                Completion::RolledBack(RollbackCause::LeaseLost),
                "{mode:?}"
            );
            assert_eq!(
                f.side_effects(&k).await,
                0,
                "{mode:?}: the stale write must roll back"
            );
            write_side_effect(&second, &f.schema).await;
            assert_eq!(
                second.complete(response(201)).await,
                Completion::Stored,
                "{mode:?}"
            );
            assert_eq!(f.side_effects(&k).await, 1, "{mode:?}");
            f.assert_pool_clean().await;
            f.drop().await;
        }
    }

    /// A status the policy does not store rolls the writes back and frees the key.
    async fn a_status_not_stored_rolls_back_and_releases<S: Driver>() {
        let f = Fixture::<S>::new(TableMode::Unlogged).await;
        let engine = f.engine(EngineConfig::default());
        let (s, k) = (scope(), key());
        let guard = proceed(&engine, &s, &k).await;
        write_side_effect(&guard, &f.schema).await;
        assert_eq!(guard.complete(response(503)).await, Completion::Released);
        assert_eq!(f.side_effects(&k).await, 0);
        let retry = proceed(&engine, &s, &k).await;
        drop(retry);
        f.assert_pool_clean().await;
        f.drop().await;
    }

    /// A guard dropped mid-request (a panic) rolls its transaction back and frees the key; the
    /// connection does not go back to the pool inside the transaction.
    async fn a_dropped_guard_rolls_back_and_releases<S: Driver>() {
        let f = Fixture::<S>::new(TableMode::Unlogged).await;
        let engine = f.engine(EngineConfig::default());
        let (s, k) = (scope(), key());
        let guard = proceed(&engine, &s, &k).await;
        write_side_effect(&guard, &f.schema).await;
        drop(guard);
        assert_released(&engine, &s, &k).await;
        assert_eq!(f.side_effects(&k).await, 0);
        f.assert_pool_clean().await;
        f.drop().await;
    }

    /// The store refuses the completion (a trigger on the key table): the commit fails, none of the
    /// writes exist, and the key is released so the retry runs.
    async fn a_store_error_at_commit_rolls_back_and_releases<S: Driver>() {
        let f = Fixture::<S>::new(TableMode::Unlogged).await;
        let engine = f.engine(EngineConfig::default());
        let (s, k) = (scope(), key());
        let guard = proceed(&engine, &s, &k).await;
        write_side_effect(&guard, &f.schema).await;
        f.sql(
            "CREATE FUNCTION \"{schema}\".refuse() RETURNS trigger LANGUAGE plpgsql AS \
           $$ BEGIN RAISE EXCEPTION 'updates refused'; END $$; \
         CREATE TRIGGER refuse BEFORE UPDATE ON \"{schema}\".idempotency_keys \
           FOR EACH ROW EXECUTE FUNCTION \"{schema}\".refuse();",
        )
        .await;
        assert_eq!(
            guard.complete(response(201)).await,
            Completion::RolledBack(RollbackCause::Store)
        );
        assert_eq!(f.side_effects(&k).await, 0);
        assert_released(&engine, &s, &k).await;
        f.assert_pool_clean().await;
        f.drop().await;
    }

    /// A `COMMIT` the store does not confirm within its timeout (a deferred trigger holds it,
    /// as a synchronous standby that does not answer would) is an unknown outcome: not "rolled
    /// back", since it may still land. The retry with the same key learns which: the commit that
    /// lands replays its response with one side effect; one that fails lets the retry run. In
    /// both claim modes. (Before issue 26 item 2, both were `RolledBack(Store)`, "none of its
    /// writes exist", while the first did commit.)
    async fn a_commit_not_confirmed_in_time_is_an_unknown_outcome<S: Driver>() {
        let f = Fixture::<S>::new(TableMode::Logged).await;
        for mode in [ClaimMode::Lease, ClaimMode::OneTransaction] {
            for lands in [true, false] {
                // Holds every COMMIT that inserted a side effect for 1.5 s (three times the
                // store timeout, so a busy machine's slow BEGIN does not matter), then lets it
                // commit or refuses it.
                let end = if lands {
                    "RETURN NULL;"
                } else {
                    "RAISE EXCEPTION 'refused at commit';"
                };
                f.sql(&format!(
                    "CREATE OR REPLACE FUNCTION \"{{schema}}\".hold_commit() RETURNS trigger \
                     LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(1.5); {end} END $$; \
                     DROP TRIGGER IF EXISTS hold_commit ON \"{{schema}}\".side_effects; \
                     CREATE CONSTRAINT TRIGGER hold_commit AFTER INSERT \
                       ON \"{{schema}}\".side_effects DEFERRABLE INITIALLY DEFERRED \
                       FOR EACH ROW EXECUTE FUNCTION \"{{schema}}\".hold_commit();"
                ))
                .await;
                let engine = f.engine(
                    EngineConfig::default()
                        .claim_mode(mode)
                        .store_timeout(Duration::from_millis(500)),
                );
                let (s, k) = (scope(), key());
                let guard = proceed(&engine, &s, &k).await;
                write_side_effect(&guard, &f.schema).await;
                assert_eq!(
                    guard.complete(response(201)).await,
                    Completion::OutcomeUnknown,
                    "{mode:?}, lands: {lands}"
                );
                // The held COMMIT ends; the retry learns its outcome.
                tokio::time::sleep(Duration::from_millis(2000)).await;
                if lands {
                    match engine.begin(s.clone(), k.clone(), fp()).await {
                        Ok(Begin::Replay(stored)) => {
                            assert_eq!(stored.status(), StatusCode::CREATED)
                        }
                        other => panic!("{mode:?}: a commit that landed replays, got {other:?}"),
                    }
                    assert_eq!(f.side_effects(&k).await, 1, "{mode:?}");
                } else {
                    // The lease mode's claim is released by the fenced release, retried in the
                    // background while the held COMMIT kept its row locked.
                    assert_released(&engine, &s, &k).await;
                    assert_eq!(f.side_effects(&k).await, 0, "{mode:?}");
                }
            }
        }
        f.sql("DROP TRIGGER hold_commit ON \"{schema}\".side_effects")
            .await;
        f.assert_pool_clean().await;
        f.drop().await;
    }

    /// What a handler that ends the store's transaction itself leaves, and how a retry is
    /// answered: the server says from the transaction's id how it ended. A `COMMIT` (also one
    /// followed by a `BEGIN`) made its writes exist, so the response is stored after them and the
    /// retry replays; a `ROLLBACK` left none, so the key is free and the retry runs. Before
    /// issue 26 item 8, every case kept the key claimed for a whole lease and then let the retry
    /// run again, a second side effect after a `COMMIT`.
    async fn ended_by_the_handler<S: Driver>(engine: &Engine<S>, f: &Fixture<S>) {
        for (end, writes_exist) in [
            ("COMMIT", true),
            ("ROLLBACK", false),
            ("COMMIT; BEGIN", true),
        ] {
            let (s, k) = (scope(), key());
            let guard = proceed(engine, &s, &k).await;
            write_side_effect(&guard, &f.schema).await;
            S::raw(guard.transaction().expect("a transaction"), end).await;
            let completion = guard.complete(response(201)).await;
            if writes_exist {
                assert_eq!(completion, Completion::Stored, "{end}");
                let stored = replay_of(engine, &s, &k).await;
                assert_eq!(stored.status(), StatusCode::CREATED, "{end}");
                assert_eq!(f.side_effects(&k).await, 1, "{end}");
            } else {
                assert_eq!(completion, Completion::TransactionMisused, "{end}");
                assert_eq!(f.side_effects(&k).await, 0, "{end}");
                runs_again_once(engine, f, &s, &k).await;
            }
        }
    }

    /// What holds after a handler's own `ROLLBACK`, in every claim mode: its write before it is
    /// undone; a write after it ran outside any transaction and committed on its own, so it
    /// stands (the library can neither see nor undo it: the log line and the docs say so);
    /// nothing is stored and the key is released. (Before, the log said "none of its writes
    /// exist", and `docs/failure-modes.md` "0 side effects".)
    async fn writes_after_the_handler_s_own_rollback_stand<S: Driver>() {
        let f = Fixture::<S>::new(TableMode::Logged).await;
        for mode in f.claim_modes() {
            let engine = f.engine(EngineConfig::default().claim_mode(mode));
            let (s, k) = (scope(), key());
            let guard = proceed(&engine, &s, &k).await;
            write_side_effect(&guard, &f.schema).await;
            let slot = guard.transaction().expect("a transaction");
            S::raw(slot, "ROLLBACK").await;
            let after = format!("{}:after", k.as_str());
            S::write(
                slot,
                &format!(
                    "INSERT INTO \"{}\".side_effects (key) VALUES ($1)",
                    f.schema
                ),
                &after,
            )
            .await;
            assert_eq!(
                guard.complete(response(201)).await,
                Completion::TransactionMisused,
                "{mode:?}"
            );
            assert_eq!(
                f.side_effects(&k).await,
                0,
                "{mode:?}: the write before was undone"
            );
            let after = IdempotencyKey::parse(after.as_bytes(), KeyFormat::opaque()).expect("key");
            assert_eq!(
                f.side_effects(&after).await,
                1,
                "{mode:?}: the write after it committed on its own"
            );
            runs_again_once(&engine, &f, &s, &k).await;
        }
        f.assert_pool_clean().await;
        f.drop().await;
    }

    /// The transaction is only offered while the lease is held, only as the store's type, and not
    /// after the request finished.
    async fn the_transaction_is_refused_when_it_cannot_be_honoured<S: Driver>() {
        let f = Fixture::<S>::new(TableMode::Unlogged).await;
        let short = f.engine(
            EngineConfig::default()
                .lease(Duration::from_millis(200))
                .heartbeat(false),
        );
        let guard = proceed(&short, &scope(), &key()).await;
        tokio::time::sleep(Duration::from_millis(400)).await;
        let slot = guard.transaction().expect("a transaction").clone();
        assert!(matches!(
            slot.open::<S::Tx>().await,
            Err(TransactionError::LeaseLost)
        ));
        let engine = f.engine(EngineConfig::default());
        let guard = proceed(&engine, &scope(), &key()).await;
        let slot = guard.transaction().expect("a transaction").clone();
        assert!(matches!(
            slot.open::<OtherStoresTransaction>().await,
            Err(TransactionError::WrongType { .. })
        ));
        assert_eq!(guard.complete(response(201)).await, Completion::Stored);
        assert!(matches!(
            slot.open::<S::Tx>().await,
            Err(TransactionError::Closed)
        ));
        let off = S::build(&postgres_url(), &f.schema, TableMode::Unlogged, false).await;
        assert!(off.transactional().is_none());
        f.assert_pool_clean().await;
        f.drop().await;
    }

    /// Another store's transaction type, to ask for the wrong one.
    struct OtherStoresTransaction;

    #[async_trait::async_trait]
    impl idempotency_core::store::StoreTransaction for OtherStoresTransaction {
        async fn complete_and_commit(
            self: Box<Self>,
            _: &StoredResponse,
            _: Duration,
        ) -> Result<idempotency_core::store::CommitOutcome, idempotency_core::StoreError> {
            Ok(idempotency_core::store::CommitOutcome::Committed)
        }
        async fn rollback(self: Box<Self>) -> Result<(), idempotency_core::StoreError> {
            Ok(())
        }
        fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
            self
        }
    }

    /// `Engine::status` in every claim mode while the key's request runs: in the lease mode its
    /// claim record reads in flight; in the one-transaction modes it has no record until its
    /// commit, and the key reads in flight from the lock its open transaction holds (looked at
    /// without taking it: a duplicate sent meanwhile is still answered in flight, not run).
    /// Another scope, or another key, reads absent; once answered, completed; once released,
    /// absent.
    async fn a_running_key_reads_in_flight_in_every_mode<S: Driver>() {
        let f = Fixture::<S>::new(TableMode::Logged).await;
        let insert = format!(
            "INSERT INTO \"{}\".side_effects (key) VALUES ($1)",
            f.schema
        );
        for mode in f.claim_modes() {
            let engine = f.engine(EngineConfig::default().claim_mode(mode));
            let (s, k) = (scope(), key());
            let guard = proceed(&engine, &s, &k).await;
            // The handler's write: in the speculative mode it follows the key's lookup, so once
            // it is answered the lookup has taken the key's lock.
            let slot = guard.transaction().expect("a transactional store");
            S::write(slot, &insert, k.as_str()).await;
            let status = engine.status(&s, &k).await.expect("status");
            match (mode, &status) {
                (ClaimMode::Lease, KeyStatus::InFlight { .. }) => {}
                (_, KeyStatus::InTransaction { retry_after }) if mode != ClaimMode::Lease => {
                    assert!(
                        *retry_after > Duration::ZERO && *retry_after <= Duration::from_secs(1),
                        "{mode:?}: retry after {retry_after:?}"
                    );
                }
                _ => panic!("{mode:?}: a running key must read in flight, got {status:?}"),
            }
            // A duplicate sent after the look is answered in flight (in the speculative mode
            // when its lookup is read, which its release does).
            match engine.begin(s.clone(), k.clone(), fp()).await {
                Ok(Begin::InFlight { .. }) => {}
                Ok(Begin::Proceed(duplicate)) if mode == ClaimMode::OneTransactionSpeculative => {
                    assert!(
                        matches!(
                            duplicate.release().await,
                            Completion::Superseded(Superseded::InFlight { .. })
                        ),
                        "{mode:?}: the duplicate's lookup finds the key held"
                    )
                }
                other => panic!("{mode:?}: a duplicate must be answered in flight, got {other:?}"),
            }
            assert_eq!(
                engine.status(&scope(), &k).await.expect("status"),
                KeyStatus::Absent,
                "{mode:?}: another scope must not see a running key"
            );
            assert_eq!(
                engine.status(&s, &key()).await.expect("status"),
                KeyStatus::Absent,
                "{mode:?}: another key"
            );
            assert_eq!(guard.complete(response(201)).await, Completion::Stored);
            assert!(
                matches!(
                    engine.status(&s, &k).await.expect("status"),
                    KeyStatus::Completed { status, .. } if status.as_u16() == 201
                ),
                "{mode:?}: an answered key reads completed"
            );
            assert_eq!(f.side_effects(&k).await, 1, "{mode:?}: the write ran once");
            let released = key();
            let guard = proceed(&engine, &s, &released).await;
            S::write(
                guard.transaction().expect("a transactional store"),
                &insert,
                released.as_str(),
            )
            .await;
            assert!(matches!(guard.release().await, Completion::Released));
            assert_eq!(
                engine.status(&s, &released).await.expect("status"),
                KeyStatus::Absent,
                "{mode:?}: a released key reads absent"
            );
        }
        f.assert_pool_clean().await;
        f.drop().await;
    }

    /// Every case above, as tests on the driver `$store`.
    macro_rules! transaction_cases {
        ($store:ty) => {
            transaction_cases!(@ $store;
                the_pool_probe_sees_a_connection_left_in_a_transaction,
                a_commit_keeps_the_side_effect_and_the_response_together,
                a_lease_taken_over_before_the_commit_rolls_the_writes_back,
                a_status_not_stored_rolls_back_and_releases,
                a_dropped_guard_rolls_back_and_releases,
                a_store_error_at_commit_rolls_back_and_releases,
                a_commit_not_confirmed_in_time_is_an_unknown_outcome,
                a_handler_that_ends_the_transaction_itself_is_caught,
                one_transaction_handler_that_ends_the_transaction_is_caught,
                the_request_s_transaction_commits_synchronously_with_asynchronous_claims,
                the_transaction_is_refused_when_it_cannot_be_honoured,
                taking_the_transaction_twice_is_refused_at_once,
                a_job_refused_by_the_database_records_its_refusal,
                writes_after_the_handler_s_own_rollback_stand,
                a_running_key_reads_in_flight_in_every_mode,
                a_table_without_migration_0004_refuses_lease_claims_before_the_work_runs,
                a_watched_one_transaction_commit_wakes_the_duplicate_on_another_instance,
            );
        };
        (@ $store:ty; $($case:ident),* $(,)?) => {$(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                super::$case::<$store>().await;
            }
        )*};
    }

    /// Waking across instances in the one-transaction mode: the running request has no record
    /// to mark before its commit, so a duplicate waiting on instance B sends the key's watch;
    /// instance A keeps it, and the commit of A's request sends the key's id, which B hears.
    /// A commit of a key nobody watches sends nothing (the first id B hears is the watched
    /// key's, committed after it). The duplicate replays; the work ran once. Failed before the
    /// watch existed: B heard nothing within 10 s.
    async fn a_watched_one_transaction_commit_wakes_the_duplicate_on_another_instance<S: Driver>() {
        use idempotency_core::store::{OnSettled, wake_id};
        use std::sync::Arc;
        let f = Fixture::<S>::new(TableMode::Logged).await;
        let b = S::build(&postgres_url(), &f.schema, TableMode::Logged, true).await;
        let (tell, mut heard) = tokio::sync::mpsc::unbounded_channel();
        let _subscriber: Arc<OnSettled> = Arc::new(move |id| {
            let _ = tell.send(id);
        });
        b.settled_keys()
            .expect("the PostgreSQL store hears of settles")
            .subscribe(&_subscriber);
        let config = EngineConfig::default()
            .claim_mode(ClaimMode::OneTransaction)
            .in_flight_wait(Duration::from_secs(20));
        let on_a = f.engine(config.clone());
        let on_b = Engine::new(b.clone(), config).expect("engine B");
        let s = scope();
        // A listens before the watch is sent (its engine opens the session in the background
        // at its first request; asked here, it is open when this returns).
        f.store
            .transactional()
            .expect("transactions on")
            .watch_transaction(&s, &key())
            .await
            .expect("A listens");
        let watches = f.store.settled_keys().expect("A hears of settles");
        // A fresh key (the plain insert at commit), then a key with an expired record (the
        // takeover at commit).
        for takeover in [false, true] {
            let (k, unwatched) = (key(), key());
            if takeover {
                f.sql(&format!(
                    "INSERT INTO \"{{schema}}\".idempotency_keys \
                       (user_id, key, request_hash, status_code, response, created_at, expires_at) \
                     VALUES ('{}', '{}', '\\x00', 201, '\\x00', now() - interval '2 hours', \
                       now() - interval '1 hour')",
                    s.as_str(),
                    k.as_str()
                ))
                .await;
            }
            let first = proceed(&on_a, &s, &unwatched).await;
            let running = proceed(&on_a, &s, &k).await;
            let duplicate = tokio::spawn({
                let (s, k, on_b) = (s.clone(), k.clone(), on_b.clone());
                async move { on_b.begin(s, k, fp()).await }
            });
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            while !watches.is_waited_for(wake_id(&s, &k)) {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "A never heard the duplicate's watch"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            assert!(!watches.is_waited_for(wake_id(&s, &unwatched)));
            for guard in [first, running] {
                write_side_effect(&guard, &f.schema).await;
                assert_eq!(guard.complete(response(201)).await, Completion::Stored);
            }
            let id = tokio::time::timeout(Duration::from_secs(10), heard.recv())
                .await
                .expect("B hears the watched key's commit within 10 s")
                .expect("subscribed");
            assert_eq!(
                id,
                wake_id(&s, &k),
                "takeover {takeover}: the watched key's commit, and nothing before it"
            );
            assert!(
                !watches.is_waited_for(wake_id(&s, &k)),
                "the commit took the watch"
            );
            match duplicate.await.expect("the duplicate's task") {
                Ok(Begin::Replay(replayed)) => {
                    assert_eq!(replayed.response().status(), StatusCode::CREATED)
                }
                other => panic!("the waiting duplicate must replay, got {other:?}"),
            }
            assert_eq!(f.side_effects(&k).await, 1, "the work ran once");
        }
        f.drop().await;
    }

    /// A table upgraded without migration 0004 (no `waited` column, as a deployment that
    /// skipped it) refuses a lease claim at once, so the work never runs: before, the claim
    /// did not name the column and stood, the work ran (with effects outside the transaction,
    /// such as a charge), and only its completion failed, so the key stayed held until its
    /// lease ran out and the retry after it ran the work again. The one-transaction modes name
    /// no new column (their records are written complete) and keep working there.
    async fn a_table_without_migration_0004_refuses_lease_claims_before_the_work_runs<S: Driver>() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicU32, Ordering};
        let f = Fixture::<S>::new(TableMode::Logged).await;
        f.sql(
            "ALTER TABLE \"{schema}\".idempotency_keys DROP COLUMN waited; \
             DELETE FROM \"{schema}\".idempotency_keys_migrations WHERE version = 4",
        )
        .await;
        let sql = format!(
            "INSERT INTO \"{}\".side_effects (key) VALUES ($1)",
            f.schema
        );
        for mode in f.claim_modes() {
            let engine = f.engine(EngineConfig::default().claim_mode(mode));
            let (s, k) = (scope(), key());
            let runs = Arc::new(AtomicU32::new(0));
            let (sql, key_text) = (sql.as_str(), k.as_str());
            let work = |runs: Arc<AtomicU32>| {
                move |ctx: idempotency_core::OnceContext| async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    let slot = ctx.transaction_slot().expect("a transaction");
                    S::try_write(slot, sql, key_text).await;
                    Ok::<_, TransactionError>(1_u32)
                }
            };
            let first = tokio::time::timeout(
                Duration::from_secs(10),
                engine.once(s.clone(), k.clone(), &"job", work(runs.clone())),
            )
            .await
            .unwrap_or_else(|_| panic!("{mode:?}: the call hung"));
            let again = tokio::time::timeout(
                Duration::from_secs(10),
                engine.once(s, k.clone(), &"job", work(runs.clone())),
            )
            .await
            .unwrap_or_else(|_| panic!("{mode:?}: the retry hung"));
            if mode == ClaimMode::Lease {
                let error = first.expect_err("the claim is refused");
                assert!(
                    format!("{error:?}").contains("waited"),
                    "{mode:?}: the error names the missing column: {error:?}"
                );
                assert!(again.is_err(), "{mode:?}: the retry is refused too");
                assert_eq!(
                    runs.load(Ordering::SeqCst),
                    0,
                    "{mode:?}: the work never ran"
                );
            } else {
                assert!(
                    matches!(first, Ok(idempotency_core::Outcome::Ran { .. })),
                    "{mode:?}: {first:?}"
                );
                assert!(
                    matches!(again, Ok(idempotency_core::Outcome::Replayed(1))),
                    "{mode:?}: {again:?}"
                );
            }
            let once = i64::from(mode != ClaimMode::Lease);
            assert_eq!(f.side_effects(&k).await, once, "{mode:?}: effects");
        }
        f.assert_pool_clean().await;
        f.drop().await;
    }

    /// A job that asks for its transaction again while it holds it (a helper opening it a
    /// second time) is refused at once (`TransactionError::InUse`, then
    /// `OnceError::TransactionMisused`), in every claim mode: its write rolled back, its key
    /// released (the redelivery runs and writes once) and its connection returned. Before, the
    /// second open waited on a lock its own caller held: the job never ended.
    async fn taking_the_transaction_twice_is_refused_at_once<S: Driver>() {
        let f = Fixture::<S>::new(TableMode::Logged).await;
        let sql = format!(
            "INSERT INTO \"{}\".side_effects (key) VALUES ($1)",
            f.schema
        );
        for mode in f.claim_modes() {
            let engine = f.engine(EngineConfig::default().claim_mode(mode));
            let (s, k) = (scope(), key());
            let (sql, key_text) = (sql.as_str(), k.as_str());
            let misused = tokio::time::timeout(
                Duration::from_secs(10),
                engine.once(s.clone(), k.clone(), &"job", |ctx| async move {
                    let slot = ctx.transaction_slot().expect("a transaction");
                    S::write(slot, sql, key_text).await;
                    let _held = slot.open::<S::Tx>().await?;
                    slot.open::<S::Tx>().await.map(|_| 1_u32)
                }),
            )
            .await
            .unwrap_or_else(|_| panic!("{mode:?}: the second open hung"));
            assert!(
                matches!(
                    misused,
                    Err(idempotency_core::OnceError::TransactionMisused)
                ),
                "{mode:?}: {misused:?}"
            );
            assert_eq!(
                f.side_effects(&k).await,
                0,
                "{mode:?}: its write rolled back"
            );
            let ran = engine
                .once(s, k.clone(), &"job", |ctx| async move {
                    S::write(
                        ctx.transaction_slot().expect("a transaction"),
                        sql,
                        key_text,
                    )
                    .await;
                    Ok::<_, TransactionError>(1_u32)
                })
                .await;
            assert!(
                matches!(ran, Ok(idempotency_core::Outcome::Ran { .. })),
                "{mode:?}: the redelivery runs: {ran:?}"
            );
            assert_eq!(f.side_effects(&k).await, 1, "{mode:?}: once");
        }
        f.assert_pool_clean().await;
        f.drop().await;
    }

    /// A job whose statement the database refuses for its data (a NUL byte in text, `22021`):
    /// the failed statement aborted the transaction, so returning the refusal as a value alone
    /// is `NotCommitted` (retryable: a redelivery fails the same way, for ever). With
    /// `discard_writes` the job's writes roll back and the refusal is stored: every
    /// redelivery replays it without running, in every claim mode, on both drivers.
    async fn a_job_refused_by_the_database_records_its_refusal<S: Driver>() {
        let f = Fixture::<S>::new(TableMode::Logged).await;
        let insert = format!(
            "INSERT INTO \"{}\".side_effects (key) VALUES ($1)",
            f.schema
        );
        let poison = format!(
            "INSERT INTO \"{}\".side_effects (key) VALUES ($1 || chr(0))",
            f.schema
        );
        for mode in f.claim_modes() {
            let engine = f.engine(EngineConfig::default().claim_mode(mode));
            let (s, k) = (scope(), key());
            let (insert, poison, key_text) = (insert.as_str(), poison.as_str(), k.as_str());
            let work = |discard: bool| {
                move |ctx: idempotency_core::OnceContext| async move {
                    let slot = ctx.transaction_slot().expect("a transaction");
                    S::write(slot, insert, key_text).await;
                    if S::try_write(slot, poison, key_text).await {
                        return Ok(Ok(1_u32));
                    }
                    if discard {
                        ctx.discard_writes()?;
                    }
                    Ok::<_, TransactionError>(Err("the database refused the title".to_owned()))
                }
            };
            let undiscarded = engine.once(s.clone(), k.clone(), &"job", work(false)).await;
            assert!(
                matches!(
                    undiscarded,
                    Err(idempotency_core::OnceError::NotCommitted(_))
                ),
                "{mode:?}: without discard_writes: {undiscarded:?}"
            );
            for delivery in 0..3 {
                // The lease mode releases the key of the uncommitted run in the background.
                let until = tokio::time::Instant::now() + Duration::from_secs(10);
                let outcome = loop {
                    match engine.once(s.clone(), k.clone(), &"job", work(true)).await {
                        Err(idempotency_core::OnceError::InFlight { .. })
                            if tokio::time::Instant::now() < until =>
                        {
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                        outcome => break outcome,
                    }
                };
                let refused = Err("the database refused the title".to_owned());
                match (delivery, outcome) {
                    (0, Ok(idempotency_core::Outcome::Ran { value, completion })) => {
                        assert_eq!(value, refused, "{mode:?}");
                        assert_eq!(completion, Completion::Stored, "{mode:?}");
                    }
                    (1.., Ok(idempotency_core::Outcome::Replayed(value))) => {
                        assert_eq!(value, refused, "{mode:?}");
                    }
                    (n, other) => panic!("{mode:?} delivery {n}: {other:?}"),
                }
            }
            assert_eq!(f.side_effects(&k).await, 0, "{mode:?}: no write stands");
        }
        f.assert_pool_clean().await;
        f.drop().await;
    }

    /// `LoggedAsyncCommit`: the store's connections commit asynchronously (a claim that stands
    /// alone), but the request's transaction, which holds the handler's writes and the stored
    /// response, commits synchronously, in both claim modes. Before, the handler's writes
    /// committed asynchronously too: a crash could take back writes a client was answered for.
    async fn the_request_s_transaction_commits_synchronously_with_asynchronous_claims<S: Driver>() {
        let f = Fixture::<S>::new(TableMode::LoggedAsyncCommit).await;
        assert_eq!(
            f.store
                .count(
                    "SELECT count(*) WHERE current_setting('synchronous_commit') = $1",
                    "off"
                )
                .await,
            1,
            "the store's connections commit asynchronously"
        );
        for mode in [ClaimMode::Lease, ClaimMode::OneTransaction] {
            let engine = f.engine(EngineConfig::default().claim_mode(mode));
            let (s, k) = (scope(), key());
            let guard = proceed(&engine, &s, &k).await;
            S::write(
                guard.transaction().expect("a transaction"),
                &format!(
                    "INSERT INTO \"{}\".side_effects (key) \
                     SELECT $1 || ':' || current_setting('synchronous_commit')",
                    f.schema
                ),
                k.as_str(),
            )
            .await;
            assert_eq!(guard.complete(response(201)).await, Completion::Stored);
            let synchronous =
                IdempotencyKey::parse(format!("{}:on", k.as_str()).as_bytes(), KeyFormat::opaque())
                    .expect("key");
            assert_eq!(
                f.side_effects(&synchronous).await,
                1,
                "{mode:?}: the request's transaction ran with synchronous_commit = on"
            );
        }
        f.assert_pool_clean().await;
        f.drop().await;
    }

    /// Lease mode: a handler that ends the request's transaction itself is caught by the
    /// transaction-local mark at commit (see [`ended_by_the_handler`]).
    async fn a_handler_that_ends_the_transaction_itself_is_caught<S: Driver>() {
        let f = Fixture::<S>::new(TableMode::Unlogged).await;
        let engine = f.engine(EngineConfig::default());
        ended_by_the_handler(&engine, &f).await;
        f.assert_pool_clean().await;
        f.drop().await;
    }

    /// One-transaction mode: the same, caught by the check of the transaction's start at
    /// commit; after a `COMMIT` the key is recorded outside the transaction first (no claim
    /// exists in this mode).
    async fn one_transaction_handler_that_ends_the_transaction_is_caught<S: Driver>() {
        let f = Fixture::<S>::new(TableMode::Logged).await;
        let engine = f.engine(EngineConfig::default().claim_mode(ClaimMode::OneTransaction));
        ended_by_the_handler(&engine, &f).await;
        f.assert_pool_clean().await;
        f.drop().await;
    }

    /// Speculative mode: the same; the transaction's start and id come with the key's lookup,
    /// read after the handler returned.
    async fn speculative_handler_that_ends_the_transaction_is_caught<S: Driver>() {
        let f = Fixture::<S>::new(TableMode::Logged).await;
        let engine =
            f.engine(EngineConfig::default().claim_mode(ClaimMode::OneTransactionSpeculative));
        ended_by_the_handler(&engine, &f).await;
        f.assert_pool_clean().await;
        f.drop().await;
    }

    /// Speculative mode: the key's lookup does not answer within the store timeout (another
    /// session holds the key table locked). The request is not stored (503 `not-committed` for
    /// an HTTP client), nothing of
    /// it stands, and once the table is free the retry runs once: one side effect in all.
    async fn a_key_lookup_that_does_not_answer_leaves_nothing<S: Driver>() {
        let f = Fixture::<S>::new(TableMode::Logged).await;
        let engine = f.engine(
            EngineConfig::default()
                .claim_mode(ClaimMode::OneTransactionSpeculative)
                .store_timeout(Duration::from_millis(300)),
        );
        let url = postgres_url();
        let (blocker, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .unwrap_or_else(|e| server_unreachable("PostgreSQL", &url, &e));
        tokio::spawn(connection);
        blocker
            .batch_execute(&format!(
                "BEGIN; LOCK TABLE \"{}\".idempotency_keys IN ACCESS EXCLUSIVE MODE",
                f.schema
            ))
            .await
            .expect("lock the key table");
        let (s, k) = (scope(), key());
        match engine.begin(s.clone(), k.clone(), fp()).await {
            Ok(Begin::Proceed(guard)) => assert_eq!(
                guard.complete(response(201)).await,
                Completion::RolledBack(RollbackCause::Store),
                "a lookup that did not answer: nothing stored"
            ),
            Err(error) => assert!(error.is_retryable(), "{error}"),
            Ok(other) => panic!("a free key: proceed or fail, got {other:?}"),
        }
        blocker.batch_execute("COMMIT").await.expect("unlock");
        // The retry, with the default store timeout: a busy machine must not refuse it.
        let engine =
            f.engine(EngineConfig::default().claim_mode(ClaimMode::OneTransactionSpeculative));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        let retry = loop {
            match engine.begin(s.clone(), k.clone(), fp()).await {
                Ok(Begin::Proceed(guard)) => break guard,
                Ok(Begin::InFlight { .. }) | Err(_) if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                other => panic!("the retry must run, got {other:?}"),
            }
        };
        write_side_effect(&retry, &f.schema).await;
        assert_eq!(retry.complete(response(201)).await, Completion::Stored);
        assert_eq!(f.side_effects(&k).await, 1, "the retry ran once");
        f.drop().await;
    }

    /// On tokio-postgres and deadpool (`PostgresTransaction`).
    mod tokio_postgres_driver {
        transaction_cases!(idempotency_postgres::PostgresStore);
        // The speculative mode's own cases (sqlx cannot speculate).
        transaction_cases!(@ idempotency_postgres::PostgresStore;
            speculative_handler_that_ends_the_transaction_is_caught,
            a_key_lookup_that_does_not_answer_leaves_nothing,
        );
    }

    /// On sqlx (`SqlxPostgresTransaction`).
    #[cfg(feature = "sqlx")]
    mod sqlx_driver {
        transaction_cases!(idempotency_postgres::SqlxPostgresStore);
    }
}
