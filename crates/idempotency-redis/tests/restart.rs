//! While Redis is down every call is a retryable error, never "absent", and bounded in time;
//! after it comes back the same store works again without being rebuilt.

mod redis {
    use bytes::Bytes;
    use idempotency_core::http::{HeaderMap, StatusCode};
    use idempotency_core::store::{ClaimOutcome, FenceOutcome};
    use idempotency_core::{
        BodyCanonicalization, Fingerprint, IdempotencyKey, IdempotencyStore, KeyFormat, LeaseToken,
        Scope, StoredResponse,
    };
    use idempotency_redis::RedisStore;
    use idempotency_testkit::TempRedis;
    use std::time::{Duration, Instant};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn store_errors_while_redis_is_down_and_recovers_after() {
        let mut server = TempRedis::start(&[]).unwrap_or_else(|e| panic!("throwaway redis: {e}"));
        let store = RedisStore::builder(server.url())
            // Long enough for a busy machine, short enough to fail fast while Redis is down.
            .connect_timeout(Duration::from_secs(1))
            .response_timeout(Duration::from_secs(1))
            .build()
            .await
            .expect("connect");
        let scope = Scope::new("user").expect("scope");
        let fp = Fingerprint::of_request("POST", "/", b"", BodyCanonicalization::Raw);
        let key = |i: u32| {
            IdempotencyKey::parse(format!("k{i}").as_bytes(), KeyFormat::opaque()).expect("key")
        };
        let hour = Duration::from_secs(3600);
        let token = LeaseToken::new();
        assert_eq!(
            store
                .claim(&scope, &key(0), &fp, token, hour)
                .await
                .expect("claim"),
            ClaimOutcome::Claimed
        );

        server.kill().expect("kill redis");
        for i in 1..=5 {
            let started = Instant::now();
            let results = [
                store.get(&scope, &key(0)).await.err(),
                store
                    .claim(&scope, &key(i), &fp, LeaseToken::new(), hour)
                    .await
                    .err(),
                store.release(&scope, &key(0), token).await.err(),
            ];
            let elapsed = started.elapsed();
            for (what, error) in ["get", "claim", "release"].iter().zip(results) {
                let error =
                    error.unwrap_or_else(|| panic!("{what} succeeded while Redis was down"));
                assert!(error.is_retryable(), "{what}: {error} must be retryable");
            }
            assert!(
                elapsed < Duration::from_secs(10),
                "three calls took {elapsed:?} while Redis was down: they must fail fast"
            );
        }

        server.start_server().expect("start redis again");
        let deadline = Instant::now() + Duration::from_secs(15);
        let token = loop {
            let token = LeaseToken::new();
            match store.claim(&scope, &key(100), &fp, token, hour).await {
                Ok(outcome) => {
                    assert_eq!(outcome, ClaimOutcome::Claimed);
                    break token;
                }
                Err(e) => {
                    assert!(e.is_retryable(), "{e}");
                    assert!(Instant::now() < deadline, "the store did not recover: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        };
        let response =
            StoredResponse::new(StatusCode::OK, HeaderMap::new(), Bytes::from_static(b"ok"));
        assert_eq!(
            store
                .complete(&scope, &key(100), token, &response, hour)
                .await
                .expect("complete"),
            FenceOutcome::Applied
        );
        // Persistence was off: the claim made before the restart is gone (Redis' durability, not
        // the library's; production Redis should run with appendonly yes), and the store noticed.
        assert_eq!(store.get(&scope, &key(0)).await.expect("get"), None);
        assert_eq!(
            store.state_losses(),
            1,
            "the loss must be noticed and counted once"
        );
        assert!(!store.check_state().await.expect("check"));
    }
}
