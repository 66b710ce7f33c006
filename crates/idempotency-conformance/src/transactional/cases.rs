//! The transactional cases of the request's engine: a handler's write and its response commit
//! together, in each claim mode.

use super::{
    Answer, SETTLE, TransactionalHarness, answer, engine, fresh, proceed, runs_again_once, write,
};
use crate::cases::{LONG, fingerprint, key, response, scope};
use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use idempotency_core::{
    Begin, ClaimMode, Completion, Engine, EngineConfig, RollbackCause, StoredResponse, Superseded,
};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// Invariant 10: a committed request has its write and its stored response, and its retry
/// replays without writing again.
pub async fn tx_commit_keeps_the_write_and_the_response<H: TransactionalHarness>(
    harness: Arc<H>,
    mode: ClaimMode,
) {
    let engine = engine(&*harness, mode);
    let (scope, key, tag) = (scope("tx_commit"), key(), uuid::Uuid::new_v4().to_string());
    let guard = fresh(&engine, &scope, &key, "a", "a fresh key").await;
    write(&*harness, &guard, &tag).await;
    assert_eq!(
        guard.complete(response(201, b"{\"id\":1}")).await,
        Completion::Stored
    );
    assert_eq!(harness.count(&tag).await, 1, "the write committed");
    match answer(&*harness, &engine, &scope, &key, "a").await {
        Answer::Replay(stored) => assert_eq!(stored, response(201, b"{\"id\":1}")),
        other => panic!("the retry must replay, got {other:?}"),
    }
    assert_eq!(harness.count(&tag).await, 1, "the replay wrote nothing");
}

/// A handler that fails (its status is not stored) leaves none of its writes, and the key is
/// free at once for the retry.
pub async fn tx_handler_failure_rolls_back_and_frees_the_key<H: TransactionalHarness>(
    harness: Arc<H>,
    mode: ClaimMode,
) {
    let engine = engine(&*harness, mode);
    let (scope, key, tag) = (scope("tx_failure"), key(), uuid::Uuid::new_v4().to_string());
    let guard = fresh(&engine, &scope, &key, "a", "a fresh key").await;
    write(&*harness, &guard, &tag).await;
    assert_eq!(
        guard.complete(response(500, b"oops")).await,
        Completion::Released
    );
    assert_eq!(
        harness.count(&tag).await,
        0,
        "a failed request's write rolled back"
    );
    runs_again_once(&*harness, &engine, &scope, &key, &tag).await;
}

/// A request dropped before its commit (a crash, a cancelled future) leaves none of its
/// writes, and the key is freed for the retry (at once in the one-transaction mode, by the
/// background release in the lease mode).
pub async fn tx_dropped_request_leaves_nothing<H: TransactionalHarness>(
    harness: Arc<H>,
    mode: ClaimMode,
) {
    let engine = engine(&*harness, mode);
    let (scope, key, tag) = (scope("tx_dropped"), key(), uuid::Uuid::new_v4().to_string());
    let guard = fresh(&engine, &scope, &key, "a", "a fresh key").await;
    write(&*harness, &guard, &tag).await;
    drop(guard);
    // The retry runs once: the dropped request's write rolled back (or there would be two).
    runs_again_once(&*harness, &engine, &scope, &key, &tag).await;
}

