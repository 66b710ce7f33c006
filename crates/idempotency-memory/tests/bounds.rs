//! The memory store's bounds: in-flight claims are never evicted, completed records are.
#![allow(clippy::unwrap_used)]

mod memory {
    use bytes::Bytes;
    use idempotency_core::http::{HeaderMap, StatusCode};
    use idempotency_core::store::{ClaimOutcome, FenceOutcome};
    use idempotency_core::{
        BodyCanonicalization, Fingerprint, IdempotencyKey, IdempotencyStore, KeyFormat, LeaseToken,
        Scope, StoreError, StoredResponse,
    };
    use idempotency_memory::MemoryStore;
    use std::time::Duration;

    const HOUR: Duration = Duration::from_secs(3600);

    fn key(i: usize) -> IdempotencyKey {
        IdempotencyKey::parse(format!("key-{i}").as_bytes(), KeyFormat::opaque()).unwrap()
    }

    #[tokio::test]
    async fn in_flight_claims_survive_cache_pressure_and_the_limit_fails_closed() {
        let store = MemoryStore::builder()
            .max_stored_bytes(16 * 1024)
            .max_in_flight(100)
            .build();
        let users = Scope::new("users").unwrap();
        let flood = Scope::new("flood").unwrap();
        let fp = Fingerprint::of_request("POST", "/", b"", BodyCanonicalization::Raw);

        // 99 requests hold their claims for the whole test.
        let mut held = Vec::new();
        for i in 0..99 {
            let token = LeaseToken::new();
            let outcome = store
                .claim(&users, &key(i), &fp, token, HOUR)
                .await
                .unwrap();
            assert_eq!(outcome, ClaimOutcome::Claimed);
            held.push(token);
        }

        // Through the one free slot, 50 requests of 4 KiB complete: 12x the 16 KiB byte bound.
        let body = Bytes::from(vec![7u8; 4096]);
        for i in 0..50 {
            let (t, k) = (LeaseToken::new(), key(i));
            assert_eq!(
                store.claim(&flood, &k, &fp, t, HOUR).await.unwrap(),
                ClaimOutcome::Claimed
            );
            let r = StoredResponse::new(StatusCode::OK, HeaderMap::new(), body.clone());
            assert_eq!(
                store.complete(&flood, &k, t, &r, HOUR).await.unwrap(),
                FenceOutcome::Applied
            );
        }
        assert!(
            store.stored_bytes() <= 16 * 1024,
            "stored {} bytes",
            store.stored_bytes()
        );
        assert!(
            store.evicted_records() > 0,
            "the flood must evict completed records"
        );

        // The in-flight bound fails closed with a retryable error.
        let t = LeaseToken::new();
        assert_eq!(
            store.claim(&users, &key(99), &fp, t, HOUR).await.unwrap(),
            ClaimOutcome::Claimed
        );
        match store
            .claim(&users, &key(100), &fp, LeaseToken::new(), HOUR)
            .await
        {
            Err(e @ StoreError::Full { .. }) => assert!(e.is_retryable()),
            other => panic!("the 101st claim must fail closed, got {other:?}"),
        }

        // Every claim held through the flood is still held by its token.
        for (i, token) in held.into_iter().enumerate() {
            assert!(matches!(
                store
                    .claim(&users, &key(i), &fp, LeaseToken::new(), HOUR)
                    .await
                    .unwrap(),
                ClaimOutcome::Existing(_)
            ));
            let r =
                StoredResponse::new(StatusCode::OK, HeaderMap::new(), Bytes::from_static(b"ok"));
            assert_eq!(
                store
                    .complete(&users, &key(i), token, &r, HOUR)
                    .await
                    .unwrap(),
                FenceOutcome::Applied,
                "claim {i} was lost under cache pressure"
            );
        }
    }

