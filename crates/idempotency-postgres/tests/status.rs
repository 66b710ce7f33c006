//! What `status()` (and `idempotency check`) tells an operator about the key table's contents:
//! its size, its records, the expired ones waiting for the purge, and the claims in flight with
//! the age of the oldest; and the footprint a scrape reads (`idempotency_store_records`).

mod postgres {
    use idempotency_core::store::{ClaimOutcome, FenceOutcome};
    use idempotency_core::{
        BodyCanonicalization, Fingerprint, IdempotencyKey, IdempotencyStore, KeyFormat, LeaseToken,
        Scope, StoredResponse,
    };
    use idempotency_postgres::{PostgresStore, TableMode};
    use idempotency_testkit::TestSchema;
    use idempotency_testkit::env::postgres_url;
    use std::time::Duration;

    fn key(name: &str) -> IdempotencyKey {
        IdempotencyKey::parse(name.as_bytes(), KeyFormat::opaque()).expect("key")
    }

    fn fp() -> Fingerprint {
        Fingerprint::of_request("POST", "/tasks", b"{}", BodyCanonicalization::Raw)
    }

    /// A store on a LOGGED key table in `schema`, migrated.
    async fn migrated_store(schema: &TestSchema) -> PostgresStore {
        let store = PostgresStore::builder(postgres_url())
            .schema(schema.name())
            .table_mode(TableMode::Logged)
            .build()
            .await
            .expect("store");
        store.migrate().await.expect("migrate");
        store
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn status_counts_records_expired_rows_and_claims_in_flight() {
        let schema = TestSchema::new("idem_status");
        let store = migrated_store(&schema).await;
        let scope = Scope::new("operator").expect("scope");

        let empty = store.status().await.expect("status");
        let contents = empty.contents.clone().expect("the table exists");
        assert_eq!(
            (contents.records, contents.expired, contents.in_flight),
            (0, 0, 0),
            "the sentinel is not counted: {empty}"
        );
        assert_eq!(contents.oldest_in_flight, None);
        assert!(contents.size_bytes > 0, "{contents:?}");

        // Two completed records, one that expires at once, and two claims still in flight.
        for (name, retention) in [
            ("done-1", Duration::from_secs(3600)),
            ("done-2", Duration::from_secs(3600)),
            ("gone", Duration::from_millis(1)),
        ] {
            let token = LeaseToken::new();
            let claimed = store
                .claim(&scope, &key(name), &fp(), token, Duration::from_secs(60))
                .await
                .expect("claim");
            assert!(matches!(claimed, ClaimOutcome::Claimed), "{claimed:?}");
            let response = StoredResponse::new(
                idempotency_core::http::StatusCode::CREATED,
                idempotency_core::http::HeaderMap::new(),
                bytes::Bytes::new(),
            );
            let completed = store
                .complete(&scope, &key(name), token, &response, retention)
                .await
                .expect("complete");
            assert_eq!(completed, FenceOutcome::Applied);
        }
        for name in ["running-1", "running-2"] {
            store
                .claim(
                    &scope,
                    &key(name),
                    &fp(),
                    LeaseToken::new(),
                    Duration::from_secs(60),
                )
                .await
                .expect("claim");
        }
        tokio::time::sleep(Duration::from_millis(1100)).await;

        let status = store.status().await.expect("status");
        let contents = status.contents.clone().expect("the table exists");
        assert_eq!(
            (contents.records, contents.expired, contents.in_flight),
            (5, 1, 2),
            "{status}"
        );
        let oldest = contents.oldest_in_flight.expect("claims in flight");
        assert!(
            oldest >= Duration::from_secs(1) && oldest < Duration::from_secs(60),
            "{oldest:?}"
        );
        let shown = status.to_string();
        assert!(
            shown.contains(
                "records: 5 (1 expired, waiting for the purge; 2 in flight, the oldest for 1 s)"
            ),
            "{shown}"
        );
        assert!(status.problems().is_empty(), "{:?}", status.problems());

        // The footprint a scrape reads: before the table was first analyzed its rows are
        // counted (the sentinel's included), after it the catalog's estimate is read.
        let footprint = store.footprint().await.expect("footprint").expect("told");
        assert_eq!(footprint.records, Some(6), "{footprint:?}");
        assert_eq!(footprint.bytes, Some(contents.size_bytes), "{footprint:?}");
        let url = postgres_url();
        let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .expect("connect");
        let connection = tokio::spawn(connection);
        client
            .batch_execute(&format!("ANALYZE \"{}\".idempotency_keys", schema.name()))
            .await
            .expect("analyze");
        client
            .batch_execute(&format!(
                "UPDATE pg_class SET reltuples = 1234 WHERE oid = '\"{}\".idempotency_keys'::regclass",
                schema.name()
            ))
            .await
            .expect("set the estimate");
        let estimated = store.footprint().await.expect("footprint").expect("told");
        assert_eq!(
            estimated.records,
            Some(1234),
            "the catalog's figure: {estimated:?}"
        );
        drop(client);
        let _ = connection.await;
        schema.drop().await;
    }

    /// On a table never analyzed (here autovacuum is off for it) the footprint counts its rows,
    /// but at most 100,000 of them, so a scrape never reads a large table: 100,010 rows report
    /// 100,000 until the table is analyzed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_footprint_counts_at_most_its_cap_before_the_first_analyze() {
        let schema = TestSchema::new("idem_footprint");
        let store = migrated_store(&schema).await;
        let (client, connection) = tokio_postgres::connect(&postgres_url(), tokio_postgres::NoTls)
            .await
            .expect("connect");
        let connection = tokio::spawn(connection);
        let table = format!("\"{}\".idempotency_keys", schema.name());
        client
            .batch_execute(&format!(
                "ALTER TABLE {table} SET (autovacuum_enabled = false); \
                 INSERT INTO {table} (user_id, key, request_hash, status_code, response, created_at, expires_at) \
                 SELECT 'u', 'k' || i, '\\x01'::bytea, 201, '\\x01'::bytea, now(), now() + interval '1 hour' \
                 FROM generate_series(1, 100010) AS i"
            ))
            .await
            .expect("fill the table");
        let footprint = store.footprint().await.expect("footprint").expect("told");
        assert_eq!(footprint.records, Some(100_000), "{footprint:?}");
        client
            .batch_execute(&format!("ANALYZE {table}"))
            .await
            .expect("analyze");
        let analyzed = store.footprint().await.expect("footprint").expect("told");
        let records = analyzed.records.expect("estimated");
        assert!(
            (95_000..=105_000).contains(&records),
            "the catalog's estimate after ANALYZE: {analyzed:?}"
        );
        drop(client);
        let _ = connection.await;
        schema.drop().await;
    }
}
