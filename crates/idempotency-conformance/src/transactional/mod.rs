//! The transactional cases: what every [`TransactionalStore`](idempotency_core::store::TransactionalStore)
//! must keep when the handler's writes and the stored response share one transaction, in each
//! [`ClaimMode`] the store supports.
//!
//! A store's test supplies a [`TransactionalHarness`]: the store, a write of one "side effect" row
//! in the request's transaction (its driver's statement), and a count of the committed rows. Each
//! case then counts how many times a side effect stands, which is the property the user buys:
//! never twice, and never a stored response without its writes.
//!
//! ```ignore
//! idempotency_conformance::transactional_suite!(make_harness(), lease, one_transaction, speculative);
//! ```

mod cases;
mod once;

pub use cases::*;
pub use once::*;

use crate::cases::{LONG, fingerprint, response};
use idempotency_core::{
    Begin, BoxError, ClaimMode, Completion, Engine, EngineConfig, Guard, IdempotencyStore,
    StoredResponse, Superseded, TransactionSlot,
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
    Engine::new(store, EngineConfig::default().lease(LONG).claim_mode(mode))
        .expect("the suite's engine settings are valid")
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

/// How a request for a key it cannot run is answered.
#[derive(Debug)]
pub(super) enum Answer {
    Replay(StoredResponse),
    InFlight(Duration),
    Mismatch,
}

/// What a request for `(scope, key)` with the fingerprint of `body` is answered when it must
/// not run: by `begin` itself, or, in the speculative mode (which proceeds before the key's
/// lookup has answered), when its guard ends. Then its write is refused (the lookup aborted the
/// transaction before it) and nothing of it stands.
pub(super) async fn answer<H: TransactionalHarness>(
    harness: &H,
    engine: &Engine<H::Store>,
    scope: &idempotency_core::Scope,
    key: &idempotency_core::IdempotencyKey,
    body: &str,
) -> Answer {
    let begun = engine
        .begin(scope.clone(), key.clone(), fingerprint(body))
        .await
        .expect("begin");
    let completion = match begun {
        Begin::Replay(stored) => return Answer::Replay(stored.into_response()),
        Begin::InFlight { retry_after } => return Answer::InFlight(retry_after),
        Begin::Mismatch => return Answer::Mismatch,
        Begin::Proceed(guard) => {
            let tag = uuid::Uuid::new_v4().to_string();
            let slot = guard
                .transaction()
                .expect("a transactional store offers the request a transaction");
            let written = harness.write(slot, &tag).await;
            let completion = guard.complete(response(201, b"speculative")).await;
            assert!(
                written.is_err(),
                "a request for a taken key proceeded, and its write was not refused"
            );
            assert_eq!(harness.count(&tag).await, 0, "a refused write stands");
            completion
        }
    };
    match completion {
        Completion::Superseded(Superseded::Replay(stored)) => {
            Answer::Replay(stored.into_response())
        }
        Completion::Superseded(Superseded::InFlight { retry_after }) => {
            Answer::InFlight(retry_after)
        }
        Completion::Superseded(Superseded::Mismatch) => Answer::Mismatch,
        other => panic!("a request for a taken key completed as its own: {other:?}"),
    }
}

/// Runs `(scope, key)` again until it proceeds (its key freed, in the background for some
/// stores and modes) within [`SETTLE`]; its write and response then stand once. In the
/// speculative mode a request still refused by the key's lock is told so only after its
/// (refused) write, and tries again.
pub(super) async fn runs_again_once<H: TransactionalHarness>(
    harness: &H,
    engine: &Engine<H::Store>,
    scope: &idempotency_core::Scope,
    key: &idempotency_core::IdempotencyKey,
    tag: &str,
) {
    let until = Instant::now() + SETTLE;
    loop {
        match engine
            .begin(scope.clone(), key.clone(), fingerprint("a"))
            .await
            .expect("begin")
        {
            Begin::Proceed(guard) => {
                let slot = guard
                    .transaction()
                    .expect("a transactional store offers the request a transaction");
                let written = harness.write(slot, tag).await;
                match guard.complete(response(201, b"ok")).await {
                    Completion::Stored => {
                        written.expect("the request that stored its response wrote");
                        break;
                    }
                    Completion::Superseded(Superseded::InFlight { .. })
                        if Instant::now() < until =>
                    {
                        assert!(written.is_err(), "a refused request's write went through");
                    }
                    other => panic!("the retry must run, got {other:?}"),
                }
            }
            Begin::InFlight { .. } if Instant::now() < until => {}
            other => panic!("the retry must run, got {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(harness.count(tag).await, 1, "the retry ran once");
}

/// Expands the transactional cases into `#[tokio::test]`s for one store: `$make` is an
/// expression evaluated once per case that yields a future of a [`TransactionalHarness`], and
/// the modes the store supports follow it: `lease`; `one_transaction` too for a store whose
/// `supports_one_transaction()` is true; and `speculative` after them for one whose
/// `supports_speculative()` is true. [`TransactionalHarness::teardown`] runs after each case.
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
        mod one_transaction_modes {
            use super::*;
            $crate::transactional_suite!(@cases ::idempotency_core::ClaimMode::OneTransaction, $make,
                tx_one_transaction_loser_rolls_back_and_replays
            );
        }
    };
    ($make:expr, lease, one_transaction, speculative) => {
        $crate::transactional_suite!($make, lease, one_transaction);
        $crate::transactional_suite!(@mode speculative, ::idempotency_core::ClaimMode::OneTransactionSpeculative, $make);
        mod speculative_only {
            use super::*;
            $crate::transactional_suite!(@cases ::idempotency_core::ClaimMode::OneTransactionSpeculative, $make,
                tx_one_transaction_loser_rolls_back_and_replays
                tx_speculative_handler_of_a_taken_key_writes_nothing
            );
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
                tx_idle_past_the_lease_commits_nothing
                tx_once_commits_the_work_writes_with_its_value
                tx_once_failed_work_leaves_no_write
                tx_once_concurrent_duplicates_write_once
                tx_once_panicking_redelivery_replays
                tx_once_discarded_writes_store_the_refusal_alone
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
