//! The plain SQL files of `migrations/`, applied with `psql -f` in order on an empty database,
//! give exactly what `migrate()` gives: the same schema (compared with `pg_dump`), a history the
//! library reads as up to date, and a sentinel, so no loss is reported.

mod postgres {
    use idempotency_postgres::PostgresStore;
    use idempotency_testkit::env::{postgres_url, server_unreachable};
    use std::path::Path;
    use std::process::Command;

    /// Creates a fresh database and returns its name and URL.
    async fn database(
        admin: &idempotency_postgres::tokio_postgres::Client,
        url: &str,
    ) -> (String, String) {
        let name = format!("idem_mig_{}", uuid::Uuid::new_v4().simple());
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .expect("create a database");
        let url = match url.rsplit_once('/') {
            Some((server, _)) => format!("{server}/{name}"),
            None => panic!("IDEMPOTENCY_TEST_POSTGRES_URL must name a database: {url}"),
        };
        (name, url)
    }

    fn run(program: &str, args: &[&str]) -> String {
        let out = Command::new(program)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("could not run {program} (install postgresql-client): {e}"));
        assert!(
            out.status.success(),
            "{program} {args:?} failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The schema of the store's tables, as pg_dump writes it.
    fn dump(url: &str) -> String {
        run(
            "pg_dump",
            &[
                "--schema-only",
                "--no-owner",
                "-t",
                "public.idempotency_keys*",
                url,
            ],
        )
        .lines()
        .filter(|l| {
            !l.starts_with("--") && !l.starts_with("\\restrict") && !l.starts_with("\\unrestrict")
        })
        .collect::<Vec<_>>()
        .join("\n")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn psql_on_the_plain_files_gives_what_migrate_gives() {
        let admin_url = postgres_url();
        let (admin, connection) = idempotency_postgres::tokio_postgres::connect(
            &admin_url,
            idempotency_postgres::tokio_postgres::NoTls,
        )
        .await
        .unwrap_or_else(|e| server_unreachable("PostgreSQL", &admin_url, &e));
        tokio::spawn(connection);
        let (by_psql, psql_url) = database(&admin, &admin_url).await;
        let (by_library, library_url) = database(&admin, &admin_url).await;

        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .expect("migrations/")
            .map(|e| e.expect("entry").path())
            .collect();
        files.sort();
        assert_eq!(files.len(), 4);
        for file in &files {
            let file = file.to_string_lossy();
            run(
                "psql",
                &["-v", "ON_ERROR_STOP=1", "-1", "-q", "-f", &file, &psql_url],
            );
        }
        // Twice is harmless: every statement is idempotent.
        for file in &files {
            let file = file.to_string_lossy();
            run(
                "psql",
                &["-v", "ON_ERROR_STOP=1", "-1", "-q", "-f", &file, &psql_url],
            );
        }

        let library = PostgresStore::connect(&library_url).await.expect("connect");
        let report = library.migrate().await.expect("migrate");
        // No pg_cron here: 0002 does nothing and is not recorded.
        assert_eq!(
            report.applied,
            [
                "0001_create_idempotency_keys",
                "0003_tune_autovacuum",
                "0004_wake_waiting_duplicates"
            ]
        );

        let psql_dump = dump(&psql_url);
        assert!(
            psql_dump.contains("CREATE TABLE public.idempotency_keys (")
                && psql_dump.contains("idempotency_keys_expires_at_idx")
                && psql_dump.contains("CREATE TABLE public.idempotency_keys_migrations (")
                && psql_dump.contains("autovacuum_vacuum_scale_factor='0.01'")
                && psql_dump.contains("waited boolean DEFAULT false NOT NULL"),
            "pg_dump must show the tables:\n{psql_dump}"
        );
        assert_eq!(
            psql_dump,
            dump(&library_url),
            "the files and migrate() differ"
        );

        // On the psql-made database the library finds nothing to do and nothing lost.
        let store = PostgresStore::connect(&psql_url).await.expect("connect");
        assert!(store.migrate().await.expect("migrate").applied.is_empty());
        assert!(
            !store.check_state().await.expect("check"),
            "the sentinel must be there"
        );
        assert_eq!(store.state_losses(), 0);
        drop((store, library));

        for name in [by_psql, by_library] {
            admin
                .batch_execute(&format!("DROP DATABASE {name} WITH (FORCE)"))
                .await
                .expect("drop the database");
        }
    }
}
