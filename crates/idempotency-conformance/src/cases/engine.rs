//! The engine over the store: the protocol end to end, and its promises across store faults.

use super::*;

/// The guard of a fresh key, which must proceed.
async fn proceed<S: IdempotencyStore + 'static>(
    engine: &Engine<S>,
    s: &Scope,
    k: &IdempotencyKey,
    fp: Fingerprint,
) -> Guard<S> {
    match engine.begin(s.clone(), k.clone(), fp).await.expect("begin") {
        Begin::Proceed(guard) => guard,
        other => panic!("a fresh key must proceed, got {other:?}"),
    }
}

fn engine<S: IdempotencyStore + ?Sized + 'static>(
    store: Arc<S>,
    config: EngineConfig,
) -> Engine<Arc<S>> {
    Engine::new(store, config).expect("the suite's engine settings are valid")
}

/// The engine over this store: the first request proceeds, its retry replays, a concurrent
/// duplicate is told it is in flight, and a different request is refused.
pub async fn engine_runs_a_request_once_and_replays_it<S: IdempotencyStore + ?Sized + 'static>(
    store: Arc<S>,
) {
    let engine = engine(store, EngineConfig::default());
    let (s, k, fp) = (scope("engine"), key(), fingerprint("a"));
    let guard = proceed(&engine, &s, &k, fp).await;
    match engine.begin(s.clone(), k.clone(), fp).await.expect("begin") {
        Begin::InFlight { retry_after } => assert!(retry_after > Duration::ZERO),
        other => panic!("a running duplicate must be in flight, got {other:?}"),
    }
    let stored = response(201, b"{\"id\":1}");
    assert_eq!(guard.complete(stored.clone()).await, Completion::Stored);
    match engine.begin(s.clone(), k.clone(), fp).await.expect("begin") {
        Begin::Replay(replay) => assert_eq!(replay, stored),
        other => panic!("a retry must replay, got {other:?}"),
    }
    assert!(matches!(
        engine.begin(s, k, fingerprint("b")).await.expect("begin"),
        Begin::Mismatch
    ));
}

/// [`Engine::status`] over this store: absent before the request, in flight while it runs,
/// completed with its status and times once answered, absent again after a release, and
/// absent in every other scope, whatever the key holds in its own.
pub async fn engine_status_reports_a_keys_outcome_in_its_own_scope_only<
    S: IdempotencyStore + ?Sized + 'static,
>(
    store: Arc<S>,
) {
    let retention = Duration::from_secs(3_600);
    let engine = engine(store, EngineConfig::default().retention(retention));
    let (s, k, fp) = (scope("status"), key(), fingerprint("a"));
    let other = scope("status-other");
    assert_eq!(
        engine.status(&s, &k).await.expect("status"),
        KeyStatus::Absent
    );
    let guard = proceed(&engine, &s, &k, fp).await;
    match engine.status(&s, &k).await.expect("status") {
        KeyStatus::InFlight {
            lease_remaining,
            retry_after,
        } => {
            assert!(lease_remaining > Duration::ZERO && lease_remaining <= engine.config().lease);
            assert!(retry_after > Duration::ZERO && retry_after <= lease_remaining);
        }
        other => panic!("a running key must read in flight, got {other:?}"),
    }
    assert_eq!(
        engine.status(&other, &k).await.expect("status"),
        KeyStatus::Absent,
        "another scope must not see a running key"
    );
    assert_eq!(
        guard.complete(response(201, b"{\"id\":1}")).await,
        Completion::Stored
    );
    match engine.status(&s, &k).await.expect("status") {
        KeyStatus::Completed {
            status,
            answered_ago,
            expires_in,
        } => {
            assert_eq!(status.as_u16(), 201);
            assert!(
                answered_ago < Duration::from_secs(20),
                "answered {answered_ago:?} ago, just now"
            );
            assert!(expires_in <= retention && expires_in > retention - Duration::from_secs(20));
        }
        other => panic!("an answered key must read completed, got {other:?}"),
    }
    assert_eq!(
        engine.status(&other, &k).await.expect("status"),
        KeyStatus::Absent,
        "another scope must not see a completed key"
    );
    // A key released after a failure reads absent: sent again, its request runs.
    let released = key();
    let guard = proceed(&engine, &s, &released, fp).await;
    assert!(matches!(
        guard.complete(response(503, b"down")).await,
        Completion::Released
    ));
    assert_eq!(
        engine.status(&s, &released).await.expect("status"),
        KeyStatus::Absent
    );
}

/// A guard dropped without completing (a panic, a cancelled request) frees the key.
pub async fn engine_dropped_guard_releases_the_key<S: IdempotencyStore + ?Sized + 'static>(
    store: Arc<S>,
) {
    let engine = engine(store, EngineConfig::default());
    let (s, k, fp) = (scope("drop"), key(), fingerprint("a"));
    let guard = proceed(&engine, &s, &k, fp).await;
    let handler = tokio::spawn(async move {
        let _guard = guard;
        panic!("the handler panics while holding the guard");
    });
    assert!(handler.await.is_err_and(|e| e.is_panic()));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        match engine.begin(s.clone(), k.clone(), fp).await.expect("begin") {
            Begin::Proceed(_) => return,
            Begin::InFlight { .. } if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            other => panic!("a dropped guard must release its key within 5 s, got {other:?}"),
        }
    }
}