    /// A million distinct keys through the store: the completed records stay within the byte
    /// bound (passed, while completions run, by at most the record each of them is adding), and
    /// no claim is left in flight once every request completed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_million_keys_stay_within_the_configured_capacity() {
        const CAP: u64 = 8 * 1024 * 1024;
        let store = MemoryStore::builder().max_stored_bytes(CAP).build();
        let fp = Fingerprint::of_request("POST", "/", b"", BodyCanonicalization::Raw);
        let body = Bytes::from(vec![b'x'; 100]);
        let mut tasks = Vec::new();
        for worker in 0..2u32 {
            let (store, body) = (store.clone(), body.clone());
            tasks.push(tokio::spawn(async move {
                let scope = Scope::new(format!("user-{worker}")).unwrap();
                let mut peak = 0u64;
                for i in 0..500_000u32 {
                    let key =
                        IdempotencyKey::parse(format!("k{i}").as_bytes(), KeyFormat::opaque())
                            .unwrap();
                    let token = LeaseToken::new();
                    assert_eq!(
                        store.claim(&scope, &key, &fp, token, HOUR).await.unwrap(),
                        ClaimOutcome::Claimed
                    );
                    let r = StoredResponse::new(StatusCode::OK, HeaderMap::new(), body.clone());
                    assert_eq!(
                        store.complete(&scope, &key, token, &r, HOUR).await.unwrap(),
                        FenceOutcome::Applied
                    );
                    if i % 50_000 == 0 {
                        peak = peak.max(store.stored_bytes());
                    }
                }
                peak
            }));
        }
        let mut peak = 0;
        for t in tasks {
            peak = peak.max(t.await.unwrap());
        }
        let end = store.stored_bytes();
        // A record here weighs its id, ~110 bytes encoded and the fixed overhead: under 600.
        let in_progress = 2 * 600;
        assert!(
            peak <= CAP + in_progress,
            "peak {peak} bytes: over the {CAP} byte bound by more than two records"
        );
        assert!(end <= CAP, "{end} bytes over the {CAP} byte bound at rest");
        assert!(
            store.evicted_records() > 900_000,
            "evicted {}",
            store.evicted_records()
        );
        assert_eq!(store.in_flight_claims(), 0);
    }

    /// With `WhenFull::RefuseNewClaims`, nothing completed is evicted: at the bound new claims
    /// fail with a retryable error, every completed key still replays, and claims are taken
    /// again once records expire.
    #[tokio::test]
    async fn refusing_new_claims_at_the_bound_keeps_every_completed_record() {
        use idempotency_core::store::{Record, RecordState};
        use idempotency_memory::WhenFull;
        const CAP: u64 = 64 * 1024;
        let store = MemoryStore::builder()
            .max_stored_bytes(CAP)
            .when_full(WhenFull::RefuseNewClaims)
            // The bound itself, reached by one scope: no per-scope share before it.
            .max_bytes_per_scope(u64::MAX)
            .build();
        let scope = Scope::new("user").unwrap();
        let fp = Fingerprint::of_request("POST", "/", b"", BodyCanonicalization::Raw);
        let retention = Duration::from_millis(300);
        let body = Bytes::from(vec![b'x'; 1000]);
        let mut completed = 0;
        let refused = loop {
            let (k, t) = (key(completed), LeaseToken::new());
            match store.claim(&scope, &k, &fp, t, HOUR).await {
                Ok(ClaimOutcome::Claimed) => {}
                Err(e) => break e,
                Ok(other) => panic!("{other:?}"),
            }
            let r = StoredResponse::new(StatusCode::OK, HeaderMap::new(), body.clone());
            assert_eq!(
                store.complete(&scope, &k, t, &r, retention).await.unwrap(),
                FenceOutcome::Applied
            );
            completed += 1;
            assert!(completed < 1000, "the bound never refused a claim");
        };
        assert!(matches!(refused, StoreError::Full { .. }) && refused.is_retryable());
        assert!(
            completed > 10,
            "only {completed} records fit in {CAP} bytes"
        );
        assert_eq!(store.evicted_records(), 0);
        for i in 0..completed {
            match store.get(&scope, &key(i)).await.unwrap() {
                Some(Record {
                    state: RecordState::Completed { response, .. },
                    ..
                }) => assert_eq!(response.body(), &body),
                other => panic!("record {i} was lost: {other:?}"),
            }
        }
        // Once they expire, new claims are taken again: the claim that finds the store full
        // has the expired records swept first (nobody calls `purge_expired`).
        tokio::time::sleep(retention + Duration::from_millis(150)).await;
        assert_eq!(
            store
                .claim(&scope, &key(completed), &fp, LeaseToken::new(), HOUR)
                .await
                .unwrap(),
            ClaimOutcome::Claimed
        );
        assert!(
            store.stored_bytes() < CAP / 10,
            "expired records still counted: {} bytes",
            store.stored_bytes()
        );
    }
}
