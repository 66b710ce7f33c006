//! The demo on PostgreSQL through a real PgBouncer in transaction pooling mode (started by the
//! testkit in front of the shared server), with `prepared_statements=false`: the same HTTP
//! checks as directly, and a burst of duplicates that creates one task.
#![allow(clippy::unwrap_used)]

use idempotency_e2e::{DemoProcess, create_replay_list};
use idempotency_testkit::env::postgres_url;
use idempotency_testkit::{PoolMode, TempPgBouncer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_works_through_pgbouncer_in_transaction_mode() {
    let upstream: idempotency::postgres::tokio_postgres::Config = postgres_url().parse().unwrap();
    let port = upstream.get_ports().first().copied().unwrap_or(5432);
    let bouncer = TempPgBouncer::start(port, PoolMode::Transaction).unwrap();
    let url = format!("{}?prepared_statements=false", bouncer.url("postgres"));
    let demo = DemoProcess::start(env!("CARGO_BIN_EXE_demo-server"), &["--store", &url], &[]).await;
    for _ in 0..20 {
        create_replay_list(demo.addr()).await;
    }
    demo.kill().await;
}