/// A duplicate that arrives while the first request's transaction is open is told it is in
/// flight (it neither runs nor waits on a lock), and replays once the first commits.
pub async fn tx_duplicate_while_open_is_in_flight_then_replays<H: TransactionalHarness>(
    harness: Arc<H>,
    mode: ClaimMode,
) {
    let engine = engine(&*harness, mode);
    let (scope, key, tag) = (
        scope("tx_duplicate"),
        key(),
        uuid::Uuid::new_v4().to_string(),
    );
    let first = fresh(&engine, &scope, &key, "a", "a fresh key").await;
    write(&*harness, &first, &tag).await;
    let started = Instant::now();
    match tokio::time::timeout(SETTLE, answer(&*harness, &engine, &scope, &key, "a"))
        .await
        .expect("a duplicate is answered without waiting for the first request")
    {
        Answer::InFlight(retry_after) => assert!(
            retry_after > Duration::ZERO,
            "a duplicate gets a retry hint"
        ),
        other => panic!("a duplicate of an open request must be in flight, got {other:?}"),
    }
    assert!(started.elapsed() < SETTLE);
    assert_eq!(
        first.complete(response(201, b"first")).await,
        Completion::Stored
    );
    match answer(&*harness, &engine, &scope, &key, "a").await {
        Answer::Replay(stored) => assert_eq!(stored, response(201, b"first")),
        other => panic!("after the first committed, the duplicate must replay, got {other:?}"),
    }
    assert_eq!(harness.count(&tag).await, 1);
}

/// Invariant 1 through the transaction: many concurrent duplicates of one key, each retrying
/// while told "in flight", end with exactly one committed write, and every one of them with
/// the first request's response.
pub async fn tx_concurrent_duplicates_write_once<H: TransactionalHarness>(
    harness: Arc<H>,
    mode: ClaimMode,
) {
    let engine = engine(&*harness, mode);
    let (scope, key, tag) = (scope("tx_race"), key(), uuid::Uuid::new_v4().to_string());
    let mut tasks = Vec::new();
    for i in 0..16u32 {
        let (engine, harness) = (engine.clone(), Arc::clone(&harness));
        let (scope, key, tag) = (scope.clone(), key.clone(), tag.clone());
        tasks.push(tokio::spawn(async move {
            let until = Instant::now() + SETTLE;
            loop {
                let begun = engine
                    .begin(scope.clone(), key.clone(), fingerprint("same"))
                    .await
                    .expect("begin");
                match begun {
                    Begin::Proceed(guard) => {
                        let slot = guard
                            .transaction()
                            .expect("a transactional store offers the request a transaction");
                        // Refused in the speculative mode when the key turns out taken.
                        let written = harness.write(slot, &tag).await;
                        let mine = StoredResponse::new(
                            StatusCode::CREATED,
                            HeaderMap::new(),
                            Bytes::from(format!("winner {i}")),
                        );
                        match guard.complete(mine.clone()).await {
                            Completion::Stored => {
                                written.expect("the request that stored its response wrote");
                                return mine;
                            }
                            Completion::Superseded(Superseded::Replay(stored)) => {
                                return stored.into_response();
                            }
                            Completion::Superseded(Superseded::InFlight { .. })
                                if Instant::now() < until =>
                            {
                                tokio::time::sleep(Duration::from_millis(5)).await;
                            }
                            other => panic!("unexpected completion {other:?}"),
                        }
                    }
                    Begin::Replay(stored) => return stored.into_response(),
                    Begin::InFlight { .. } if Instant::now() < until => {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    other => panic!("unexpected answer {other:?}"),
                }
            }
        }));
    }
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.expect("a duplicate's task"));
    }
    assert_eq!(
        harness.count(&tag).await,
        1,
        "one write for sixteen duplicates"
    );
    assert!(
        answers.windows(2).all(|w| w[0] == w[1]),
        "every duplicate got the same response: {answers:?}"
    );
}

/// Invariant 5 through the transaction: a record past its retention is absent, and a new
/// request with its key runs and stores its own response in place of it.
pub async fn tx_expired_record_is_taken_over<H: TransactionalHarness>(
    harness: Arc<H>,
    mode: ClaimMode,
) {
    let short = Engine::new(
        harness.store(),
        EngineConfig::default()
            .lease(LONG)
            .retention(Duration::from_millis(400))
            .claim_mode(mode),
    )
    .expect("the suite's engine settings are valid");
    let (scope, key, tag) = (scope("tx_expired"), key(), uuid::Uuid::new_v4().to_string());
    let first = fresh(&short, &scope, &key, "a", "a fresh key").await;
    write(&*harness, &first, &tag).await;
    assert_eq!(
        first.complete(response(201, b"first")).await,
        Completion::Stored
    );
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let engine = engine(&*harness, mode);
    let second = fresh(&engine, &scope, &key, "b", "an expired record is absent").await;
    write(&*harness, &second, &tag).await;
    assert_eq!(
        second.complete(response(201, b"second")).await,
        Completion::Stored
    );
    match answer(&*harness, &engine, &scope, &key, "b").await {
        Answer::Replay(stored) => assert_eq!(stored, response(201, b"second")),
        other => panic!("the new record must replay, got {other:?}"),
    }
    assert_eq!(
        harness.count(&tag).await,
        2,
        "each run committed its own write"
    );
}

