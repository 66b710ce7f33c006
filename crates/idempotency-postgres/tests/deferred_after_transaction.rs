//! In the one-transaction modes a response stored *outside* the request's transaction (after
//! the handler's own `COMMIT`, or after discarded writes rolled back) is stored under a claim
//! taken for it then, with the engine's lease. When that store fails, the engine keeps trying
//! in the background, but only while that claim holds the key. Before, the background store
//! kept the claim's "no end" deadline of the one-transaction mode (30 years): it retried past
//! the lease, after another request could already hold the key, and the shutdown drain waited
//! for it for ever. After discarded writes the same holds, and none of the handler's writes stand;
//! after its own `COMMIT`, its write stands once.

mod postgres {
    use bytes::Bytes;
    use idempotency_conformance::faults::{Fault, FaultyStore, StoreOp};
    use idempotency_core::http::{HeaderMap, StatusCode};
    use idempotency_core::{
        Begin, BodyCanonicalization, ClaimMode, Completion, Engine, EngineConfig, Fingerprint,
        IdempotencyKey, KeyFormat, Scope, StoredResponse,
    };
    use idempotency_postgres::{PostgresStore, PostgresTransaction, TableMode};
    use idempotency_testkit::TestSchema;
    use idempotency_testkit::env::{postgres_url, server_unreachable};
    use std::time::Duration;

    /// The engine's lease: the claim taken after the transaction holds the key this long.
    const LEASE: Duration = Duration::from_secs(2);

    fn fp() -> Fingerprint {
        Fingerprint::of_request("POST", "/orders", b"{}", BodyCanonicalization::Raw)
    }

    /// How the request's handler ends its transaction before the response is stored.
    #[derive(Clone, Copy, Debug)]
    enum Ending {
        /// It runs `COMMIT` itself: its writes stand, the response is stored after them.
        OwnCommit,
        /// It writes a row, then discards its writes (a refusal): with the pool's one
        /// connection held by its transaction, the record cannot land before the rollback, so
        /// the key is claimed right after it.
        DiscardedWrites,
    }

    /// Runs one request per one-transaction mode that ends as `ending`, with every completion
    /// refused by the store: the client must get its response (`Deferred`), the background
    /// store must stop within the claim's lease (the drain finishes), and the handler's row
    /// must exist once after its own `COMMIT` and not at all after discarded writes.
    async fn deferred_store_ends_with_the_lease(ending: Ending, pool_size: usize) {
        let schema = TestSchema::new("idem_defer");
        let url = postgres_url();
        let store = PostgresStore::builder(&url)
            .schema(schema.name())
            .table_mode(TableMode::Logged)
            .pool_size(pool_size)
            .build()
            .await
            .unwrap_or_else(|e| server_unreachable("PostgreSQL", &url, &e));
        store.migrate().await.expect("migrate a fresh schema");
        let effects = format!("\"{}\".effects", schema.name());
        let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .unwrap_or_else(|e| server_unreachable("PostgreSQL", &url, &e));
        tokio::spawn(connection);
        client
            .batch_execute(&format!("CREATE TABLE {effects} (mode text NOT NULL)"))
            .await
            .expect("create the side-effect table");
        let store = FaultyStore::new(store);
        for mode in [
            ClaimMode::OneTransaction,
            ClaimMode::OneTransactionSpeculative,
        ] {
            let engine = Engine::new(
                store.clone(),
                EngineConfig::default()
                    .claim_mode(mode)
                    .lease(LEASE)
                    .store_timeout(Duration::from_millis(300)),
            )
            .expect("valid engine settings");
            let scope = Scope::new("deferred-tx").expect("scope");
            let key = IdempotencyKey::parse(
                uuid::Uuid::new_v4().to_string().as_bytes(),
                KeyFormat::UuidV4,
            )
            .expect("key");
            let guard = match engine.begin(scope, key, fp()).await.expect("begin") {
                Begin::Proceed(guard) => guard,
                other => panic!("{mode:?}: a free key must proceed, got {other:?}"),
            };
            {
                let slot = guard.transaction().expect("a transaction");
                let tx = slot
                    .open::<PostgresTransaction>()
                    .await
                    .expect("open the transaction");
                let insert = format!("INSERT INTO {effects} VALUES ('{mode:?}')");
                match ending {
                    Ending::OwnCommit => tx
                        .batch_execute(&format!("{insert}; COMMIT"))
                        .await
                        .expect("the handler ends the transaction itself"),
                    Ending::DiscardedWrites => {
                        tx.batch_execute(&insert)
                            .await
                            .expect("the handler's write");
                        tx.discard_writes();
                    }
                }
            }
            // The store is down for the response: the claim lands, the completion does not.
            store.set(StoreOp::Complete, Fault::Fail);
            let response = StoredResponse::new(StatusCode::CREATED, HeaderMap::new(), Bytes::new());
            assert_eq!(
                guard.complete(response).await,
                Completion::Deferred,
                "{mode:?}, {ending:?}: the claim after the transaction holds the key, so the \
                 client gets its response and storing goes on in the background"
            );
            // The background store gives up when the claim's lease ends; the drain sees it.
            let drained = tokio::time::timeout(LEASE * 4, engine.drain().drained()).await;
            store.clear(StoreOp::Complete);
            assert!(
                drained.is_ok(),
                "{mode:?}, {ending:?}: the background store still ran {:?} after the claim's \
                 {LEASE:?} lease (the store was asked {} times)",
                LEASE * 4,
                store.calls(StoreOp::Complete)
            );
            let row = client
                .query_one(
                    &format!("SELECT count(*) FROM {effects} WHERE mode = $1"),
                    &[&format!("{mode:?}")],
                )
                .await
                .expect("count the handler's rows");
            let ran: i64 = row.get(0);
            let expected = match ending {
                Ending::OwnCommit => 1,
                Ending::DiscardedWrites => 0,
            };
            assert_eq!(
                ran, expected,
                "{mode:?}, {ending:?}: the handler's rows that stand"
            );
        }
        schema.drop().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_store_after_the_handler_s_commit_is_retried_no_longer_than_its_lease() {
        deferred_store_ends_with_the_lease(Ending::OwnCommit, 4).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_store_after_discarded_writes_is_retried_no_longer_than_its_lease() {
        deferred_store_ends_with_the_lease(Ending::DiscardedWrites, 1).await;
    }
}
