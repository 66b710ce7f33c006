//! The two-service proof at a size that fits CI, in both claim modes an outside call suits:
//! callers through a lossy proxy to orders (a child process, SIGKILLed between a charge and
//! its commit and after a commit, then restarted), orders through another lossy proxy to
//! payments. Each order must be created once and charged once (payments' own count), every
//! caller must end with that order's `201`, replayed as it was, and no key may stay held.

use idempotency::ClaimMode;
use idempotency_orders_demo::DemoError;
use idempotency_orders_demo::proof::{self, ProofConfig, ProofReport};
use idempotency_testkit::env::{postgres_url, server_unreachable};
use std::time::Duration;

/// Runs the proof; a database that cannot be reached fails with how to start it, any other
/// error of the proof's own (the orders process not starting) as it is.
async fn run(config: &ProofConfig) -> ProofReport {
    match proof::run(config).await {
        Ok(report) => report,
        Err(DemoError::Database(e)) => server_unreachable("PostgreSQL", &config.database_url, &e),
        Err(e) => panic!("the proof could not run: {e}"),
    }
}

async fn prove(mode: ClaimMode) {
    let url = postgres_url();
    let mut config = ProofConfig::new(&url, env!("CARGO_BIN_EXE_idempotency-orders-demo"));
    config.claim_mode = mode;
    config.orders = 60;
    config.callers = 8;
    config.kills = 2;
    config.lease = Duration::from_secs(3);
    let report = run(&config).await;
    println!("{report}");
    assert!(report.failures().is_empty(), "{report}");
    assert_eq!(report.created(), 60, "{report}");
    assert_eq!(report.rows(), (60, 60), "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_mode_orders_and_charges_once_through_losses_and_kills() {
    prove(ClaimMode::Lease).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_transaction_mode_orders_and_charges_once_through_losses_and_kills() {
    prove(ClaimMode::OneTransaction).await;
}

/// The proof can fail: orders charging with a fresh key on every run of an order (no
/// `derive_key`) charges again when a run after the kill between charge and commit charges,
/// and the checks say so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_charge_key_that_changes_between_runs_is_caught() {
    use idempotency_orders_demo::orders::ChargeKey;
    for mode in [ClaimMode::Lease, ClaimMode::OneTransaction] {
        let url = postgres_url();
        let mut config = ProofConfig::new(&url, env!("CARGO_BIN_EXE_idempotency-orders-demo"));
        config.claim_mode = mode;
        config.orders = 20;
        config.callers = 4;
        config.kills = 1;
        config.charge_key = ChargeKey::FreshEachRun;
        let report = run(&config).await;
        println!("{report}");
        let (orders, charges) = report.rows();
        assert_eq!(orders, 20, "{report}");
        assert!(
            charges > orders,
            "{mode:?}: the kill's run charged again: {report}"
        );
        assert!(
            report.failures().iter().any(|f| f.contains("charges")),
            "{mode:?}: the checks name the double charge: {report}"
        );
    }
}
