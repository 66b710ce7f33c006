//! Tests on throwaway PostgreSQL clusters: crash loss (the ADR's accepted risk), a failover to a
//! promoted standby, the pg_cron purge job, and refusing a standby. Each starts its own cluster
//! on a free loopback port.

mod postgres {
    use bytes::Bytes;
    use idempotency_core::http::{HeaderMap, StatusCode};
    use idempotency_core::store::{ClaimOutcome, FenceOutcome, RecordState};
    use idempotency_core::{
        BodyCanonicalization, Fingerprint, IdempotencyKey, IdempotencyStore, KeyFormat, LeaseToken,
        Scope, StoredResponse,
    };
    use idempotency_postgres::{PostgresStore, PostgresStoreError, PurgeJob, TableMode};
    use idempotency_testkit::TempPostgres;
    use std::time::Duration;

    const HOUR: Duration = Duration::from_secs(3600);

    fn key(i: usize) -> IdempotencyKey {
        IdempotencyKey::parse(format!("key-{i}").as_bytes(), KeyFormat::opaque())
            .expect("valid key")
    }

    fn fp() -> Fingerprint {
        Fingerprint::of_request("POST", "/tasks", b"{}", BodyCanonicalization::Raw)
    }

    fn cluster(settings: &[&str]) -> TempPostgres {
        TempPostgres::start(settings)
            .unwrap_or_else(|e| panic!("could not start a throwaway PostgreSQL: {e}"))
    }

    /// A throwaway cluster with pg_cron loaded and its extension created, and a connection to it.
    async fn pg_cron_cluster() -> (TempPostgres, tokio_postgres::Client) {
        idempotency_testkit::require_library("pg_cron", "postgresql-{version}-cron")
            .unwrap_or_else(|e| panic!("{e}"));
        let pg = cluster(&[
            "shared_preload_libraries=pg_cron",
            "cron.database_name=postgres",
            "cron.use_background_workers=on",
            "max_worker_processes=20",
        ]);
        let (client, connection) =
            tokio_postgres::connect(&pg.url("postgres"), tokio_postgres::NoTls)
                .await
                .expect("connect");
        tokio::spawn(connection);
        client
            .batch_execute("CREATE EXTENSION pg_cron")
            .await
            .unwrap_or_else(|e| panic!("CREATE EXTENSION pg_cron: {e}\n{}", pg.log()));
        (pg, client)
    }

    async fn store(url: &str, schema: &str, mode: TableMode) -> PostgresStore {
        let store = PostgresStore::builder(url)
            .schema(schema)
            .table_mode(mode)
            .pool_size(4)
            .build()
            .await
            .expect("build the store");
        store.migrate().await.expect("migrate");
        store
    }

    async fn complete_records(store: &PostgresStore, scope: &Scope, n: usize) {
        for i in 0..n {
            let token = LeaseToken::new();
            assert_eq!(
                store
                    .claim(scope, &key(i), &fp(), token, HOUR)
                    .await
                    .expect("claim"),
                ClaimOutcome::Claimed
            );
            let response = StoredResponse::new(
                StatusCode::CREATED,
                HeaderMap::new(),
                Bytes::from(format!("record {i}")),
            );
            assert_eq!(
                store
                    .complete(scope, &key(i), token, &response, HOUR)
                    .await
                    .expect("complete"),
                FenceOutcome::Applied
            );
        }
    }

    async fn count_rows(store: &PostgresStore) -> i64 {
        let client = store.pool().get().await.expect("connection");
        client
            // Every row but the store's state sentinel (whose scope starts with \x01).
            .query_one(
                &format!(
                    "SELECT count(*) FROM {} WHERE user_id !~ '^\x01'",
                    store.table_name()
                ),
                &[],
            )
            .await
            .expect("count")
            .get(0)
    }

    /// The ADR's accepted risk, shown: after an immediate shutdown the UNLOGGED table is empty and
    /// serves new claims at once, while a LOGGED table kept every record.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn crash_empties_unlogged_and_keeps_logged() {
        let pg = cluster(&[]);
        let url = pg.url("postgres");
        let unlogged = store(&url, "crash_unlogged", TableMode::Unlogged).await;
        let logged = store(&url, "crash_logged", TableMode::Logged).await;
        let scope = Scope::new("user-1").expect("scope");
        complete_records(&unlogged, &scope, 50).await;
        complete_records(&logged, &scope, 50).await;
        assert_eq!(count_rows(&unlogged).await, 50);

