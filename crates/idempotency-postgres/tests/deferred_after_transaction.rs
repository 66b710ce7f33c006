//! In the one-transaction modes a response stored *outside* the request's transaction (after
//! the handler's own `COMMIT`, or after discarded writes rolled back) is stored under a claim
//! taken for it then, with the engine's lease. When that store fails, the engine keeps trying
//! in the background, but only while that claim holds the key. Before, the background store
//! kept the claim's "no end" deadline of the one-transaction mode (30 years): it retried past
//! the lease, after another request could already hold the key, and the shutdown drain waited
//! for it for ever.

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

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_store_after_the_handler_s_commit_is_retried_no_longer_than_its_lease() {
        let schema = TestSchema::new("idem_defer");
        let url = postgres_url();
        let store = PostgresStore::builder(&url)
            .schema(schema.name())
            .table_mode(TableMode::Logged)
            .pool_size(4)
            .build()
            .await
            .unwrap_or_else(|e| server_unreachable("PostgreSQL", &url, &e));
        store.migrate().await.expect("migrate a fresh schema");
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
                tx.batch_execute("SELECT 1; COMMIT")
                    .await
                    .expect("the handler ends the transaction itself");
            }
            // The store is down for the response: the claim lands, the completion does not.
            store.set(StoreOp::Complete, Fault::Fail);
            let response = StoredResponse::new(StatusCode::CREATED, HeaderMap::new(), Bytes::new());
            assert_eq!(
                guard.complete(response).await,
                Completion::Deferred,
                "{mode:?}: the claim after the COMMIT holds the key, so storing goes on in the \
                 background"
            );
            // The background store gives up when the claim's lease ends; the drain sees it.
            let drained = tokio::time::timeout(LEASE * 4, engine.drain().drained()).await;
            store.clear(StoreOp::Complete);
            assert!(
                drained.is_ok(),
                "{mode:?}: the background store still ran {:?} after the claim's {LEASE:?} \
                 lease (the store was asked {} times)",
                LEASE * 4,
                store.calls(StoreOp::Complete)
            );
        }
        schema.drop().await;
    }
}
