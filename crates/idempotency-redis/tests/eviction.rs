//! Eviction under `maxmemory`, on throwaway servers: an evicting policy is refused when the
//! store is built; allowed, it loses completed records (a retry of one runs again) and the
//! evictions are counted, by an explicit check and by the store's watch.

mod redis {
    use bytes::Bytes;
    use idempotency_core::http::{HeaderMap, StatusCode};
    use idempotency_core::store::{ClaimOutcome, FenceOutcome};
    use idempotency_core::{
        BodyCanonicalization, Fingerprint, IdempotencyKey, IdempotencyStore, KeyFormat, LeaseToken,
        Scope, StoredResponse,
    };
    use idempotency_redis::{RedisStore, RedisStoreError};
    use idempotency_testkit::TempRedis;
    use std::time::Duration;

    const HOUR: Duration = Duration::from_secs(3600);

    fn server(policy: &str) -> TempRedis {
        TempRedis::start(&["--maxmemory", "4mb", "--maxmemory-policy", policy])
            .unwrap_or_else(|e| panic!("could not start a throwaway redis-server: {e}"))
    }

    fn key(i: usize) -> IdempotencyKey {
        IdempotencyKey::parse(format!("key-{i}").as_bytes(), KeyFormat::opaque()).expect("key")
    }

    /// What [`fill`] saw.
    #[derive(Debug, Default)]
    struct Filled {
        /// Keys whose completion was applied.
        completed: usize,
        /// Keys whose completion was refused as `Stale`: an evicting server dropped the claim
        /// between the claim and its completion (an in-flight claim has a TTL like any record).
        claim_evicted: usize,
        /// The answer that stopped the fill (a full server under `noeviction`), if any.
        stopped: Option<String>,
    }