        pg.crash().expect("pg_ctl stop -m immediate");
        pg.start_server().expect("restart after the crash");

        // The pool's old connections died with the server; the first checkout after the restart
        // notices a closed connection and opens a new one.
        let mut first = None;
        for _ in 0..20 {
            match unlogged.get(&scope, &key(0)).await {
                Ok(record) => {
                    first = Some(record);
                    break;
                }
                Err(e) => {
                    assert!(
                        e.is_retryable(),
                        "a dead connection must be a retryable error: {e}"
                    );
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
        assert_eq!(
            first,
            Some(None),
            "UNLOGGED records must be gone after a crash"
        );
        assert_eq!(
            count_rows(&unlogged).await,
            0,
            "the UNLOGGED table must be empty"
        );
        // ...and it serves claims at once: the key that completed before the crash runs again.
        assert_eq!(
            unlogged
                .claim(&scope, &key(0), &fp(), LeaseToken::new(), HOUR)
                .await
                .expect("claim"),
            ClaimOutcome::Claimed
        );

        assert_eq!(
            count_rows(&logged).await,
            50,
            "LOGGED must keep every record"
        );
        for i in 0..50 {
            match logged.get(&scope, &key(i)).await.expect("get") {
                Some(record) => match record.state {
                    RecordState::Completed { response, .. } => {
                        assert_eq!(response.body(), &Bytes::from(format!("record {i}")))
                    }
                    other => panic!("record {i} is not completed: {other:?}"),
                },
                None => panic!("LOGGED lost record {i} in the crash"),
            }
        }
    }

    /// `status()` reads the purge job from `cron.job`: a job someone unscheduled shows as missing,
    /// a changed schedule as drift, and `migrate()` puts the job back as configured.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn pg_cron_drift_is_reported_and_migrate_repairs_it() {
        use idempotency_postgres::PurgeStatus;
        let (pg, client) = pg_cron_cluster().await;
        let url = pg.url("postgres");
        let store = |schedule: &'static str| {
            PostgresStore::builder(&url)
                .schema("drift")
                .purge_schedule(schedule)
                .build()
        };
        let hourly = store("0 * * * *").await.expect("build");
        let before = hourly.status().await.expect("status");
        assert_eq!(before.persistence, None);
        assert!(
            before
                .problems()
                .iter()
                .any(|p| p.contains("does not exist"))
        );
        hourly.migrate().await.expect("migrate");
        let job = "idempotency-purge:drift.idempotency_keys";
        let status = hourly.status().await.expect("status");
        assert_eq!(
            status.purge,
            PurgeStatus::Scheduled {
                job_name: job.into(),
                schedule: "0 * * * *".into(),
                active: true
            }
        );
        assert!(status.problems().is_empty(), "{:?}", status.problems());

        // Someone unschedules the job: status says so, migrate puts it back.
        client
            .execute("SELECT cron.unschedule($1)", &[&job])
            .await
            .expect("unschedule");
        let status = hourly.status().await.expect("status");
        assert_eq!(
            status.purge,
            PurgeStatus::Missing {
                job_name: job.into()
            }
        );
        assert!(
            status
                .problems()
                .iter()
                .any(|p| p.contains("missing from cron.job"))
        );
        let report = hourly.migrate().await.expect("migrate");
        assert!(
            report.applied.contains(&"pg_cron purge schedule"),
            "{report:?}"
        );
        assert!(hourly.status().await.expect("status").problems().is_empty());

        // The configured schedule changes: drift until migrate applies it.
        let every_ten = store("*/10 * * * *").await.expect("build");
        let drift = every_ten.status().await.expect("status");
        assert!(
            drift
                .problems()
                .iter()
                .any(|p| p.contains("\"0 * * * *\"") && p.contains("*/10")),
            "{:?}",
            drift.problems()
        );
        every_ten.migrate().await.expect("migrate");
        let status = every_ten.status().await.expect("status");
        assert!(status.problems().is_empty(), "{:?}", status.problems());
        let jobs: i64 = client
            .query_one("SELECT count(*) FROM cron.job WHERE jobname = $1", &[&job])
            .await
            .expect("count jobs")
            .get(0);
        assert_eq!(jobs, 1, "one job, rescheduled in place");
    }

