//! Expiry: absent on read, purged or not; absent keys fence as stale (invariants 5 and 8).

use super::*;

/// Invariant 5: a completed record past its retention reads as absent and can be claimed.
pub async fn completed_record_expires_on_read<S: IdempotencyStore + ?Sized>(store: Arc<S>) {
    let (s, k, fp) = (scope("expiry"), key(), fingerprint("a"));
    let token = must_claim(&*store, &s, &k, &fp, LONG).await;
    let stored = response(200, b"{}");
    assert_eq!(
        complete(&*store, &s, &k, token, &stored, Duration::from_secs(2)).await,
        FenceOutcome::Applied
    );
    assert!(
        get(&*store, &s, &k).await.is_some(),
        "a fresh record must be live"
    );
    tokio::time::sleep(Duration::from_millis(2600)).await;
    assert_eq!(
        get(&*store, &s, &k).await,
        None,
        "invariant 5: an expired record is still visible"
    );
    must_claim(&*store, &s, &k, &fingerprint("another request"), LONG).await;
}

/// `purge_expired` removes expired records and keeps every live one.
pub async fn purge_removes_only_expired_records<S: IdempotencyStore + ?Sized>(store: Arc<S>) {
    let s = scope("purge");
    let fp = fingerprint("a");
    let (live_done, live_held, dead_done, dead_held) = (key(), key(), key(), key());
    let t = must_claim(&*store, &s, &live_done, &fp, LONG).await;
    assert_eq!(
        complete(&*store, &s, &live_done, t, &response(200, b"live"), LONG).await,
        FenceOutcome::Applied
    );
    must_claim(&*store, &s, &live_held, &fp, LONG).await;
    let t = must_claim(&*store, &s, &dead_done, &fp, LONG).await;
    assert_eq!(
        complete(&*store, &s, &dead_done, t, &response(200, b"dead"), SHORT).await,
        FenceOutcome::Applied
    );
    must_claim(&*store, &s, &dead_held, &fp, SHORT).await;
    tokio::time::sleep(PAST_SHORT).await;
    store
        .purge_expired(100_000)
        .await
        .expect("invariant 8: purge must not fail against a healthy store");
    assert_eq!(
        completed_response(get(&*store, &s, &live_done).await)
            .body()
            .as_ref(),
        b"live"
    );
    assert!(matches!(
        get(&*store, &s, &live_held).await,
        Some(Record {
            state: RecordState::InFlight { .. },
            ..
        })
    ));
    assert_eq!(get(&*store, &s, &dead_done).await, None);
    assert_eq!(get(&*store, &s, &dead_held).await, None);
}

/// Operations on a key that was never claimed: absent, and fenced operations are stale.
pub async fn absent_key_reads_none_and_fences_stale<S: IdempotencyStore + ?Sized>(store: Arc<S>) {
    let (s, k) = (scope("absent"), key());
    assert_eq!(get(&*store, &s, &k).await, None);
    assert_eq!(
        complete(
            &*store,
            &s,
            &k,
            LeaseToken::new(),
            &response(200, b"x"),
            LONG
        )
        .await,
        FenceOutcome::Stale
    );
    assert_eq!(
        get(&*store, &s, &k).await,
        None,
        "a stale complete must not create a record"
    );
    assert_eq!(
        release(&*store, &s, &k, LeaseToken::new()).await,
        FenceOutcome::Stale
    );
}
