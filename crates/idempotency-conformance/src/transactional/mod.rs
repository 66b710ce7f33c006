//! The transactional cases: what every [`TransactionalStore`](idempotency_core::TransactionalStore)
//! must keep when the handler's writes and the stored response share one transaction, in each
//! [`ClaimMode`] the store supports.
//!
//! A store's test supplies a [`TransactionalHarness`]: the store, a write of one "side effect" row
//! in the request's transaction (its driver's statement), and a count of the committed rows. Each
//! case then counts how many times a side effect stands, which is the property the user buys:
//! never twice, and never a stored response without its writes.
//!
//! ```ignore
//! idempotency_conformance::transactional_suite!(make_harness(), ClaimMode::Lease, ClaimMode::OneTransaction);
//! ```

mod cases;
mod once;

pub use cases::*;
pub use once::*;

use crate::cases::{LONG, fingerprint, response};
use idempotency_core::{
    Begin, BoxError, ClaimMode, Completion, Engine, EngineConfig, Guard, IdempotencyStore,
    TransactionSlot,
};
use std::time::Duration;
use tokio::time::Instant;

/// What the transactional cases need of a store besides its trait: a side effect written in the
/// request's transaction, and a count of the side effects that committed.
#[async_trait::async_trait]
pub trait TransactionalHarness: Send + Sync + 'static {
    /// The store under test (cheap to clone; clones share the database).
    type Store: IdempotencyStore + Clone + 'static;

    /// The store.
    fn store(&self) -> Self::Store;

    /// In the request's transaction (opened through `slot` as the driver's type), writes one
    /// side-effect row tagged `tag`.
    async fn write(&self, slot: &TransactionSlot, tag: &str) -> Result<(), BoxError>;

    /// How many side-effect rows tagged `tag` are committed.
    async fn count(&self, tag: &str) -> u64;

    /// Called after each case, passed or failed (drop a test schema, say). Nothing by default.
    async fn teardown(&self) {}
}

/// Bound on each wait of a case for the store's background work (a rollback, a release).
pub(super) const SETTLE: Duration = Duration::from_secs(10);

pub(super) fn engine<H: TransactionalHarness>(harness: &H, mode: ClaimMode) -> Engine<H::Store> {
    let store = harness.store();
    assert!(
        store.transactional().is_some(),
        "the transactional cases need a store whose `transactional()` is Some"
    );
    Engine::new(
        store,
        EngineConfig::default()
            .with_lease(LONG)
            .with_claim_mode(mode),
    )
}

pub(super) fn proceed<S: IdempotencyStore + 'static>(begin: Begin<S>, what: &str) -> Guard<S> {
    match begin {
        Begin::Proceed(guard) => guard,
        other => panic!("{what}: expected to proceed, got {other:?}"),
    }
}

/// Begins `(scope, key)` with the fingerprint of `body`, which must proceed.
pub(super) async fn fresh<S: IdempotencyStore + 'static>(
    engine: &Engine<S>,
    scope: &idempotency_core::Scope,
    key: &idempotency_core::IdempotencyKey,
    body: &str,
    what: &str,
) -> Guard<S> {
    let begun = engine
        .begin(scope.clone(), key.clone(), fingerprint(body))
        .await
        .expect("begin");
    proceed(begun, what)
}

pub(super) async fn write<H: TransactionalHarness>(
    harness: &H,
    guard: &Guard<H::Store>,
    tag: &str,
) {
    let slot = guard
        .transaction()
        .expect("a transactional store offers the request a transaction");
    harness
        .write(slot, tag)
        .await
        .expect("write in the request's transaction");
}

/// Begins `key` again until it proceeds (the key was freed in the background), within
/// [`SETTLE`].
pub(super) async fn proceeds_again<S: IdempotencyStore + 'static>(
    engine: &Engine<S>,
    scope: &idempotency_core::Scope,
    key: &idempotency_core::IdempotencyKey,
    body: &str,
    what: &str,
) -> Guard<S> {
    let until = Instant::now() + SETTLE;
    loop {
        match engine
            .begin(scope.clone(), key.clone(), fingerprint(body))
            .await
            .expect("begin")
        {
            Begin::Proceed(guard) => return guard,
            Begin::InFlight { .. } if Instant::now() < until => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            other => panic!("{what}: the key should be free again, got {other:?}"),
        }
    }
}

/// The retry of a request that left nothing writes once and stores its response.
pub(super) async fn retry_runs_once<H: TransactionalHarness>(
    harness: &H,
    retry: Guard<H::Store>,
    tag: &str,
) {
    write(harness, &retry, tag).await;
    assert_eq!(
        retry.complete(response(201, b"ok")).await,
        Completion::Stored
    );
    assert_eq!(harness.count(tag).await, 1, "the retry ran once");
}

/// Expands the transactional cases into `#[tokio::test]`s for one store: `$make` is an
/// expression evaluated once per case that yields a future of a [`TransactionalHarness`], and
/// the modes the store supports follow it: `lease`, and `one_transaction` too for a store whose
/// `supports_one_transaction()` is true. [`TransactionalHarness::teardown`] runs after each case.
#[macro_export]
macro_rules! transactional_suite {
    ($make:expr, lease) => {
        $crate::transactional_suite!(@mode lease, ::idempotency_core::ClaimMode::Lease, $make);
        #[::tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn tx_lease_commit_after_takeover_is_fenced() {
            $crate::transactional_suite!(@run $make, |h| $crate::transactional::tx_lease_commit_after_takeover_is_fenced(h));
        }
    };
    ($make:expr, lease, one_transaction) => {
        $crate::transactional_suite!($make, lease);
        $crate::transactional_suite!(@mode one_transaction, ::idempotency_core::ClaimMode::OneTransaction, $make);
        #[::tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn tx_one_transaction_loser_rolls_back_and_replays() {
            $crate::transactional_suite!(@run $make, |h| $crate::transactional::tx_one_transaction_loser_rolls_back_and_replays(h));
        }
    };
    (@mode $name:ident, $mode:expr, $make:expr) => {
        mod $name {
            use super::*;
            $crate::transactional_suite!(@cases $mode, $make,
                tx_commit_keeps_the_write_and_the_response
                tx_handler_failure_rolls_back_and_frees_the_key
                tx_dropped_request_leaves_nothing
                tx_duplicate_while_open_is_in_flight_then_replays
                tx_concurrent_duplicates_write_once
                tx_expired_record_is_taken_over
                tx_once_commits_the_work_writes_with_its_value
                tx_once_failed_work_leaves_no_write
                tx_once_concurrent_duplicates_write_once
            );
        }
    };
    (@cases $mode:expr, $make:expr, $($case:ident)*) => {$(
        #[::tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn $case() {
            $crate::transactional_suite!(@run $make, |h| $crate::transactional::$case(h, $mode));
        }
    )*};
    (@run $make:expr, |$h:ident| $case:expr) => {{
        use $crate::__private::futures_util::FutureExt as _;
        let harness = ::std::sync::Arc::new($make.await);
        let $h = ::std::sync::Arc::clone(&harness);
        let outcome = ::std::panic::AssertUnwindSafe($case).catch_unwind().await;
        $crate::transactional::TransactionalHarness::teardown(&*harness).await;
        if let Err(panic) = outcome {
            ::std::panic::resume_unwind(panic);
        }
    }};
}