    /// The pg_cron migration schedules the purge, and a run of the job deletes exactly the expired
    /// rows. pg_cron's shortest interval is one minute, so this waits up to ~90 s.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn pg_cron_job_purges_exactly_the_expired_rows() {
        let (pg, client) = pg_cron_cluster().await;
        drop(client);
        let url = pg.url("postgres");
        let store = PostgresStore::builder(&url)
            .schema("cron_test")
            .purge_schedule("* * * * *")
            .build()
            .await
            .expect("build");
        let report = store.migrate().await.expect("migrate");
        assert_eq!(
            report.purge_job,
            PurgeJob::Scheduled {
                job_name: "idempotency-purge:cron_test.idempotency_keys".into(),
                schedule: "* * * * *".into()
            }
        );
        assert!(report.applied.contains(&"0002_schedule_purge_with_pg_cron"));
        // Migrating again changes nothing and keeps one job.
        assert!(
            store
                .migrate()
                .await
                .expect("migrate again")
                .applied
                .is_empty()
        );

        let scope = Scope::new("user-1").expect("scope");
        let response =
            StoredResponse::new(StatusCode::OK, HeaderMap::new(), Bytes::from_static(b"x"));
        for i in 0..30 {
            let token = LeaseToken::new();
            store
                .claim(&scope, &key(i), &fp(), token, HOUR)
                .await
                .expect("claim");
            // Even keys expire in a moment; odd keys live for an hour.
            let retention = if i % 2 == 0 {
                Duration::from_millis(10)
            } else {
                HOUR
            };
            assert_eq!(
                store
                    .complete(&scope, &key(i), token, &response, retention)
                    .await
                    .expect("complete"),
                FenceOutcome::Applied
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(
            count_rows(&store).await,
            30,
            "expired rows stay until purged"
        );

        let client = store.pool().get().await.expect("connection");
        let jobs: i64 = client
        .query_one(
            "SELECT count(*) FROM cron.job WHERE jobname = 'idempotency-purge:cron_test.idempotency_keys'",
            &[],
        )
        .await
        .expect("cron.job")
        .get(0);
        assert_eq!(jobs, 1);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(100);
        loop {
            let rows = count_rows(&store).await;
            if rows == 15 {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the pg_cron job did not purge within 100 s ({rows} rows left)\n{}",
                pg.log()
            );
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let succeeded: i64 = client
            .query_one(
                "SELECT count(*) FROM cron.job_run_details WHERE status = 'succeeded'",
                &[],
            )
            .await
            .expect("cron.job_run_details")
            .get(0);
        assert!(succeeded >= 1, "the purge must have been a pg_cron run");
        // `status()` (and `idempotency check`) shows the run, the rows it purged, and no
        // expired row left.
        let status = store.status().await.expect("status");
        let deleted_15 = status
            .purge_runs
            .iter()
            .any(|run| run.status == "succeeded" && run.message == "DELETE 15");
        assert!(deleted_15, "{:?}\n{status}", status.purge_runs);
        assert!(status.to_string().contains(": DELETE 15"), "{status}");
        let contents = status.contents.clone().expect("the table exists");
        assert_eq!((contents.records, contents.expired), (15, 0), "{status}");
        assert!(status.problems().is_empty(), "{:?}", status.problems());
        for i in 0..30 {
            let live = store.get(&scope, &key(i)).await.expect("get").is_some();
            assert_eq!(live, i % 2 == 1, "key {i}");
        }
    }

    /// Without pg_cron, migrate says so and schedules nothing; the library purge does the work.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn without_pg_cron_migrate_reports_it_and_purge_expired_works() {
        let schema = idempotency_testkit::TestSchema::new("idem_t");
        let url = schema.url().to_owned();
        let store = PostgresStore::builder(&url)
            .schema(schema.name())
            .build()
            .await
            .unwrap_or_else(|e| {
                idempotency_testkit::env::server_unreachable("PostgreSQL", &url, &e)
            });
        let report = store.migrate().await.expect("migrate");
        assert!(matches!(
            report.purge_job,
            PurgeJob::PgCronUnavailable { .. }
        ));
        assert!(report.to_string().contains("purge_periodically"));
        let scope = Scope::new("u").expect("scope");
        let response = StoredResponse::new(StatusCode::OK, HeaderMap::new(), Bytes::new());
        for i in 0..10 {
            let token = LeaseToken::new();
            store
                .claim(&scope, &key(i), &fp(), token, HOUR)
                .await
                .expect("claim");
            let _ = store
                .complete(&scope, &key(i), token, &response, Duration::from_millis(1))
                .await
                .expect("complete");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(
            store.purge_expired(4).await.expect("purge"),
            4,
            "purge is batched"
        );
        assert_eq!(store.purge_expired(100).await.expect("purge"), 6);
        assert_eq!(count_rows(&store).await, 0);
        schema.drop().await;
    }

    /// A store pointed at a streaming standby refuses to start, naming the writer endpoint.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn standby_is_refused_with_a_message_naming_the_writer() {
        let primary = cluster(&[]);
        let standby = primary
            .start_standby()
            .unwrap_or_else(|e| panic!("pg_basebackup standby: {e}\n{}", primary.log()));
        // The primary itself is fine.
        store(&primary.url("postgres"), "public", TableMode::Unlogged).await;
        match PostgresStore::builder(standby.url("postgres"))
            .build()
            .await
        {
            Err(e @ PostgresStoreError::ReadOnlyServer) => {
                let message = e.to_string();
                assert!(message.contains("writer"), "{message}");
                assert!(message.contains("unlogged"), "{message}");
            }
            other => panic!("a standby must be refused, got {other:?}"),
        }
        // What the check prevents: reading the unlogged table on the standby fails.
        let (client, connection) =
            tokio_postgres::connect(&standby.url("postgres"), tokio_postgres::NoTls)
                .await
                .expect("connect to the standby");
        tokio::spawn(connection);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        let error = loop {
            match client
                .query("SELECT * FROM public.idempotency_keys", &[])
                .await
            {
                Ok(_) => panic!("reading an unlogged table on a standby succeeded"),
                Err(e) => {
                    let message = e
                        .as_db_error()
                        .map(|d| d.message().to_owned())
                        .unwrap_or_else(|| e.to_string());
                    if !message.contains("does not exist") {
                        break message;
                    }
                    // The table's creation has not been replayed on the standby yet.
                    assert!(
                        tokio::time::Instant::now() < deadline,
                        "the standby never caught up"
                    );
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        };
        assert!(
            error.contains("cannot access temporary or unlogged relations during recovery"),
            "{error}"
        );
    }

    /// Two instances migrating at once both succeed (advisory lock), and a mode mismatch is refused.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_migrations_and_mode_mismatch() {
        let test_schema = idempotency_testkit::TestSchema::new("idem_t");
        let (url, schema) = (test_schema.url().to_owned(), test_schema.name().to_owned());
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let (url, schema) = (url.clone(), schema.clone());
            tasks.push(tokio::spawn(async move {
                let store = PostgresStore::builder(&url)
                    .schema(schema)
                    .pool_size(1)
                    .build()
                    .await
                    .unwrap_or_else(|e| {
                        idempotency_testkit::env::server_unreachable("PostgreSQL", &url, &e)
                    });
                store.migrate().await.map(|r| r.applied.len())
            }));
        }
        let mut applied = 0;
        for t in tasks {
            applied += t
                .await
                .expect("task")
                .expect("concurrent migrate must succeed");
        }
        assert_eq!(
            applied, 3,
            "each migration (0001, 0003, 0004; no pg_cron here) is applied by exactly one instance"
        );
        let unlogged = PostgresStore::builder(&url)
            .schema(&schema)
            .table_mode(TableMode::Unlogged)
            .build()
            .await
            .expect("build");
        match unlogged.migrate().await {
            Err(PostgresStoreError::TableModeMismatch {
                expected, found, ..
            }) => {
                assert_eq!((expected, found), ("UNLOGGED", "LOGGED"))
            }
            other => panic!("a mode mismatch must be refused, got {other:?}"),
        }
        test_schema.drop().await;
    }

    /// A failover: the primary dies, its streaming standby is promoted. The store on the old
    /// primary's URL fails with a retryable error, never an absent record; a store on the promoted
    /// server works at once. The UNLOGGED table comes up empty there (standbys never receive
    /// unlogged data), and the loss is counted; the LOGGED table has every record replicated
    /// before the failover, and retries replay them.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn failover_to_a_promoted_standby() {
        let primary = cluster(&[]);
        let url = primary.url("postgres");
        let unlogged = store(&url, "fo_unlogged", TableMode::Unlogged).await;
        let logged = store(&url, "fo_logged", TableMode::Logged).await;
        let scope = Scope::new("user-1").expect("scope");
        let standby = primary
            .start_standby()
            .unwrap_or_else(|e| panic!("pg_basebackup standby: {e}\n{}", primary.log()));
        complete_records(&unlogged, &scope, 20).await;
        complete_records(&logged, &scope, 20).await;

        // Replication is asynchronous: wait until the standby has replayed everything the
        // primary wrote, so the LOGGED figure is what the failover keeps, not a race.
        let primary_client = unlogged.pool().get().await.expect("connection");
        let lsn: String = primary_client
            .query_one("SELECT pg_current_wal_lsn()::text", &[])
            .await
            .expect("primary LSN")
            .get(0);
        drop(primary_client);
        let (standby_client, connection) =
            tokio_postgres::connect(&standby.url("postgres"), tokio_postgres::NoTls)
                .await
                .expect("connect to the standby");
        tokio::spawn(connection);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let caught_up: bool = standby_client
                .query_one(
                    "SELECT pg_last_wal_replay_lsn() >= $1::text::pg_lsn",
                    &[&lsn],
                )
                .await
                .expect("standby replay LSN")
                .get(0);
            if caught_up {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the standby never caught up:\n{}",
                standby.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        drop(standby_client);

        primary.crash().expect("kill the primary");
        standby.promote().expect("promote the standby");

        // The old primary's URL: every step is a retryable error, never "absent".
        for (name, old) in [("unlogged", &unlogged), ("logged", &logged)] {
            match old.get(&scope, &key(0)).await {
                Err(e) => assert!(e.is_retryable(), "{name}: {e}"),
                Ok(record) => panic!("{name}: the dead primary answered {record:?}"),
            }
            match old
                .claim(&scope, &key(99), &fp(), LeaseToken::new(), HOUR)
                .await
            {
                Err(e) => assert!(e.is_retryable(), "{name}: {e}"),
                Ok(outcome) => panic!("{name}: the dead primary answered {outcome:?}"),
            }
        }

        // The promoted standby: the store builds (it is a writer now) and works.
        let promoted = standby.url("postgres");
        let unlogged = PostgresStore::builder(&promoted)
            .schema("fo_unlogged")
            .table_mode(TableMode::Unlogged)
            .build()
            .await
            .expect("build on the promoted standby");
        assert_eq!(
            unlogged.get(&scope, &key(0)).await.expect("get"),
            None,
            "UNLOGGED records do not reach a standby"
        );
        assert_eq!(unlogged.state_losses(), 1, "the loss is counted");
        assert_eq!(count_rows(&unlogged).await, 0);
        assert_eq!(
            unlogged
                .claim(&scope, &key(0), &fp(), LeaseToken::new(), HOUR)
                .await
                .expect("claim"),
            ClaimOutcome::Claimed,
            "a key completed before the failover runs again (the ADR's accepted loss)"
        );
        let logged = PostgresStore::builder(&promoted)
            .schema("fo_logged")
            .table_mode(TableMode::Logged)
            .build()
            .await
            .expect("build on the promoted standby");
        assert_eq!(logged.state_losses(), 0);
        assert_eq!(count_rows(&logged).await, 20);
        for i in 0..20 {
            match logged.get(&scope, &key(i)).await.expect("get") {
                Some(record) => assert!(
                    matches!(record.state, RecordState::Completed { .. }),
                    "record {i}: {:?}",
                    record.state
                ),
                None => panic!("LOGGED lost record {i} in the failover"),
            }
        }
        assert!(matches!(
            logged
                .claim(&scope, &key(0), &fp(), LeaseToken::new(), HOUR)
                .await
                .expect("claim"),
            ClaimOutcome::Existing(_)
        ));
    }
}
