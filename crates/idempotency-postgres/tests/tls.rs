//! TLS against a real TLS-only PostgreSQL (pg_hba `hostssl` lines only), with a CA and
//! certificates made for the test: each `sslmode` connects or is refused as libpq's would.

mod postgres {
    use idempotency_core::store::ClaimOutcome;
    use idempotency_core::{
        BodyCanonicalization, Fingerprint, IdempotencyKey, IdempotencyStore, KeyFormat, LeaseToken,
        Scope,
    };
    use idempotency_postgres::{PostgresStore, PostgresStoreError};
    use idempotency_testkit::{TempPostgres, TestCa};
    use std::path::Path;
    use std::time::Duration;

    fn url(port: u16, host: &str, params: &str) -> String {
        format!("postgres://postgres@{host}:{port}/postgres?{params}")
    }

    fn root(path: &Path) -> String {
        path.to_string_lossy().replace('/', "%2F")
    }

    async fn connect(url: &str) -> Result<PostgresStore, PostgresStoreError> {
        PostgresStore::builder(url)
            .connect_timeout(Duration::from_secs(5))
            .pool_size(2)
            .build()
            .await
    }

    /// Whether the store's connection is encrypted, as the server sees it.
    async fn encrypted(store: &PostgresStore) -> bool {
        let client = store.pool().get().await.expect("connection");
        client
            .query_one(
                "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
                &[],
            )
            .await
            .expect("pg_stat_ssl")
            .get(0)
    }

    /// The whole message of an error, with its causes.
    fn message(error: &PostgresStoreError) -> String {
        idempotency_core::ErrorChain(error).to_string()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn each_sslmode_connects_or_is_refused_as_libpq_would() {
        let ca = TestCa::new("idempotency test CA").expect("CA");
        let cert = ca.issue(&["localhost", "127.0.0.1"]).expect("certificate");
        let pg = TempPostgres::start_tls_only(&cert, &[]).expect("a TLS-only PostgreSQL");
        let port = pg.port();
        let ca_file = root(&ca.root_path());

        // verify-full, with the CA that signed the server's certificate: connects over TLS,
        // migrates and runs a claim.
        let store = connect(&url(
            port,
            "localhost",
            &format!("sslmode=verify-full&sslrootcert={ca_file}"),
        ))
        .await
        .unwrap_or_else(|e| panic!("verify-full must connect: {}", message(&e)));
        store.migrate().await.expect("migrate over TLS");
        assert!(encrypted(&store).await, "the connection must be encrypted");
        let key = IdempotencyKey::parse(b"tls-key", KeyFormat::opaque()).expect("key");
        let fp = Fingerprint::of_request("POST", "/", b"", BodyCanonicalization::Raw);
        let claimed = store
            .claim(
                &Scope::new("u").expect("scope"),
                &key,
                &fp,
                LeaseToken::new(),
                Duration::from_secs(5),
            )
            .await
            .expect("claim over TLS");
        assert_eq!(claimed, ClaimOutcome::Claimed);

        // Plain text: the server has no `host` line for it.
        let plain = connect(&url(port, "127.0.0.1", "sslmode=disable")).await;
        assert!(plain.is_err(), "a TLS-only server must refuse plain text");

        // A CA that did not sign the certificate: refused, in both verifying modes.
        let stranger = TestCa::new("another CA").expect("CA");
        let stranger_file = root(&stranger.root_path());
        for mode in ["verify-full", "verify-ca"] {
            let refused = connect(&url(
                port,
                "localhost",
                &format!("sslmode={mode}&sslrootcert={stranger_file}"),
            ))
            .await;
            match refused {
                Ok(_) => {
                    panic!("{mode} with a CA that did not sign the certificate must be refused")
                }
                Err(e) => assert!(
                    message(&e).to_lowercase().contains("certificate"),
                    "the error must say why: {}",
                    message(&e)
                ),
            }
        }

        // require without a root: encrypted, certificate not checked (libpq's meaning).
        connect(&url(port, "localhost", "sslmode=require"))
            .await
            .unwrap_or_else(|e| panic!("require must connect: {}", message(&e)));

        // An unreadable root file is a clear setup error.
        match connect(&url(
            port,
            "localhost",
            "sslmode=verify-full&sslrootcert=%2Fno%2Fsuch.pem",
        ))
        .await
        {
            Err(PostgresStoreError::InvalidTls(why)) => {
                assert!(why.contains("/no/such.pem"), "{why}")
            }
            other => panic!(
                "an unreadable sslrootcert must be InvalidTls, got {:?}",
                other.map(|_| ())
            ),
        }
    }

    /// A server that declines TLS (no certificate, `ssl=off`): `prefer` (the default) falls
    /// back to plain text, as libpq's does, and says so at build when a password would cross
    /// it; `require` and the verifying modes refuse it. `verify-ca` without a root file is
    /// refused before connecting.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_server_declining_tls_gets_plain_text_only_under_prefer() {
        let pg = TempPostgres::start(&[]).expect("a plain PostgreSQL");
        let port = pg.port();
        for params in ["", "sslmode=prefer"] {
            let store = connect(&url(port, "127.0.0.1", params))
                .await
                .unwrap_or_else(|e| panic!("prefer must fall back: {}", message(&e)));
            assert!(
                !encrypted(&store).await,
                "{params:?}: a declining server gets plain text"
            );
        }
        for mode in ["require", "verify-full"] {
            let refused = connect(&url(port, "127.0.0.1", &format!("sslmode={mode}"))).await;
            assert!(
                refused.is_err(),
                "sslmode={mode} must refuse a server without TLS"
            );
        }
        match connect(&url(port, "127.0.0.1", "sslmode=verify-ca")).await {
            Err(PostgresStoreError::InvalidTls(why)) => {
                assert!(why.contains("sslrootcert"), "{why}")
            }
            other => panic!(
                "verify-ca without a root must be refused, got {:?}",
                other.map(|_| ())
            ),
        }
    }

    /// A certificate issued for another name: `verify-full` refuses it, `verify-ca` (chain only)
    /// accepts it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn verify_full_checks_the_name_and_verify_ca_does_not() {
        let ca = TestCa::new("idempotency test CA").expect("CA");
        let cert = ca.issue(&["db.example.internal"]).expect("certificate");
        let pg = TempPostgres::start_tls_only(&cert, &[]).expect("a TLS-only PostgreSQL");
        let ca_file = root(&ca.root_path());
        let full = connect(&url(
            pg.port(),
            "localhost",
            &format!("sslmode=verify-full&sslrootcert={ca_file}"),
        ))
        .await;
        match full {
            Ok(_) => panic!("verify-full must refuse a certificate for another name"),
            Err(e) => assert!(
                message(&e).to_lowercase().contains("certificate"),
                "{}",
                message(&e)
            ),
        }
        connect(&url(
            pg.port(),
            "localhost",
            &format!("sslmode=verify-ca&sslrootcert={ca_file}"),
        ))
        .await
        .unwrap_or_else(|e| panic!("verify-ca must accept the chain: {}", message(&e)));
    }
}