    /// Claims and completes `n` keys with 32 KiB responses each.
    async fn fill(store: &RedisStore, scope: &Scope, n: usize) -> Filled {
        let fp = Fingerprint::of_request("POST", "/", b"", BodyCanonicalization::Raw);
        let body = Bytes::from(vec![b'x'; 32 * 1024]);
        let mut filled = Filled::default();
        for i in 0..n {
            let token = LeaseToken::new();
            match store.claim(scope, &key(i), &fp, token, HOUR).await {
                Ok(ClaimOutcome::Claimed) => {}
                other => {
                    filled.stopped = Some(format!("claim {i}: {other:?}"));
                    break;
                }
            }
            let response = StoredResponse::new(StatusCode::CREATED, HeaderMap::new(), body.clone());
            match store.complete(scope, &key(i), token, &response, HOUR).await {
                Ok(FenceOutcome::Applied) => filled.completed += 1,
                Ok(FenceOutcome::Stale) => filled.claim_evicted += 1,
                other => {
                    filled.stopped = Some(format!("complete {i}: {other:?}"));
                    break;
                }
            }
        }
        filled
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_evicting_policy_is_refused_when_the_store_is_built() {
        // volatile-* policies evict records too: every record has a TTL.
        for policy in [
            "allkeys-lru",
            "volatile-lru",
            "volatile-ttl",
            "allkeys-random",
        ] {
            let server = server(policy);
            match RedisStore::builder(server.url()).build().await {
                Err(RedisStoreError::EvictingPolicy { policy: found, .. }) => {
                    assert_eq!(found, policy)
                }
                Err(other) => panic!("{policy}: refused for another reason: {other}"),
                Ok(_) => panic!("{policy}: a store was built on a server that evicts records"),
            }
            let error = RedisStore::builder(server.url())
                .build()
                .await
                .expect_err("refused");
            let message = error.to_string();
            assert!(
                message.contains(policy)
                    && message.contains("noeviction")
                    && message.contains("allow_eviction"),
                "the error must name the policy and both ways out: {message}"
            );
            RedisStore::builder(server.url())
                .allow_eviction()
                .build()
                .await
                .unwrap_or_else(|e| panic!("{policy}: allowed, the store must build: {e}"));
        }
        let server = server("noeviction");
        RedisStore::builder(server.url())
            .build()
            .await
            .expect("noeviction is the policy the store asks for");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn allowed_eviction_loses_completed_records_and_counts_the_evictions() {
        let server = server("allkeys-lru");
        let store = RedisStore::builder(server.url())
            .allow_eviction()
            .watch_interval(None)
            .build()
            .await
            .expect("allowed");
        let scope = Scope::new("user").expect("scope");
        // 8 MiB of responses into 4 MiB.
        let filled = fill(&store, &scope, 256).await;
        assert!(
            filled.stopped.is_none() && filled.completed + filled.claim_evicted == 256,
            "an evicting server accepts every write: {filled:?}"
        );
        // A claim evicted before its completion is refused there (the fence answers `Stale`),
        // never written back as completed; most claims live to their completion.
        assert!(filled.completed > filled.claim_evicted, "{filled:?}");
        let evicted = store.check_evictions().await.expect("INFO stats");
        assert!(evicted > 0, "Redis must have evicted keys");
        assert_eq!(store.evicted_keys_seen(), evicted);
        assert_eq!(
            store.check_evictions().await.expect("INFO stats"),
            0,
            "counted once"
        );
        // What a client sees: the retry of a key whose record was evicted runs again.
        let mut lost = 0;
        for i in 0..256 {
            if store.get(&scope, &key(i)).await.expect("get").is_none() {
                lost += 1;
                let fp = Fingerprint::of_request("POST", "/", b"", BodyCanonicalization::Raw);
                let retry = store
                    .claim(&scope, &key(i), &fp, LeaseToken::new(), HOUR)
                    .await
                    .expect("claim");
                assert_eq!(retry, ClaimOutcome::Claimed, "an evicted key is free again");
            }
        }
        assert!(
            lost > 0,
            "completed records were evicted, so some retries run again"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_watch_counts_evictions_by_itself() {
        let server = server("allkeys-lru");
        let store = RedisStore::builder(server.url())
            .allow_eviction()
            .watch_interval(Some(Duration::from_millis(100)))
            .build()
            .await
            .expect("allowed");
        let scope = Scope::new("user").expect("scope");
        let filled = fill(&store, &scope, 256).await;
        assert!(
            filled.stopped.is_none(),
            "an evicting server accepts every write: {filled:?}"
        );
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while store.evicted_keys_seen() == 0 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the watch did not count the evictions within 10 s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn under_noeviction_a_full_server_refuses_writes_and_keeps_every_record() {
        let server = server("noeviction");
        let store = RedisStore::builder(server.url())
            .watch_interval(None)
            .build()
            .await
            .expect("noeviction");
        let scope = Scope::new("user").expect("scope");
        let filled = fill(&store, &scope, 256).await;
        let completed = filled.completed;
        assert!(completed < 256, "4 MiB cannot hold 8 MiB of responses");
        assert_eq!(
            filled.claim_evicted, 0,
            "noeviction drops nothing: {filled:?}"
        );
        let stopped = filled.stopped.expect("a full server stopped the fill");
        assert!(
            stopped.contains("Full"),
            "stopped by a full server: {stopped}"
        );
        let fp = Fingerprint::of_request("POST", "/", b"", BodyCanonicalization::Raw);
        let refused = store
            .claim(&scope, &key(10_000), &fp, LeaseToken::new(), HOUR)
            .await
            .expect_err("a full server refuses a new claim");
        assert!(
            matches!(refused, idempotency_core::StoreError::Full { .. }) && refused.is_retryable(),
            "a full Redis is a retryable Full (503), not a failure: {refused}"
        );
        // Replays only read: they are still answered at maxmemory, through claim as the engine
        // asks, and through get.
        for i in 0..completed {
            assert!(
                store.get(&scope, &key(i)).await.expect("get").is_some(),
                "record {i} was lost under noeviction"
            );
            match store
                .claim(&scope, &key(i), &fp, LeaseToken::new(), HOUR)
                .await
            {
                Ok(ClaimOutcome::Existing(_)) => {}
                other => panic!("the replay of key {i} at maxmemory got {other:?}"),
            }
        }
        assert_eq!(store.check_evictions().await.expect("INFO stats"), 0);
    }

    /// A server with `CONFIG` disabled, as on ElastiCache: the store builds (its checks read
    /// `INFO`), and `status` reads persistence and eviction from `INFO`, with the snapshot
    /// schedule unknown rather than an error.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn without_config_the_settings_come_from_info() {
        let redis = TempRedis::start(&[
            "--rename-command",
            "CONFIG",
            "",
            "--appendonly",
            "yes",
            "--maxmemory",
            "64mb",
            "--maxmemory-policy",
            "noeviction",
        ])
        .unwrap_or_else(|e| panic!("could not start a throwaway redis-server: {e}"));
        let store = RedisStore::builder(redis.url())
            .key_prefix("idem-noconfig:")
            .build()
            .await
            .expect("build without CONFIG");
        let info = store.status().await.expect("server info without CONFIG");
        assert!(info.appendonly, "{info}");
        assert_eq!(info.save, None, "{info}");
        assert_eq!(info.maxmemory, 64 * 1024 * 1024, "{info}");
        assert_eq!(info.maxmemory_policy, "noeviction", "{info}");
        assert!(info.problems().is_empty(), "{:?}", info.problems());
        assert!(!info.version.is_empty());
    }
}
