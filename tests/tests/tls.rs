//! The demo service against TLS-only servers started by the testkit: PostgreSQL with
//! `sslmode=verify-full` (pg_hba `hostssl` lines only) and Redis over `rediss://`, both with a CA
//! made for the test. A task is created once and its retry replayed, over real HTTP.
#![allow(clippy::unwrap_used)]

use idempotency_e2e::{DemoProcess, create_replay_list};
use idempotency_testkit::{TempPostgres, TempRedis, TestCa};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_runs_on_tls_only_postgres_with_verify_full() {
    let ca = TestCa::new("idempotency test CA").unwrap();
    let pg = TempPostgres::start_tls_only(&ca.issue(&["localhost"]).unwrap(), &[]).unwrap();
    let root = ca.root_path().to_string_lossy().replace('/', "%2F");
    let url = format!(
        "postgres://postgres@localhost:{}/postgres?sslmode=verify-full&sslrootcert={root}",
        pg.port()
    );
    let demo = DemoProcess::start(env!("CARGO_BIN_EXE_demo-server"), &["--store", &url], &[]).await;
    create_replay_list(demo.addr()).await;
    demo.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_runs_on_tls_only_redis() {
    let ca = TestCa::new("idempotency test CA").unwrap();
    let cert = ca.issue(&["localhost", "127.0.0.1"]).unwrap();
    let redis = TempRedis::start_tls_only(&cert, &ca.root_path()).unwrap();
    let root = ca.root_path();
    // rediss:// trusts the system's roots; SSL_CERT_FILE points them at the test CA.
    let demo = DemoProcess::start(
        env!("CARGO_BIN_EXE_demo-server"),
        &["--store", &redis.url()],
        &[("SSL_CERT_FILE", &root.to_string_lossy())],
    )
    .await;
    create_replay_list(demo.addr()).await;
    demo.kill().await;
}