/// Lease mode: a request whose lease ran out and was taken over cannot commit; none of its
/// writes exist, and the request that took over commits once.
pub async fn tx_lease_commit_after_takeover_is_fenced<H: TransactionalHarness>(harness: Arc<H>) {
    let short = Engine::new(
        harness.store(),
        EngineConfig::default()
            .lease(Duration::from_millis(400))
            .heartbeat(false),
    )
    .expect("the suite's engine settings are valid");
    let (scope, key, tag) = (scope("tx_fenced"), key(), uuid::Uuid::new_v4().to_string());
    let stale = fresh(&short, &scope, &key, "a", "a fresh key").await;
    // Busy with statements until its lease is long gone: a transaction idle for longer than a
    // lease is ended by the store ([`tx_idle_past_the_lease_commits_nothing`]), which would
    // keep this case from reaching the commit's fence.
    let lapsed = Instant::now() + Duration::from_millis(1200);
    while Instant::now() < lapsed {
        write(&*harness, &stale, &tag).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let taker = engine(&*harness, ClaimMode::Lease);
    let current = fresh(&taker, &scope, &key, "a", "a lapsed lease is taken over").await;
    assert_eq!(
        stale.complete(response(201, b"stale")).await,
        Completion::RolledBack(RollbackCause::LeaseLost),
        "a commit after a takeover is refused"
    );
    assert_eq!(
        harness.count(&tag).await,
        0,
        "the stale request's write rolled back"
    );
    write(&*harness, &current, &tag).await;
    assert_eq!(
        current.complete(response(201, b"current")).await,
        Completion::Stored
    );
    assert_eq!(harness.count(&tag).await, 1);
}

/// A request's transaction left idle (the handler waits on something outside the database, or
/// its process froze) for longer than the lease is ended by the store, from the database's
/// side: nothing it wrote commits, even though the heartbeat kept its claim alive, and the key
/// runs again. Without it a frozen process's transaction, and every row it locked, would stay
/// for as long as the process stays frozen.
pub async fn tx_idle_past_the_lease_commits_nothing<H: TransactionalHarness>(
    harness: Arc<H>,
    mode: ClaimMode,
) {
    let lease = Duration::from_millis(600);
    let short = Engine::new(
        harness.store(),
        EngineConfig::default()
            .lease(lease)
            .store_timeout(Duration::from_millis(150))
            .claim_mode(mode),
    )
    .expect("the suite's engine settings are valid");
    let (scope, key, tag) = (scope("tx_idle"), key(), uuid::Uuid::new_v4().to_string());
    let idle = fresh(&short, &scope, &key, "a", "a fresh key").await;
    write(&*harness, &idle, &tag).await;
    tokio::time::sleep(lease * 3).await;
    let completion = idle.complete(response(201, b"late")).await;
    assert!(
        !matches!(completion, Completion::Stored),
        "{mode:?}: a transaction idle for longer than the lease must not commit: {completion:?}"
    );
    assert_eq!(
        harness.count(&tag).await,
        0,
        "{mode:?}: nothing the idle transaction wrote stands ({completion:?})"
    );
    let taker = engine(&*harness, mode);
    runs_again_once(&*harness, &taker, &scope, &key, &tag).await;
}

/// One-transaction mode: the unique index, not the lock, decides. A request whose key was
/// completed by another while its transaction was open (here a lease-mode request on the same
/// table) rolls back all of its writes and answers with the record that stands.
pub async fn tx_one_transaction_loser_rolls_back_and_replays<H: TransactionalHarness>(
    harness: Arc<H>,
    mode: ClaimMode,
) {
    let one_tx = engine(&*harness, mode);
    let lease = engine(&*harness, ClaimMode::Lease);
    let (scope, key) = (scope("tx_loser"), key());
    let (late_tag, winner_tag) = (
        uuid::Uuid::new_v4().to_string(),
        uuid::Uuid::new_v4().to_string(),
    );
    let late = fresh(&one_tx, &scope, &key, "a", "a fresh key").await;
    write(&*harness, &late, &late_tag).await;
    let winner = fresh(
        &lease,
        &scope,
        &key,
        "a",
        "the lease mode does not see the open transaction's key",
    )
    .await;
    write(&*harness, &winner, &winner_tag).await;
    assert_eq!(
        winner.complete(response(201, b"winner")).await,
        Completion::Stored
    );
    match late.complete(response(201, b"late")).await {
        Completion::Superseded(Superseded::Replay(replayed)) => assert_eq!(
            replayed,
            response(201, b"winner"),
            "the later commit rolls back and replays the record that stands"
        ),
        other => panic!("the later commit must replay the record that stands, got {other:?}"),
    }
    assert_eq!(
        harness.count(&late_tag).await,
        0,
        "the loser's write rolled back"
    );
    assert_eq!(harness.count(&winner_tag).await, 1);

    // With another request's fingerprint, the loser answers as a mismatch.
    let (scope, key) = (
        crate::cases::scope("tx_loser_mismatch"),
        crate::cases::key(),
    );
    let late = fresh(&one_tx, &scope, &key, "a", "a fresh key").await;
    write(&*harness, &late, &late_tag).await;
    let winner = proceed(
        lease
            .begin(scope, key, fingerprint("b"))
            .await
            .expect("begin"),
        "the lease mode does not see the open transaction's key",
    );
    assert_eq!(
        winner.complete(response(201, b"b")).await,
        Completion::Stored
    );
    assert_eq!(
        late.complete(response(201, b"a")).await,
        Completion::Superseded(Superseded::Mismatch)
    );
    assert_eq!(
        harness.count(&late_tag).await,
        0,
        "the loser's write rolled back"
    );
}

/// Speculative mode: a request for a key that is taken (completed, or another request's
/// transaction open) runs its handler before the key's lookup answers, but its first statement
/// is refused, none of its writes stand, and it is answered as the key's retry is: the replay,
/// the mismatch, or in flight.
pub async fn tx_speculative_handler_of_a_taken_key_writes_nothing<H: TransactionalHarness>(
    harness: Arc<H>,
    mode: ClaimMode,
) {
    let engine = engine(&*harness, mode);
    let (scope, key, tag) = (
        scope("tx_speculative"),
        key(),
        uuid::Uuid::new_v4().to_string(),
    );
    let first = fresh(&engine, &scope, &key, "a", "a fresh key").await;
    write(&*harness, &first, &tag).await;
    // Open: the duplicate's write is refused by the key's lock, and it is told "in flight".
    assert!(matches!(
        answer(&*harness, &engine, &scope, &key, "a").await,
        Answer::InFlight(_)
    ));
    assert_eq!(
        first.complete(response(201, b"first")).await,
        Completion::Stored
    );
    // Completed: the same body replays, another body is a mismatch; neither writes.
    match answer(&*harness, &engine, &scope, &key, "a").await {
        Answer::Replay(stored) => assert_eq!(stored, response(201, b"first")),
        other => panic!("the retry must replay, got {other:?}"),
    }
    assert!(matches!(
        answer(&*harness, &engine, &scope, &key, "b").await,
        Answer::Mismatch
    ));
    assert_eq!(harness.count(&tag).await, 1, "one write for three requests");
}
