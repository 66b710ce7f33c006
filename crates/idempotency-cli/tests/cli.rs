//! The `idempotency` command against the real servers: what it prints and its exit codes.

use idempotency::{
    BodyCanonicalization, Fingerprint, IdempotencyKey, IdempotencyStore, KeyFormat, LeaseToken,
    PostgresStore, Scope, StoredResponse,
};
use idempotency_testkit::TestSchema;
use idempotency_testkit::env::redis_url;
use std::process::Command;
use std::time::Duration;

/// Runs `idempotency args...`; returns the exit code and what it printed (stdout then stderr).
fn idempotency(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_idempotency"))
        .args(args)
        .env_remove("IDEMPOTENCY_STORE")
        .output()
        .expect("run idempotency");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

mod postgres {
    use super::*;

    /// A table made UNLOGGED (the default of earlier versions) is kept by a store left at the
    /// default, and `check` names it with the statement that makes it durable.
    #[test]
    fn an_unlogged_table_of_an_earlier_version_is_kept_and_named() {
        let schema = TestSchema::new("idem_cli_u");
        let url = schema.url().to_owned();
        let run = |args: &[&str]| {
            let mut all = args.to_vec();
            all.extend(["--url", &url, "--schema", schema.name()]);
            idempotency(&all)
        };
        let (code, text) = run(&["migrate", "--mode", "unlogged"]);
        assert_eq!(code, 0, "{text}");
        let (code, text) = run(&["migrate"]);
        assert_eq!(code, 0, "the default keeps the UNLOGGED table: {text}");
        let (code, text) = run(&["check"]);
        assert_eq!(code, 1, "{text}");
        assert!(
            text.contains("is UNLOGGED (the default of earlier versions)")
                && text.contains("SET LOGGED"),
            "{text}"
        );
        let (code, text) = run(&["check", "--mode", "unlogged"]);
        assert_eq!(
            code, 0,
            "chosen explicitly, the UNLOGGED table is fine: {text}"
        );
        let (code, text) = run(&["migrate", "--mode", "logged"]);
        assert_eq!(code, 3, "chosen explicitly, LOGGED refuses it: {text}");
        assert!(
            text.contains("is UNLOGGED but the store is configured for LOGGED"),
            "{text}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn migrate_check_inspect_and_purge_a_deployment() {
        let schema = TestSchema::new("idem_cli");
        let url = schema.url().to_owned();
        let at = ["--url", &url, "--schema", schema.name()];
        let with = |args: &[&str]| -> Vec<String> {
            args.iter()
                .chain(at.iter())
                .map(|s| s.to_string())
                .collect()
        };
        let run = |args: &[&str]| {
            let args = with(args);
            idempotency(&args.iter().map(String::as_str).collect::<Vec<_>>())
        };

        let (code, text) = run(&["check"]);
        assert_eq!(code, 1, "{text}");
        assert!(
            text.contains("does not exist") && text.contains("idempotency migrate"),
            "{text}"
        );

        let (code, text) = run(&["migrate"]);
        assert_eq!(code, 0, "{text}");
        assert!(text.contains("0001_create_idempotency_keys"), "{text}");
        let (code, text) = run(&["check"]);
        assert_eq!((code, text.trim_end().ends_with("ok")), (0, true), "{text}");
        assert!(text.contains("(LOGGED)"), "a new table is LOGGED: {text}");
        assert!(
            text.contains("records: 0 (0 expired, waiting for the purge; 0 in flight), "),
            "the contents of an empty table: {text}"
        );
        let (code, text) = run(&["check", "--mode", "unlogged"]);
        assert_eq!(code, 1, "{text}");
        assert!(
            text.contains("is LOGGED, but the store is configured for UNLOGGED"),
            "{text}"
        );

        // A completed record, and one that expired a moment ago.
        let store = PostgresStore::builder(&url)
            .schema(schema.name())
            .build()
            .await
            .expect("build");
        let scope = Scope::new("user-7").expect("scope");
        let fp = Fingerprint::of_request("POST", "/tasks", b"{}", BodyCanonicalization::Raw);
        for (key, retention) in [
            ("done", Duration::from_secs(3600)),
            ("gone", Duration::from_millis(1)),
        ] {
            let key = IdempotencyKey::parse(key.as_bytes(), KeyFormat::opaque()).expect("key");
            let token = LeaseToken::new();
            store
                .claim(&scope, &key, &fp, token, Duration::from_secs(60))
                .await
                .expect("claim");
            let mut headers = idempotency::http::HeaderMap::new();
            headers.insert("content-type", "application/json".parse().expect("header"));
            let response = StoredResponse::new(
                idempotency::http::StatusCode::CREATED,
                headers,
                bytes_of("{\"id\":7}"),
            );
            let _ = store
                .complete(&scope, &key, token, &response, retention)
                .await
                .expect("complete");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;

        let (code, text) = run(&["inspect", "done", "--scope", "user-7"]);
        assert_eq!(code, 0, "{text}");
        for expected in [
            "state: completed",
            "status: 201 Created",
            "header: content-type: application/json",
            "body: 8 bytes",
            "expires in",
            "fingerprint: Sha256Raw sha256:",
        ] {
            assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
        }
        assert!(
            !text.contains("{\"id\":7}"),
            "the body only with --body:\n{text}"
        );
        let (code, text) = run(&["inspect", "done", "--scope", "user-7", "--body"]);
        assert_eq!(code, 0);
        assert!(text.contains("{\"id\":7}"), "{text}");
        let (code, text) = run(&["inspect", "done", "--scope", "someone-else"]);
        assert_eq!(code, 1, "another scope sees nothing: {text}");
        let (code, text) = run(&["inspect", "gone", "--scope", "user-7"]);
        assert_eq!(code, 1, "an expired record is absent: {text}");

        let (code, text) = run(&["purge", "--batch", "1"]);
        assert_eq!(code, 0, "{text}");
        assert!(text.contains("purged 1 expired records"), "{text}");
        schema.drop().await;
    }

    fn bytes_of(text: &str) -> idempotency::bytes::Bytes {
        idempotency::bytes::Bytes::from(text.to_owned())
    }

    #[test]
    fn print_sql_needs_no_server_and_usage_errors_exit_2() {
        let (code, text) = idempotency(&["print-sql", "--schema", "app", "--mode", "logged"]);
        assert_eq!(code, 0, "{text}");
        assert!(
            text.contains("CREATE SCHEMA IF NOT EXISTS \"app\";"),
            "{text}"
        );
        assert!(
            text.contains("CREATE TABLE IF NOT EXISTS \"app\".\"idempotency_keys\""),
            "{text}"
        );
        let (code, text) = idempotency(&["check"]);
        assert_eq!(code, 2, "{text}");
        assert!(text.contains("--url"), "{text}");
        let (code, text) = idempotency(&["check", "--url", "mysql://db/app"]);
        assert_eq!(code, 2, "{text}");
        let (code, text) = idempotency(&["print-sql", "--schema", "bad-name"]);
        assert_eq!(code, 2, "{text}");
    }

    #[test]
    fn an_unreachable_server_exits_3_with_the_cause() {
        let (code, text) =
            idempotency(&["check", "--url", "postgres://postgres@127.0.0.1:1/postgres"]);
        assert_eq!(code, 3, "{text}");
        assert!(
            text.to_lowercase().contains("connection refused"),
            "the cause must show: {text}"
        );
    }
}

mod redis {
    use super::*;

    /// The shared test Redis keeps nothing on disk: check says so, and exits 1.
    #[test]
    fn check_reports_persistence_and_eviction() {
        let url = redis_url();
        let (code, text) = idempotency(&["check", "--url", &url]);
        assert!(text.contains("maxmemory-policy"), "{text}");
        assert_eq!(code, 1, "{text}");
        assert!(text.contains("persistence is off"), "{text}");
    }
}
