#![doc = include_str!("../README.md")]
//!
//! The suite is part of the test tooling, not of the stable API: cases may be added in any
//! release.

pub mod cases;
pub mod faults;
pub mod transactional;

/// The name of every case, in the order the macros run them.
pub const CASES: &[&str] = __with_cases!(__case_names @list);

/// Turns the list of cases into their names (for [`CASES`]).
#[doc(hidden)]
#[macro_export]
macro_rules! __case_names {
    (@list $($case:ident)*) => {
        &[$(stringify!($case)),*]
    };
}

#[doc(hidden)]
pub mod __private {
    pub use futures_util;
}

/// Expands every case of the suite into a named `#[tokio::test]` for one store.
///
/// `$make` is an expression evaluated once per case that yields a future of the store;
/// the optional `$teardown` is called with an `Arc` of the store after the case.
#[macro_export]
macro_rules! conformance_suite {
    ($make:expr) => {
        $crate::conformance_suite!($make, |_store| async {});
    };
    ($make:expr, $teardown:expr) => {
        $crate::__with_cases!(conformance_suite @tests ($make) ($teardown));
    };
    (@tests ($make:expr) ($teardown:expr) $($case:ident)*) => {$(
        #[::tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn $case() {
            use $crate::__private::futures_util::FutureExt as _;
            let store = ::std::sync::Arc::new($make.await);
            let outcome = ::std::panic::AssertUnwindSafe($crate::cases::$case(::std::sync::Arc::clone(&store)))
                .catch_unwind()
                .await;
            ($teardown)(store).await;
            if let Err(panic) = outcome {
                ::std::panic::resume_unwind(panic);
            }
        }
    )*};
}

/// Runs every case of the suite, one after another, inside the current async test, and panics
/// at the end naming the cases that failed. For stores whose server is expensive to set up
/// (a throwaway cluster): set it up once in the test, and let `$make` build a store on it.
///
/// ```
/// #[tokio::test(flavor = "multi_thread")]
/// async fn whole_suite_in_one_test() {
///     // e.g. let cluster = start_cluster(); ... connect(&cluster) ...
///     idempotency_conformance::run_conformance!(async { idempotency_memory::MemoryStore::default() });
/// } // a cluster started above would stop here
/// ```
#[macro_export]
macro_rules! run_conformance {
    ($make:expr) => {
        $crate::run_conformance!($make, |_store| async {})
    };
    ($make:expr, $teardown:expr) => {
        $crate::__with_cases!(run_conformance @all ($make) ($teardown))
    };
    (@all ($make:expr) ($teardown:expr) $($case:ident)*) => {{
        use $crate::__private::futures_util::FutureExt as _;
        let mut failed: ::std::vec::Vec<&str> = ::std::vec::Vec::new();
        $(
            let store = ::std::sync::Arc::new($make.await);
            let outcome = ::std::panic::AssertUnwindSafe($crate::cases::$case(::std::sync::Arc::clone(&store)))
                .catch_unwind()
                .await;
            ($teardown)(store).await;
            match outcome {
                Ok(()) => ::std::eprintln!("conformance case {} ... ok", stringify!($case)),
                Err(_) => {
                    ::std::eprintln!("conformance case {} ... FAILED", stringify!($case));
                    failed.push(stringify!($case));
                }
            }
        )*
        assert!(failed.is_empty(), "conformance cases failed: {failed:?}");
    }};
}

/// Calls `$callback!` with the given leading tokens followed by every case name. The one list
/// of cases, shared by [`conformance_suite!`] and [`run_conformance!`].
#[doc(hidden)]
#[macro_export]
macro_rules! __with_cases {
    ($callback:ident @ $mode:ident $($args:tt)*) => {
        $crate::$callback! { @ $mode $($args)*
            claim_of_a_fresh_key_proceeds
            claim_of_a_held_key_returns_the_in_flight_record
            concurrent_claims_have_exactly_one_winner
            scopes_are_isolated
            replay_is_byte_exact
            large_body_round_trips
            empty_and_omitted_bodies_round_trip
            different_fingerprint_never_replays_nor_overwrites
            completed_record_expires_on_read
            completed_record_reports_its_retention_left
            lease_expiry_allows_takeover_and_fences_the_old_token
            extend_keeps_a_claim_alive_for_its_holder_only
            complete_with_a_foreign_token_is_stale
            release_frees_the_key_at_once
            release_with_a_foreign_token_changes_nothing
            nothing_changes_a_completed_record
            purge_removes_only_expired_records
            purge_racing_takeovers_never_deletes_a_live_claim
            absent_key_reads_none_and_fences_stale
            hostile_keys_and_scopes_round_trip
            engine_runs_a_request_once_and_replays_it
            engine_status_reports_a_keys_outcome_in_its_own_scope_only
            engine_dropped_guard_releases_the_key
            engine_releases_statuses_the_policy_does_not_store
            engine_heartbeat_keeps_a_slow_request_from_being_taken_over
            engine_waits_for_an_in_flight_request_then_replays
            engine_keeps_the_claim_when_storing_the_response_fails
            once_runs_the_work_once_and_replays_its_value
            once_refuses_another_input_under_the_same_key
            once_releases_the_key_when_the_work_fails
            once_stores_a_permanent_refusal_as_a_value
            once_tells_a_concurrent_duplicate_it_is_in_flight
            watched_settles_are_heard_and_only_those
        }
    };
}

#[cfg(test)]
mod tests {
    /// The one list of cases names exactly the public functions of `cases/`, each once: a case
    /// written but not listed would never run, a listed one that is gone would not compile.
    #[test]
    fn the_case_list_names_every_case_once() {
        let sources = [
            include_str!("cases/claim.rs"),
            include_str!("cases/engine.rs"),
            include_str!("cases/expiry.rs"),
            include_str!("cases/fencing.rs"),
            include_str!("cases/once.rs"),
            include_str!("cases/replay.rs"),
            include_str!("cases/wake.rs"),
        ];
        let mut written: Vec<&str> = sources
            .iter()
            .flat_map(|source| source.lines())
            .filter_map(|line| line.strip_prefix("pub async fn "))
            .map(|rest| rest.split(['<', '(']).next().unwrap_or(rest).trim())
            .collect();
        written.sort_unstable();
        let mut listed = super::CASES.to_vec();
        listed.sort_unstable();
        let unique = listed.windows(2).all(|w| w[0] != w[1]);
        assert!(unique, "a case is listed twice: {listed:?}");
        assert_eq!(
            written, listed,
            "cases written (left) and listed in __with_cases! (right)"
        );
    }
}
