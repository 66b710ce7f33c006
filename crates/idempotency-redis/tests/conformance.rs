//! The conformance suite against the real Redis server (each case under its own key prefix and
//! random scopes), through the local replay tier, and against a throwaway three-master Redis
//! Cluster.

mod redis {
    use idempotency_redis::RedisStore;
    use idempotency_testkit::TempRedisCluster;
    use idempotency_testkit::env::{redis_url, server_unreachable};

    fn prefix() -> String {
        format!("idem-t:{}:", uuid::Uuid::new_v4().simple())
    }

    async fn single_node() -> RedisStore {
        let url = redis_url();
        RedisStore::builder(&url)
            .key_prefix(prefix())
            .build()
            .await
            .unwrap_or_else(|e| server_unreachable("Redis", &url, &e))
    }

    mod single {
        use super::*;
        idempotency_conformance::conformance_suite!(single_node());
    }

    /// The suite through the local replay tier (`idempotency_memory::ReplayTier`).
    mod single_through_the_replay_tier {
        use super::*;
        idempotency_conformance::conformance_suite!(async {
            idempotency_memory::ReplayTier::new(single_node().await)
        });
    }

    /// The whole suite against three masters; the cluster's servers stop when the test ends.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn cluster_of_three_masters_passes_the_whole_suite() {
        let cluster = TempRedisCluster::start()
            .unwrap_or_else(|e| panic!("could not start a throwaway Redis Cluster: {e}"));
        let urls = cluster.urls();
        idempotency_conformance::run_conformance!(async {
            RedisStore::cluster_builder(urls.clone())
                .key_prefix(prefix())
                .build()
                .await
                .unwrap_or_else(|e| panic!("could not connect to the throwaway cluster: {e}"))
        });
        let per_node = cluster.keys_per_node().expect("DBSIZE");
        assert!(
            per_node.iter().filter(|&&n| n > 0).count() >= 2,
            "records must spread over the masters' slots: {per_node:?}"
        );
    }
}
