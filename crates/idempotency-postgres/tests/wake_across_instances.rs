//! Waking duplicates across instances (migration 0004, `LISTEN`/`NOTIFY`): two stores on one
//! table stand for two instances. A duplicate waiting on one instance marks the running key,
//! and the other instance's settle of a marked key (its answer stored, in the request's
//! transaction or not, or the key given back) is heard by the first instance when it commits;
//! a key nobody waits for sends nothing. Then through two engines: the waiting duplicate is
//! answered with the replay, and its instance heard the settle.

mod postgres {
    use bytes::Bytes;
    use idempotency_core::http::{HeaderMap, StatusCode};
    use idempotency_core::store::{ClaimOutcome, FenceOutcome, OnSettled, wake_id};
    use idempotency_core::{
        Begin, BodyCanonicalization, ClaimMode, Completion, Engine, EngineConfig, Fingerprint,
        IdempotencyKey, IdempotencyStore, KeyFormat, LeaseToken, Scope, StoredResponse,
    };
    use idempotency_postgres::{PostgresStore, TableMode};
    use idempotency_testkit::TestSchema;
    use idempotency_testkit::env::{postgres_url, server_unreachable};
    use std::sync::Arc;
    use std::time::Duration;
    use tokio::sync::mpsc;

    const LEASE: Duration = Duration::from_secs(30);

    fn fp() -> Fingerprint {
        Fingerprint::of_request("POST", "/orders", b"{}", BodyCanonicalization::Raw)
    }

    fn key() -> IdempotencyKey {
        IdempotencyKey::parse(
            uuid::Uuid::new_v4().to_string().as_bytes(),
            KeyFormat::UuidV4,
        )
        .expect("a valid key")
    }

    fn created() -> StoredResponse {
        StoredResponse::new(
            StatusCode::CREATED,
            HeaderMap::new(),
            Bytes::from_static(b"{}"),
        )
    }

    /// Two stores ("instances") on one fresh table, with transactions on.
    async fn instances(schema: &TestSchema) -> (PostgresStore, PostgresStore) {
        let url = postgres_url();
        let mut stores = Vec::new();
        for _ in 0..2 {
            let store = PostgresStore::builder(&url)
                .schema(schema.name())
                .table_mode(TableMode::Logged)
                .pool_size(4)
                .build()
                .await
                .unwrap_or_else(|e| server_unreachable("PostgreSQL", &url, &e));
            store.migrate().await.expect("migrate a fresh schema");
            stores.push(store);
        }
        let b = stores.pop().expect("two stores");
        let a = stores.pop().expect("two stores");
        (a, b)
    }

    /// What `store` hears of other instances' settles, as wake ids, in order.
    fn heard<S: IdempotencyStore>(store: &S) -> (Arc<OnSettled>, mpsc::UnboundedReceiver<u64>) {
        let (tell, heard) = mpsc::unbounded_channel();
        let subscriber: Arc<OnSettled> = Arc::new(move |id| {
            let _ = tell.send(id);
        });
        store
            .settled_keys()
            .expect("the PostgreSQL store hears of settles")
            .subscribe(&subscriber);
        (subscriber, heard)
    }

    async fn next(heard: &mut mpsc::UnboundedReceiver<u64>) -> u64 {
        tokio::time::timeout(Duration::from_secs(10), heard.recv())
            .await
            .expect("a settle of a watched key is heard within 10 s")
            .expect("the subscription is open")
    }

    async fn claim<S: IdempotencyStore>(
        store: &S,
        scope: &Scope,
        key: &IdempotencyKey,
    ) -> LeaseToken {
        let token = LeaseToken::new();
        let outcome = store
            .claim(scope, key, &fp(), token, LEASE)
            .await
            .expect("claim");
        assert!(matches!(outcome, ClaimOutcome::Claimed), "a fresh key");
        token
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_watched_key_s_settle_is_heard_by_the_other_instance_and_only_it() {
        let schema = TestSchema::new("idem_wake");
        let (a, b) = instances(&schema).await;
        settles_are_heard(a, b).await;
    }

    /// The same on sqlx, whose listening session `PgListener` opens from the pool's options.
    #[cfg(feature = "sqlx")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn on_sqlx_a_watched_key_s_settle_is_heard_by_the_other_instance_and_only_it() {
        use idempotency_postgres::SqlxPostgresStore;
        use idempotency_postgres::sqlx::postgres::PgPoolOptions;
        let schema = TestSchema::new("idem_wake_sqlx");
        let url = postgres_url();
        let mut stores = Vec::new();
        for _ in 0..2 {
            let pool = PgPoolOptions::new()
                .max_connections(4)
                .connect(&url)
                .await
                .unwrap_or_else(|e| server_unreachable("PostgreSQL", &url, &e));
            let store = SqlxPostgresStore::builder_from_sqlx_pool(pool)
                .schema(schema.name())
                .build()
                .await
                .expect("build");
            store.migrate().await.expect("migrate a fresh schema");
            stores.push(store);
        }
        let b = stores.pop().expect("two stores");
        let a = stores.pop().expect("two stores");
        settles_are_heard(a, b).await;
    }

