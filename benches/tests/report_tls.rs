//! The re-evaluation report against TLS-only servers started by the testkit: PostgreSQL with
//! `sslmode=verify-full` (pg_hba `hostssl` lines only) and Redis over `rediss://`. A tiny run
//! must measure both, not skip them.

use idempotency_testkit::{TempPostgres, TempRedis, TestCa};

#[test]
fn the_report_runs_against_tls_only_postgres_and_redis() {
    let ca = TestCa::new("idempotency test CA").expect("CA");
    let cert = ca.issue(&["localhost", "127.0.0.1"]).expect("certificate");
    let pg = TempPostgres::start_tls_only(&cert, &[]).expect("a TLS-only PostgreSQL");
    let redis = TempRedis::start_tls_only(&cert, &ca.root_path()).expect("a TLS-only Redis");
    let root = ca.root_path();
    let postgres = format!(
        "postgres://postgres@localhost:{}/postgres?sslmode=verify-full&sslrootcert={}",
        pg.port(),
        root.to_string_lossy().replace('/', "%2F")
    );
    let out = tempfile::tempdir().expect("a folder for the report");
    let report = out.path().join("report.md");
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_idempotency-bench"))
        .args(["report", "--postgres", &postgres, "--redis", &redis.url()])
        .args([
            "--requests",
            "40",
            "--concurrency",
            "1,2",
            "--floor-rounds",
            "2",
        ])
        .args(["--floor-ops", "5", "--wal-ops", "20"])
        .args(["--floor-clients", "4", "--sweep-pools", "2,4"])
        .args([
            "--concurrent-floor-rounds",
            "1",
            "--concurrent-floor-ops",
            "5",
        ])
        .args(["--http-rounds", "1", "--http-seconds", "0.5"])
        .args([
            "--http-pg-rounds",
            "1",
            "--http-pg-seconds",
            "0.3",
            "--http-pg-clients",
            "2",
        ])
        // Purge at scale, tiny: 2400 rows, one compressed day of 50 ms hours.
        .args([
            "--purge-live-rows",
            "2400",
            "--purge-days",
            "1",
            "--purge-hour-ms",
            "50",
        ])
        .arg("--out")
        .arg(&report)
        // rediss:// trusts the system's roots; SSL_CERT_FILE points them at the test CA.
        .env("SSL_CERT_FILE", &root)
        .status()
        .expect("run the report");
    assert!(status.success(), "the report failed: {status}");
    let text = std::fs::read_to_string(&report).expect("the report");
    assert!(
        !text.contains("Skipped"),
        "no store may be skipped:\n{text}"
    );
    for row in [
        "| postgres_unlogged | 1 |",
        "| redis | 1 |",
        "| memory | 1 |",
    ] {
        assert!(text.contains(row), "missing {row:?} in:\n{text}");
    }
    assert!(text.contains("| postgres_unlogged |") && text.contains("library / raw"));
    assert!(
        text.contains("## Through HTTP on PostgreSQL")
            && text.contains("| 2 | one-transaction-logged |"),
        "the PostgreSQL HTTP section is missing:\n{text}"
    );
    assert!(
        text.contains("## PostgreSQL: purge at scale") && text.contains("| unlogged | defaults |"),
        "missing the purge figures in:\n{text}"
    );
    assert!(
        text.contains("| postgres_unlogged | ") && text.contains("replay from the tier"),
        "missing the replay tier figures in:\n{text}"
    );
    assert!(
        text.contains("## PostgreSQL on tokio-postgres and on sqlx")
            && text.contains("| `SqlxPostgresStore`, default `PgPool` | "),
        "missing the two drivers in:\n{text}"
    );
    assert!(
        text.contains("## Redis: waiting for replicas")
            && text.contains("| `wait_for_replicas(1, 1s)` |"),
        "missing the replica wait in:\n{text}"
    );
}
