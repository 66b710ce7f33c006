//! A lock on the key table (`LOCK TABLE .. ACCESS EXCLUSIVE`, as `VACUUM FULL` or an `ALTER`
//! takes) under traffic (issue 46 item 1). Before: each new pooled connection wrote the state
//! sentinel into the locked table, its creation timed out, the pool dropped it and opened
//! another, and the dropped backend went on waiting for the lock: a demo on `pool_size(32)` went
//! from 4 to 119 backends in 16 s and PostgreSQL refused every other client. The store must
//! never hold more backends than its pool, whatever the database does.

mod postgres {
    use idempotency_core::{
        BodyCanonicalization, Fingerprint, IdempotencyKey, IdempotencyStore, KeyFormat, LeaseToken,
        Scope,
    };
    use idempotency_postgres::PostgresStore;
    use idempotency_testkit::TempPostgres;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    const POOL: usize = 6;
    const APP: &str = "idempotency_lock_storm";

    async fn connect(url: &str) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
        tokio::spawn(connection);
        Ok(client)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_locked_key_table_never_makes_the_store_hold_more_backends_than_its_pool() {
        let pg = TempPostgres::start(&["max_connections=40"])
            .unwrap_or_else(|e| panic!("could not start a throwaway PostgreSQL: {e}"));
        let url = pg.url("postgres");
        let store = PostgresStore::builder(format!("{url}?application_name={APP}"))
            .pool_size(POOL)
            .connect_timeout(Duration::from_millis(500))
            .build()
            .await
            .unwrap();
        store.migrate().await.unwrap();
        let locker = connect(&url).await.unwrap();
        locker
            .batch_execute("BEGIN; LOCK TABLE public.idempotency_keys IN ACCESS EXCLUSIVE MODE")
            .await
            .unwrap();

        // Traffic while the lock is held: claims of fresh keys, each bounded as the engine
        // bounds a store call.
        let stop = Arc::new(AtomicBool::new(false));
        let mut senders = Vec::new();
        for sender in 0..16 {
            let (store, stop) = (store.clone(), Arc::clone(&stop));
            senders.push(tokio::spawn(async move {
                let scope = Scope::new("storm").unwrap();
                let fp = Fingerprint::of_request("POST", "/t", b"{}", BodyCanonicalization::Raw);
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    let key = IdempotencyKey::parse(
                        format!("k-{sender}-{i}").as_bytes(),
                        KeyFormat::opaque(),
                    )
                    .unwrap();
                    let claim = store.claim(
                        &scope,
                        &key,
                        &fp,
                        LeaseToken::new(),
                        Duration::from_secs(30),
                    );
                    let _ = tokio::time::timeout(Duration::from_millis(300), claim).await;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }));
        }
        let watcher = connect(&url).await.unwrap();
        let mut most = 0_i64;
        let mut refused = Vec::new();
        for _ in 0..40 {
            tokio::time::sleep(Duration::from_millis(150)).await;
            let backends: i64 = watcher
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
                    &[&APP],
                )
                .await
                .unwrap()
                .get(0);
            most = most.max(backends);
            // Another client of the same database.
            if let Err(error) = connect(&url).await {
                refused.push(error.to_string());
            }
        }
        stop.store(true, Ordering::Relaxed);
        for sender in senders {
            sender.await.unwrap();
        }
        locker.batch_execute("ROLLBACK").await.unwrap();
        assert!(
            most <= POOL as i64,
            "the store held {most} backends on a pool of {POOL} while the key table was locked"
        );
        assert!(
            refused.is_empty(),
            "other clients were refused: {refused:?}"
        );
        // And the store works again once the lock is gone.
        let scope = Scope::new("after").unwrap();
        let key = IdempotencyKey::parse(b"after", KeyFormat::opaque()).unwrap();
        let fp = Fingerprint::of_request("POST", "/t", b"{}", BodyCanonicalization::Raw);
        let until = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            match store
                .claim(
                    &scope,
                    &key,
                    &fp,
                    LeaseToken::new(),
                    Duration::from_secs(30),
                )
                .await
            {
                Ok(_) => break,
                Err(error) if tokio::time::Instant::now() < until => {
                    eprintln!("after the lock: {error}");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(error) => panic!("the store did not recover: {error}"),
            }
        }
    }
}
