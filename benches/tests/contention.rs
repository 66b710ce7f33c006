//! The contended workload of issue 45, in CI at a size that fits: two instances of an orders
//! service on five hot stock rows (locked in the order each client gives, so in opposite orders
//! too), refusals stored with `discard_writes`, SDK-like clients cutting a quarter of their
//! first attempts off after 5-50 ms and retrying with the same key, and one instance SIGKILLed
//! mid-load and started again, in every claim mode and at SERIALIZABLE. Per key, against the
//! database: one order per `201` and none otherwise, stock conserved, every later answer
//! byte-identical to the first, and a final answer within the lease plus a few seconds of the
//! load's end (none stuck behind the killed instance's claims).

use idempotency::{ClaimMode, TransactionAdmission};
use idempotency_bench::contention::{self, Kill, Settings, client::ClientBehaviour, shop};
use std::time::Duration;

/// The lease: the killed instance's lease-mode claims lapse after it.
const LEASE: Duration = Duration::from_secs(3);

/// `options` that make PostgreSQL break deadlocks within 100 ms (the default waits 1 s), and
/// set the isolation level (`serializable`; `read committed` is the server's default).
fn url(isolation: &str) -> String {
    let base = idempotency_testkit::env::postgres_url();
    let separator = if base.contains('?') { '&' } else { '?' };
    let mut options = "-c%20deadlock_timeout%3D100ms".to_owned();
    if isolation != "read committed" {
        options.push_str(&format!(
            "%20-c%20default_transaction_isolation%3D{isolation}"
        ));
    }
    format!("{base}{separator}options={options}")
}

/// Runs the workload; its outcome, with the database's state checked.
async fn run(mode: ClaimMode, isolation: &str, keep_refused_writes: bool) -> contention::Outcome {
    let schema = format!(
        "idem_contention_{}_{}",
        contention::mode_name(mode).replace('-', "_"),
        isolation.replace(' ', "_")
    ) + if keep_refused_writes { "_flawed" } else { "" };
    let settings = Settings {
        binary: env!("CARGO_BIN_EXE_idempotency-bench").into(),
        shop: shop::ShopSettings {
            url: url(isolation),
            schema: schema.clone(),
            mode,
            pool: 0,
            lease: Some(LEASE),
            store_timeout: None,
            admission: TransactionAdmission::Adaptive,
            keep_refused_writes,
        },
        instances: 2,
        clients: 16,
        duration: Duration::from_secs(6),
        items: 5,
        behaviour: ClientBehaviour::default(),
        resend_share: 0.25,
        kill: Some(Kill {
            after: Duration::from_secs(2),
            down_for: Duration::from_secs(1),
        }),
        settle: LEASE + Duration::from_secs(5),
    };
    let outcome = match contention::run(&settings).await {
        Ok(outcome) => outcome,
        Err(e) => panic!(
            "the contention workload could not run on {} ({e}); scripts/services.sh starts PostgreSQL",
            idempotency::redact_credentials(&settings.shop.url)
        ),
    };
    eprintln!(
        "{}",
        contention::markdown_table(std::slice::from_ref(&outcome))
    );
    let _ = contention::cleanup(&settings.shop.url, &schema).await;
    outcome
}

async fn contended(mode: ClaimMode, isolation: &str) {
    let outcome = run(mode, isolation, false).await;
    assert!(
        outcome.violations.is_empty(),
        "{mode:?} at {isolation}: {} violations, first ones:\n{}",
        outcome.violations.len(),
        outcome.violations[..outcome.violations.len().min(10)].join("\n")
    );
    // The workload must have been what it says: orders created and refused, and replays.
    assert!(
        outcome.created > 0 && outcome.refused > 0 && outcome.replays > 0,
        "{mode:?} at {isolation}: {} created, {} refused, {} replays",
        outcome.created,
        outcome.refused,
        outcome.replays
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_contention_and_a_sigkill_the_lease_mode_answers_once_per_key() {
    contended(ClaimMode::Lease, "read committed").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_contention_and_a_sigkill_the_one_transaction_mode_answers_once_per_key() {
    contended(ClaimMode::OneTransaction, "read committed").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_contention_and_a_sigkill_the_speculative_mode_answers_once_per_key() {
    contended(ClaimMode::OneTransactionSpeculative, "read committed").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_contention_at_serializable_every_mode_answers_once_per_key() {
    for mode in [
        ClaimMode::Lease,
        ClaimMode::OneTransaction,
        ClaimMode::OneTransactionSpeculative,
    ] {
        contended(mode, "serializable").await;
    }
}

/// The checks can fail: a handler that stores its refusal without `discard_writes` commits the
/// stock lines it took before the missing one, and the stock no longer adds up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_checks_catch_a_refusal_stored_with_its_writes() {
    let outcome = run(ClaimMode::Lease, "read committed", true).await;
    assert!(
        outcome.violations.iter().any(|v| v.contains("in stock")),
        "a refusal committed with its writes went unseen: {:?}",
        outcome.violations
    );
}