    /// Instance B watches keys that A runs: B hears A's settle of each watched key (completed,
    /// released), in commit order, and of no other.
    async fn settles_are_heard<S: IdempotencyStore>(a: S, b: S) {
        let (_subscriber, mut heard) = heard(&b);
        let scope = Scope::new("wake").expect("scope");

        // Completed: heard.
        let completed = key();
        let token = claim(&a, &scope, &completed).await;
        b.watch_settle(&scope, &completed).await.expect("watch");
        let done = a
            .complete(&scope, &completed, token, &created(), LEASE)
            .await
            .expect("complete");
        assert_eq!(done, FenceOutcome::Applied);
        assert_eq!(next(&mut heard).await, wake_id(&scope, &completed));

        // Nobody waits: nothing is sent. A watched key settled after it comes next, and
        // notices arrive in commit order, so a notice of the first would have come first.
        let unwatched = key();
        let token = claim(&a, &scope, &unwatched).await;
        let done = a
            .complete(&scope, &unwatched, token, &created(), LEASE)
            .await
            .expect("complete");
        assert_eq!(done, FenceOutcome::Applied);
        let released = key();
        let token = claim(&a, &scope, &released).await;
        b.watch_settle(&scope, &released).await.expect("watch");
        let done = a.release(&scope, &released, token).await.expect("release");
        assert_eq!(done, FenceOutcome::Applied, "the release applies (one row)");
        assert_eq!(
            next(&mut heard).await,
            wake_id(&scope, &released),
            "a key given back is heard, and a key nobody waited for sent nothing"
        );

        // A watch of a key that is not running marks nothing: its later claim's settle sends
        // nothing either.
        let late = key();
        b.watch_settle(&scope, &late).await.expect("watch");
        let token = claim(&a, &scope, &late).await;
        let done = a
            .complete(&scope, &late, token, &created(), LEASE)
            .await
            .expect("complete");
        assert_eq!(done, FenceOutcome::Applied);
        let fence = key();
        let token = claim(&a, &scope, &fence).await;
        b.watch_settle(&scope, &fence).await.expect("watch");
        let done = a
            .complete(&scope, &fence, token, &created(), LEASE)
            .await
            .expect("complete");
        assert_eq!(done, FenceOutcome::Applied);
        assert_eq!(next(&mut heard).await, wake_id(&scope, &fence));
    }

    /// Through engines, in the lease mode with the handler's writes in the request's
    /// transaction (the completion commits with them): a duplicate waiting on instance B gets
    /// the replay of the request that ran on A, and B heard the settle.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_duplicate_waiting_on_another_instance_is_answered_when_the_request_commits() {
        let schema = TestSchema::new("idem_wakee");
        let (a, b) = instances(&schema).await;
        let (_subscriber, mut heard) = heard(&b);
        let config = EngineConfig::default()
            .claim_mode(ClaimMode::Lease)
            .in_flight_wait(Duration::from_secs(20));
        let on_a = Engine::new(a.clone(), config.clone()).expect("engine A");
        let on_b = Engine::new(b.clone(), config).expect("engine B");
        let (scope, k) = (Scope::new("wake-engine").expect("scope"), key());
        let guard = match on_a.begin(scope.clone(), k.clone(), fp()).await {
            Ok(Begin::Proceed(guard)) => guard,
            other => panic!("a fresh key proceeds, got {other:?}"),
        };
        let duplicate = tokio::spawn({
            let (scope, k) = (scope.clone(), k.clone());
            async move { on_b.begin(scope, k, fp()).await }
        });
        // The duplicate marked the running key once it waits.
        let url = postgres_url();
        let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .unwrap_or_else(|e| server_unreachable("PostgreSQL", &url, &e));
        tokio::spawn(connection);
        let marked = format!(
            "SELECT waited FROM \"{}\".idempotency_keys WHERE key = $1",
            schema.name()
        );
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let row = client
                .query_one(&marked, &[&k.as_str()])
                .await
                .expect("read");
            if row.get::<_, bool>(0) {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the duplicate never marked the key"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let slot = guard.transaction().expect("a transactional store");
        {
            let tx = slot
                .open::<idempotency_postgres::PostgresTransaction>()
                .await
                .expect("open the transaction");
            tx.batch_execute("SELECT 1")
                .await
                .expect("the handler's statement");
        }
        assert_eq!(guard.complete(created()).await, Completion::Stored);
        assert_eq!(
            next(&mut heard).await,
            wake_id(&scope, &k),
            "B heard the commit"
        );
        match duplicate.await.expect("the duplicate's task") {
            Ok(Begin::Replay(replayed)) => {
                assert_eq!(replayed.response().status(), StatusCode::CREATED)
            }
            other => panic!("the waiting duplicate must replay, got {other:?}"),
        }
    }
}
