//! Fencing: takeover after the lease, and every change checked against the token (invariants 6 and 7).

use super::*;

/// Invariant 6: a claim whose lease ran out is taken over; the old token is then refused on
/// complete and on release, and the new holder's record is untouched.
pub async fn lease_expiry_allows_takeover_and_fences_the_old_token<S: IdempotencyStore + ?Sized>(
    store: Arc<S>,
) {
    let (s, k, fp) = (scope("takeover"), key(), fingerprint("a"));
    let old = must_claim(&*store, &s, &k, &fp, SHORT).await;
    tokio::time::sleep(PAST_SHORT).await;
    assert_eq!(
        get(&*store, &s, &k).await,
        None,
        "invariant 5: a claim past its lease must read as absent"
    );
    let new = must_claim(&*store, &s, &k, &fp, LONG).await;
    assert_eq!(
        complete(&*store, &s, &k, old, &response(200, b"late"), LONG).await,
        FenceOutcome::Stale,
        "invariant 6: a late completion from a lost lease was accepted"
    );
    assert_eq!(
        release(&*store, &s, &k, old).await,
        FenceOutcome::Stale,
        "invariant 6: a late release from a lost lease was accepted"
    );
    let stored = response(201, b"new holder");
    assert_eq!(
        complete(&*store, &s, &k, new, &stored, LONG).await,
        FenceOutcome::Applied
    );
    assert_eq!(completed_response(get(&*store, &s, &k).await), stored);
}

/// Invariant 6: `extend` keeps a claim alive past its first lease for its holder only, and
/// cannot revive a claim whose lease already ran out.
pub async fn extend_keeps_a_claim_alive_for_its_holder_only<S: IdempotencyStore + ?Sized>(
    store: Arc<S>,
) {
    let (s, k, fp) = (scope("extend"), key(), fingerprint("a"));
    let token = must_claim(&*store, &s, &k, &fp, SHORT).await;
    let extend = |token, lease| {
        let (store, s, k) = (Arc::clone(&store), s.clone(), k.clone());
        async move {
            store
                .extend(&s, &k, token, lease)
                .await
                .expect("invariant 8: extend must not fail against a healthy store")
        }
    };
    assert_eq!(
        extend(LeaseToken::new(), LONG).await,
        FenceOutcome::Stale,
        "invariant 6: a foreign token extended the claim"
    );
    assert_eq!(
        extend(token, Duration::from_secs(10)).await,
        FenceOutcome::Applied
    );
    tokio::time::sleep(PAST_SHORT).await;
    match get(&*store, &s, &k).await {
        Some(Record {
            state: RecordState::InFlight { lease_remaining },
            ..
        }) => assert!(
            lease_remaining > Duration::from_secs(5),
            "the extended lease must run from the extension: {lease_remaining:?}"
        ),
        other => panic!("an extended claim must still be in flight, got {other:?}"),
    }
    assert_eq!(
        complete(&*store, &s, &k, token, &response(201, b"done"), LONG).await,
        FenceOutcome::Applied
    );
    assert_eq!(
        extend(token, LONG).await,
        FenceOutcome::Stale,
        "a completed record has no lease to extend"
    );

    let (k2, t2) = (key(), LeaseToken::new());
    assert_eq!(
        claim(&*store, &s, &k2, &fp, t2, SHORT).await,
        ClaimOutcome::Claimed
    );
    tokio::time::sleep(PAST_SHORT).await;
    let revived = store
        .extend(&s, &k2, t2, LONG)
        .await
        .expect("invariant 8: extend must not fail against a healthy store");
    assert_eq!(
        revived,
        FenceOutcome::Stale,
        "invariant 6: a lapsed claim was revived"
    );
    assert_eq!(get(&*store, &s, &k2).await, None);
}

/// Invariant 6: a token that never held the claim cannot complete it.
pub async fn complete_with_a_foreign_token_is_stale<S: IdempotencyStore + ?Sized>(store: Arc<S>) {
    let (s, k, fp) = (scope("foreign"), key(), fingerprint("a"));
    let token = must_claim(&*store, &s, &k, &fp, LONG).await;
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
    assert!(matches!(
        get(&*store, &s, &k).await,
        Some(Record {
            state: RecordState::InFlight { .. },
            ..
        })
    ));
    assert_eq!(
        complete(&*store, &s, &k, token, &response(200, b"y"), LONG).await,
        FenceOutcome::Applied
    );
}

/// Invariant 7: a released key is free at once, for any request.
pub async fn release_frees_the_key_at_once<S: IdempotencyStore + ?Sized>(store: Arc<S>) {
    let (s, k, fp) = (scope("release"), key(), fingerprint("a"));
    let token = must_claim(&*store, &s, &k, &fp, LONG).await;
    assert_eq!(release(&*store, &s, &k, token).await, FenceOutcome::Applied);
    assert_eq!(get(&*store, &s, &k).await, None);
    must_claim(&*store, &s, &k, &fingerprint("b"), LONG).await;
}

/// Invariant 6: release with a foreign token leaves the claim in place.
pub async fn release_with_a_foreign_token_changes_nothing<S: IdempotencyStore + ?Sized>(
    store: Arc<S>,
) {
    let (s, k, fp) = (scope("foreign-release"), key(), fingerprint("a"));
    must_claim(&*store, &s, &k, &fp, LONG).await;
    assert_eq!(
        release(&*store, &s, &k, LeaseToken::new()).await,
        FenceOutcome::Stale
    );
    assert!(matches!(
        claim(&*store, &s, &k, &fp, LeaseToken::new(), LONG).await,
        ClaimOutcome::Existing(_)
    ));
}

/// Once completed, neither a second complete nor a release (even with the holder's token)
/// changes the record: a replay is final.
pub async fn nothing_changes_a_completed_record<S: IdempotencyStore + ?Sized>(store: Arc<S>) {
    let (s, k, fp) = (scope("final"), key(), fingerprint("a"));
    let token = must_claim(&*store, &s, &k, &fp, LONG).await;
    let first = response(201, b"first");
    assert_eq!(
        complete(&*store, &s, &k, token, &first, LONG).await,
        FenceOutcome::Applied
    );
    assert_eq!(
        complete(&*store, &s, &k, token, &response(200, b"second"), LONG).await,
        FenceOutcome::Stale
    );
    assert_eq!(release(&*store, &s, &k, token).await, FenceOutcome::Stale);
    assert_eq!(completed_response(get(&*store, &s, &k).await), first);
}
