//! TLS against a real TLS-only Redis (`--port 0 --tls-port`), with a CA and certificates made for
//! the test.

mod redis {
    use idempotency_redis::{RedisStore, RedisStoreError};
    use idempotency_testkit::{TempRedis, TempRedisCluster, TestCa};

    fn message(error: &RedisStoreError) -> String {
        idempotency_core::ErrorChain(error).to_string()
    }

    /// With the CA that signed the server's certificate, the whole suite passes over TLS; with
    /// another CA, or with the system's roots (which do not know the test CA), the connection is
    /// refused.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn rediss_passes_the_suite_and_refuses_an_unknown_certificate() {
        let ca = TestCa::new("idempotency test CA").expect("CA");
        let cert = ca.issue(&["localhost", "127.0.0.1"]).expect("certificate");
        let server = TempRedis::start_tls_only(&cert, &ca.root_path()).expect("a TLS-only Redis");
        let url = server.url();
        assert!(url.starts_with("rediss://"), "{url}");
        let root = ca.root_path();
        idempotency_conformance::run_conformance!(async {
            RedisStore::builder(&url)
                .key_prefix(format!("idem-tls:{}:", uuid::Uuid::new_v4().simple()))
                .tls_root_cert(&root)
                .build()
                .await
                .unwrap_or_else(|e| {
                    panic!("rediss with the right CA must connect: {}", message(&e))
                })
        });
        let stranger = TestCa::new("another CA").expect("CA");
        for refused in [
            RedisStore::builder(&url)
                .tls_root_cert(stranger.root_path())
                .build()
                .await,
            RedisStore::builder(&url).build().await,
        ] {
            match refused {
                Ok(_) => panic!("a certificate the client does not trust must be refused"),
                Err(e) => assert!(matches!(e, RedisStoreError::Connect(_)), "{}", message(&e)),
            }
        }
        // Plain text to the TLS port is not Redis talking back.
        let plain = RedisStore::builder(url.replacen("rediss://", "redis://", 1))
            .connect_timeout(std::time::Duration::from_secs(2))
            .response_timeout(std::time::Duration::from_secs(2))
            .build()
            .await;
        assert!(
            plain.is_err(),
            "plain text must not reach a TLS-only server"
        );
    }

    /// A Redis Cluster whose nodes and bus speak TLS only: the whole suite passes through
    /// `rediss://` node URLs and the test CA.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_tls_cluster_passes_the_suite() {
        let ca = TestCa::new("idempotency test CA").expect("CA");
        let cert = ca.issue(&["localhost", "127.0.0.1"]).expect("certificate");
        let cluster = TempRedisCluster::start_tls_only(&cert, &ca.root_path())
            .expect("a TLS-only Redis Cluster");
        let urls = cluster.urls();
        assert!(urls.iter().all(|u| u.starts_with("rediss://")), "{urls:?}");
        let root = ca.root_path();
        idempotency_conformance::run_conformance!(async {
            RedisStore::cluster_builder(urls.clone())
                .key_prefix(format!("idem-tls:{}:", uuid::Uuid::new_v4().simple()))
                .tls_root_cert(&root)
                .build()
                .await
                .unwrap_or_else(|e| panic!("the TLS cluster must connect: {}", message(&e)))
        });
        let per_node = cluster.keys_per_node().expect("DBSIZE");
        assert!(
            per_node.iter().filter(|&&n| n > 0).count() >= 2,
            "records must spread over the masters: {per_node:?}"
        );
    }
}