/// A status the policy does not store (5xx) releases the key, and the retry runs.
pub async fn engine_releases_statuses_the_policy_does_not_store<
    S: IdempotencyStore + ?Sized + 'static,
>(
    store: Arc<S>,
) {
    let engine = engine(
        store,
        EngineConfig::default().replay_policy(ReplayPolicy::standard()),
    );
    let (s, k, fp) = (scope("5xx"), key(), fingerprint("a"));
    let guard = proceed(&engine, &s, &k, fp).await;
    assert_eq!(
        guard.complete(response(503, b"down")).await,
        Completion::Released
    );
    assert!(matches!(
        engine.begin(s, k, fp).await.expect("begin"),
        Begin::Proceed(_)
    ));
}

/// With the heartbeat, a request slower than its lease keeps its key: a duplicate arriving after
/// the first lease would have run out is told it is in flight, not allowed to run again.
pub async fn engine_heartbeat_keeps_a_slow_request_from_being_taken_over<
    S: IdempotencyStore + ?Sized + 'static,
>(
    store: Arc<S>,
) {
    let engine = engine(
        store,
        EngineConfig::default()
            .lease(Duration::from_millis(1500))
            .store_timeout(Duration::from_millis(500))
            .heartbeat(true),
    );
    let (s, k, fp) = (scope("heartbeat"), key(), fingerprint("a"));
    let guard = proceed(&engine, &s, &k, fp).await;
    // The guard's heartbeat runs in the background from the claim until the response is stored.
    let slow = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(4000)).await;
        assert!(
            guard.claim().is_held(),
            "the heartbeat must keep the lease held"
        );
        guard.complete(response(201, b"slow")).await
    });
    // Probes at 1 s, 2 s and 3 s: the last two are past the first lease's end.
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(1000)).await;
        match engine.begin(s.clone(), k.clone(), fp).await.expect("begin") {
            Begin::InFlight { .. } => {}
            other => panic!("a kept-alive request must not be taken over, got {other:?}"),
        }
    }
    assert_eq!(slow.await.expect("slow request"), Completion::Stored);
    assert!(matches!(
        engine.begin(s, k, fp).await.expect("begin"),
        Begin::Replay(_)
    ));
}

/// With a wait bound, a duplicate waits for the first request and gets its response.
pub async fn engine_waits_for_an_in_flight_request_then_replays<
    S: IdempotencyStore + ?Sized + 'static,
>(
    store: Arc<S>,
) {
    let engine = engine(
        store,
        EngineConfig::default().in_flight_wait(Duration::from_secs(10)),
    );
    let (s, k, fp) = (scope("wait"), key(), fingerprint("a"));
    let guard = proceed(&engine, &s, &k, fp).await;
    let stored = response(201, b"{\"id\":7}");
    let first = {
        let stored = stored.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            guard.complete(stored).await
        })
    };
    match engine.begin(s, k, fp).await.expect("begin") {
        Begin::Replay(replay) => assert_eq!(replay, stored),
        other => panic!("a waiting duplicate must get the first response, got {other:?}"),
    }
    assert_eq!(first.await.expect("first request"), Completion::Stored);
}

/// The store fails when the response is stored, after the handler ran: the engine keeps the claim
/// (a duplicate is told the request is in flight, never let run), and stores the response in the
/// background once the store answers again.
pub async fn engine_keeps_the_claim_when_storing_the_response_fails<
    S: IdempotencyStore + ?Sized + 'static,
>(
    store: Arc<S>,
) {
    use crate::faults::{Fault, FaultyStore, StoreOp};
    let faulty = FaultyStore::new(store);
    let engine = Engine::new(faulty.clone(), EngineConfig::default().lease(LONG))
        .expect("the suite's engine settings are valid");
    let (s, k, fp) = (scope("deferred"), key(), fingerprint("a"));
    let guard = proceed(&engine, &s, &k, fp).await;
    faulty.set(StoreOp::Complete, Fault::Fail);
    let stored = response(201, b"{\"id\":9}");
    assert_eq!(
        guard.complete(stored.clone()).await,
        Completion::Deferred,
        "invariant 9: a failed completion keeps the claim"
    );
    match engine.begin(s.clone(), k.clone(), fp).await.expect("begin") {
        Begin::InFlight { .. } => {}
        other => {
            panic!("invariant 9: the side effect may stand, so the key stays held; got {other:?}")
        }
    }
    faulty.clear(StoreOp::Complete);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match engine.begin(s.clone(), k.clone(), fp).await.expect("begin") {
            Begin::Replay(replay) => {
                assert_eq!(replay, stored);
                return;
            }
            Begin::InFlight { .. } if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => panic!(
                "the deferred completion must be stored once the store is back, got {other:?}"
            ),
        }
    }
}
