//! Waking duplicates across instances (migration 0004, `LISTEN`/`NOTIFY`): two stores on one
//! table stand for two instances, each with an engine. A duplicate waiting on instance B marks
//! the running key; the request on A completes in its transaction; B hears the commit and the
//! duplicate replays. (What a store hears of settles, watched or not, is the conformance case
//! `watched_settles_are_heard_and_only_those`, run on every table mode and both drivers.)
//! In the one-transaction mode the running request has no record to mark: the duplicate sends
//! a watch, which A keeps, and A's commit sends the key's id (the case
//! `a_watched_one_transaction_commit_wakes_the_duplicate_on_another_instance` in
//! `transactions.rs`, on both drivers).

mod postgres {
    use bytes::Bytes;
    use idempotency_core::http::{HeaderMap, StatusCode};
    use idempotency_core::store::{OnSettled, wake_id};
    use idempotency_core::{
        Begin, BodyCanonicalization, ClaimMode, Completion, Engine, EngineConfig, Fingerprint,
        IdempotencyKey, IdempotencyStore, KeyFormat, Scope, StoredResponse,
    };
    use idempotency_postgres::{PostgresStore, TableMode};
    use idempotency_testkit::TestSchema;
    use idempotency_testkit::env::{postgres_url, server_unreachable};
    use std::sync::Arc;
    use std::time::Duration;
    use tokio::sync::mpsc;

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
