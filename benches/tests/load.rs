//! The load generator in its short mode, on every store: a duplicate-heavy mix over real HTTP
//! must create exactly one task per logical request and get only allowed answers.

use idempotency_bench::load::{LoadConfig, run};
use idempotency_testkit::env::{postgres_url, redis_url};

async fn short_load(store: String) {
    let config = LoadConfig {
        store,
        table_mode: idempotency::TableMode::Unlogged,
        logical: 400,
        concurrency: 16,
        users: 8,
        burst: 8,
    };
    let report = run(&config)
        .await
        .unwrap_or_else(|e| panic!("load run failed: {e}"));
    eprintln!("{report:?}");
    assert!(
        report.duplicates > 400,
        "the mix must be duplicate-heavy: {}",
        report.duplicates
    );
    assert_eq!(report.double_executions, 0, "{report:?}");
    assert_eq!(report.never_created, 0, "{report:?}");
    assert!(report.unexpected.is_empty(), "{:?}", report.unexpected);
}

mod memory {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn short_load_creates_each_task_once() {
        short_load("memory".into()).await;
    }
}

mod postgres {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn short_load_creates_each_task_once() {
        short_load(postgres_url()).await;
    }
}

mod redis {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn short_load_creates_each_task_once() {
        short_load(redis_url()).await;
    }
}
