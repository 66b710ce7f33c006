//! Claims: one winner, scopes kept apart, hostile names stored exactly (invariants 1 and 2).

use super::*;

/// A fresh key is claimed, and the record reads back as in flight with its fingerprint.
pub async fn claim_of_a_fresh_key_proceeds<S: IdempotencyStore + ?Sized>(store: Arc<S>) {
    let (s, k, fp) = (scope("fresh"), key(), fingerprint("a"));
    must_claim(&*store, &s, &k, &fp, LONG).await;
    match get(&*store, &s, &k).await {
        Some(Record {
            fingerprint,
            state: RecordState::InFlight { lease_remaining },
        }) => {
            assert_eq!(fingerprint, fp);
            assert!(lease_remaining > Duration::ZERO && lease_remaining <= LONG);
        }
        other => panic!("a claimed key must read as in flight, got {other:?}"),
    }
}

/// A second claim of a held key gets the in-flight record, with the remaining lease.
pub async fn claim_of_a_held_key_returns_the_in_flight_record<S: IdempotencyStore + ?Sized>(
    store: Arc<S>,
) {
    let (s, k, fp) = (scope("held"), key(), fingerprint("a"));
    must_claim(&*store, &s, &k, &fp, LONG).await;
    match claim(&*store, &s, &k, &fp, LeaseToken::new(), LONG).await {
        ClaimOutcome::Existing(Record {
            fingerprint,
            state: RecordState::InFlight { lease_remaining },
        }) => {
            assert_eq!(fingerprint, fp);
            assert!(
                lease_remaining > LONG / 2 && lease_remaining <= LONG,
                "the remaining lease must come from the first claim: {lease_remaining:?}"
            );
        }
        other => panic!("invariant 1: a held key must not be claimed twice, got {other:?}"),
    }
}

/// Invariant 1: of 64 concurrent claims of one key, exactly one wins; 50 rounds, fresh keys.
pub async fn concurrent_claims_have_exactly_one_winner<S: IdempotencyStore + ?Sized + 'static>(
    store: Arc<S>,
) {
    const ROUNDS: usize = 50;
    const CONTENDERS: usize = 64;
    let s = scope("race");
    let fp = fingerprint("race");
    for round in 0..ROUNDS {
        let k = key();
        let barrier = Arc::new(tokio::sync::Barrier::new(CONTENDERS));
        let tasks: Vec<_> = (0..CONTENDERS)
            .map(|_| {
                let (store, s, k, barrier) = (
                    Arc::clone(&store),
                    s.clone(),
                    k.clone(),
                    Arc::clone(&barrier),
                );
                tokio::spawn(async move {
                    barrier.wait().await;
                    store.claim(&s, &k, &fp, LeaseToken::new(), LONG).await
                })
            })
            .collect();
        let mut winners = 0;
        for task in tasks {
            match task.await.expect("claim task panicked") {
                Ok(ClaimOutcome::Claimed) => winners += 1,
                Ok(ClaimOutcome::Existing(record)) => {
                    assert_eq!(record.fingerprint, fp);
                    assert!(matches!(record.state, RecordState::InFlight { .. }));
                }
                Err(e) => panic!("invariant 8: claim failed: {e}"),
            }
        }
        assert_eq!(
            winners, 1,
            "invariant 1: round {round}: {winners} of {CONTENDERS} concurrent claims of one key won"
        );
    }
}

/// Invariant 2: the same key in two scopes addresses two records.
pub async fn scopes_are_isolated<S: IdempotencyStore + ?Sized>(store: Arc<S>) {
    let (alice, bob, k) = (scope("alice"), scope("bob"), key());
    let fp = fingerprint("same request");
    let t_alice = must_claim(&*store, &alice, &k, &fp, LONG).await;
    assert_eq!(
        get(&*store, &bob, &k).await,
        None,
        "invariant 2: bob sees alice's record"
    );
    let t_bob = must_claim(&*store, &bob, &k, &fp, LONG).await;
    let secret = response(201, b"{\"owner\":\"alice\"}");
    assert_eq!(
        complete(&*store, &alice, &k, t_alice, &secret, LONG).await,
        FenceOutcome::Applied
    );
    assert!(
        matches!(
            get(&*store, &bob, &k).await,
            Some(Record {
                state: RecordState::InFlight { .. },
                ..
            })
        ),
        "invariant 2: alice's completion changed bob's record"
    );
    assert_eq!(
        complete(&*store, &bob, &k, t_alice, &secret, LONG).await,
        FenceOutcome::Stale,
        "invariant 2: alice's token completed bob's record"
    );
    assert_eq!(
        release(&*store, &bob, &k, t_bob).await,
        FenceOutcome::Applied
    );
    assert_eq!(completed_response(get(&*store, &alice, &k).await), secret);
}

/// Keys and scopes with quotes, backslashes, braces, colons, SQL and Lua fragments are stored
/// and addressed exactly, and never collide with their look-alikes.
pub async fn hostile_keys_and_scopes_round_trip<S: IdempotencyStore + ?Sized>(store: Arc<S>) {
    let base = scope("hostile");
    let scopes = [
        format!("{base}:'; DROP TABLE idempotency_keys; --"),
        format!("{base}:{{slot}}:\"q\"\\"),
        format!("{base}:{{slot}}:\"q\"\\ "),
        format!("{base}:ユーザー ]] redis.call('FLUSHALL') --[["),
        format!("{base}:%7B%7D"),
    ];
    let keys = [
        r#"'";--\{}:*?[]"#,
        "{a}:b",
        "{a}:b:",
        "%00%0d%0a",
        "redis.call('DEL',KEYS[1])",
    ];
    let fp = fingerprint("hostile");
    let mut written = Vec::new();
    for (i, raw_scope) in scopes.iter().enumerate() {
        let s = Scope::new(raw_scope.clone()).expect("no control characters");
        for (j, raw_key) in keys.iter().enumerate() {
            let k = IdempotencyKey::parse(raw_key.as_bytes(), KeyFormat::opaque())
                .expect("visible ASCII key");
            assert_eq!(k.as_str(), *raw_key);
            let token = must_claim(&*store, &s, &k, &fp, LONG).await;
            let body = Bytes::from(format!("{i}/{j}"));
            let stored = StoredResponse::new(StatusCode::OK, HeaderMap::new(), body);
            assert_eq!(
                complete(&*store, &s, &k, token, &stored, LONG).await,
                FenceOutcome::Applied
            );
            written.push((s.clone(), k, stored));
        }
    }
    for (s, k, stored) in written {
        assert_eq!(
            completed_response(get(&*store, &s, &k).await),
            stored,
            "invariant 2: {s:?}/{k:?} read another record"
        );
    }
}
