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

/// A completed record tells how long it has left (what a cache in front of the store may keep
/// it for): no more than the retention it was stored with, and not much less right after.
pub async fn completed_record_reports_its_retention_left<S: IdempotencyStore + ?Sized>(
    store: Arc<S>,
) {
    let (s, k, fp) = (scope("retention-left"), key(), fingerprint("a"));
    let retention = Duration::from_secs(120);
    let token = must_claim(&*store, &s, &k, &fp, LONG).await;
    assert_eq!(
        complete(&*store, &s, &k, token, &response(200, b"{}"), retention).await,
        FenceOutcome::Applied
    );
    let by_get = get(&*store, &s, &k).await;
    let by_claim = match claim(&*store, &s, &k, &fp, LeaseToken::new(), LONG).await {
        ClaimOutcome::Existing(record) => Some(record),
        ClaimOutcome::Claimed => panic!("invariant 4: a completed key was claimed again"),
    };
    for (how, record) in [("get", by_get), ("claim", by_claim)] {
        match record {
            Some(Record {
                state:
                    RecordState::Completed {
                        retention_remaining,
                        ..
                    },
                ..
            }) => assert!(
                retention_remaining <= retention
                    && retention_remaining > retention - Duration::from_secs(20),
                "{how}: a record stored for {retention:?} a moment ago reports \
                 {retention_remaining:?} left"
            ),
            other => panic!("{how}: expected a completed record, got {other:?}"),
        }
    }
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

/// Invariant 4 under a purge: purging while expired claims are being taken over never deletes a
/// takeover's live claim (the purge must re-check expiry on the row it deletes, not only on
/// the row it picked).
pub async fn purge_racing_takeovers_never_deletes_a_live_claim<S: IdempotencyStore + ?Sized>(
    store: Arc<S>,
) {
    use std::sync::atomic::{AtomicBool, Ordering};
    let (s, fp) = (scope("purge-race"), fingerprint("a"));
    let keys: Vec<IdempotencyKey> = (0..200).map(|_| key()).collect();
    for k in &keys {
        must_claim(&*store, &s, k, &fp, SHORT).await;
    }
    tokio::time::sleep(PAST_SHORT).await;
    let done = AtomicBool::new(false);
    let purger = async {
        let mut purges = 0u32;
        while !done.load(Ordering::Relaxed) || purges == 0 {
            store
                .purge_expired(3)
                .await
                .expect("invariant 8: purge must not fail against a healthy store");
            purges += 1;
            tokio::task::yield_now().await;
        }
    };
    let takeovers = async {
        let mut tokens = Vec::with_capacity(keys.len());
        for k in &keys {
            let token = LeaseToken::new();
            match claim(&*store, &s, k, &fp, token, LONG).await {
                ClaimOutcome::Claimed => tokens.push(token),
                other => panic!("an expired claim must be taken over, got {other:?}"),
            }
        }
        done.store(true, Ordering::Relaxed);
        tokens
    };
    let ((), tokens) = futures_util::join!(purger, takeovers);
    for (k, token) in keys.iter().zip(tokens) {
        assert!(
            matches!(
                get(&*store, &s, k).await,
                Some(Record {
                    state: RecordState::InFlight { .. },
                    ..
                })
            ),
            "invariant 4: the purge deleted a claim taken over while it ran"
        );
        assert_eq!(
            complete(&*store, &s, k, token, &response(200, b"{}"), LONG).await,
            FenceOutcome::Applied,
            "the takeover must still hold its claim after the purge"
        );
    }
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
