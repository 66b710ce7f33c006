//! The cases. Each takes the store under test and panics with a message naming the violated
//! invariant (numbered as in the [`IdempotencyStore`] docs).

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode, header};
use idempotency_core::{
    Begin, BodyCanonicalization, ClaimOutcome, Completion, Engine, EngineConfig, FenceOutcome,
    Fingerprint, IdempotencyKey, IdempotencyStore, KeyFormat, LeaseToken, Record, RecordState,
    Scope, StorePolicy, StoredResponse,
};
use std::sync::Arc;
use std::time::Duration;

/// A lease long enough never to run out during a case.
const LONG: Duration = Duration::from_secs(300);
/// A lease or retention short enough to run out during a case.
const SHORT: Duration = Duration::from_millis(400);
/// How long to wait for a SHORT period to have passed by every store's clock.
const PAST_SHORT: Duration = Duration::from_millis(1200);

fn scope(case: &str) -> Scope {
    Scope::new(format!("conformance:{case}:{}", uuid::Uuid::new_v4()))
        .expect("a generated scope is valid")
}

fn key() -> IdempotencyKey {
    IdempotencyKey::parse(
        uuid::Uuid::new_v4().to_string().as_bytes(),
        KeyFormat::UuidV4,
    )
    .expect("a generated UUID v4 is a valid key")
}

fn fingerprint(body: &str) -> Fingerprint {
    Fingerprint::of_request("POST", "/tasks", body.as_bytes(), BodyCanonicalization::Raw)
}

fn response(status: u16, body: &'static [u8]) -> StoredResponse {
    let mut headers = HeaderMap::new();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    StoredResponse::new(
        StatusCode::from_u16(status).expect("valid status"),
        headers,
        Bytes::from_static(body),
    )
}

async fn claim<S: IdempotencyStore + ?Sized>(
    store: &S,
    scope: &Scope,
    key: &IdempotencyKey,
    fp: &Fingerprint,
    token: LeaseToken,
    lease: Duration,
) -> ClaimOutcome {
    store
        .claim(scope, key, fp, token, lease)
        .await
        .expect("invariant 8: claim must not fail against a healthy store")
}

async fn must_claim<S: IdempotencyStore + ?Sized>(
    store: &S,
    scope: &Scope,
    key: &IdempotencyKey,
    fp: &Fingerprint,
    lease: Duration,
) -> LeaseToken {
    let token = LeaseToken::new();
    let outcome = claim(store, scope, key, fp, token, lease).await;
    assert_eq!(
        outcome,
        ClaimOutcome::Claimed,
        "a free key must be claimable"
    );
    token
}

async fn get<S: IdempotencyStore + ?Sized>(
    store: &S,
    scope: &Scope,
    key: &IdempotencyKey,
) -> Option<Record> {
    store
        .get(scope, key)
        .await
        .expect("invariant 8: get must not fail against a healthy store")
}

async fn complete<S: IdempotencyStore + ?Sized>(
    store: &S,
    scope: &Scope,
    key: &IdempotencyKey,
    token: LeaseToken,
    response: &StoredResponse,
    retention: Duration,
) -> FenceOutcome {
    store
        .complete(scope, key, token, response, retention)
        .await
        .expect("invariant 8: complete must not fail against a healthy store")
}

async fn release<S: IdempotencyStore + ?Sized>(
    store: &S,
    scope: &Scope,
    key: &IdempotencyKey,
    token: LeaseToken,
) -> FenceOutcome {
    store
        .release(scope, key, token)
        .await
        .expect("invariant 8: release must not fail against a healthy store")
}

fn completed_response(record: Option<Record>) -> StoredResponse {
    match record {
        Some(Record {
            state: RecordState::Completed { response },
            ..
        }) => response,
        other => panic!("expected a completed record, got {other:?}"),
    }
}

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

/// Invariant 3: status, repeated headers in order, and every byte value of the body.
pub async fn replay_is_byte_exact<S: IdempotencyStore + ?Sized>(store: Arc<S>) {
    let (s, k, fp) = (scope("exact"), key(), fingerprint("a"));
    let token = must_claim(&*store, &s, &k, &fp, LONG).await;
    let mut headers = HeaderMap::new();
    headers.insert(header::LOCATION, HeaderValue::from_static("/tasks/0b7c"));
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    headers.append("x-repeated", HeaderValue::from_static("first"));
    headers.append("x-repeated", HeaderValue::from_static("second, with comma"));
    headers.append("x-repeated", HeaderValue::from_static("third"));
    headers.insert(
        "x-opaque",
        HeaderValue::from_bytes(&[b'a', 0x80, 0xff, b' ', b'"']).expect("obs-text is valid"),
    );
    let body: Vec<u8> = (0..=255u8).chain((0..=255u8).rev()).collect();
    let stored = StoredResponse::new(StatusCode::CREATED, headers, Bytes::from(body));
    assert_eq!(
        complete(&*store, &s, &k, token, &stored, LONG).await,
        FenceOutcome::Applied
    );
    let replay = completed_response(get(&*store, &s, &k).await);
    assert_eq!(
        replay, stored,
        "invariant 3: the replay differs from what was stored"
    );
    let repeated: Vec<_> = replay.headers().get_all("x-repeated").iter().collect();
    assert_eq!(repeated, ["first", "second, with comma", "third"]);
    match claim(&*store, &s, &k, &fp, LeaseToken::new(), LONG).await {
        ClaimOutcome::Existing(Record {
            state: RecordState::Completed { response },
            ..
        }) => assert_eq!(response, stored, "invariant 3: claim returned other bytes"),
        other => panic!("a completed key must not be claimed again, got {other:?}"),
    }
}

/// Invariant 3 for a 1 MiB body.
pub async fn large_body_round_trips<S: IdempotencyStore + ?Sized>(store: Arc<S>) {
    let (s, k, fp) = (scope("large"), key(), fingerprint("a"));
    let token = must_claim(&*store, &s, &k, &fp, LONG).await;
    let body: Vec<u8> = (0..1024 * 1024)
        .map(|i: u32| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    let stored = StoredResponse::new(StatusCode::OK, HeaderMap::new(), Bytes::from(body));
    assert_eq!(
        complete(&*store, &s, &k, token, &stored, LONG).await,
        FenceOutcome::Applied
    );
    let replay = completed_response(get(&*store, &s, &k).await);
    assert_eq!(replay.body().len(), 1024 * 1024);
    assert!(
        replay == stored,
        "invariant 3: the 1 MiB body changed in the store"
    );
}

/// Invariant 3 at the edges: an empty body, and a record whose body was omitted.
pub async fn empty_and_omitted_bodies_round_trip<S: IdempotencyStore + ?Sized>(store: Arc<S>) {
    let s = scope("edges");
    let fp = fingerprint("a");
    let empty = StoredResponse::new(StatusCode::NO_CONTENT, HeaderMap::new(), Bytes::new());
    let mut headers = HeaderMap::new();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("video/mp4"));
    let omitted = StoredResponse::capture_without_body(StatusCode::OK, &headers);
    for stored in [empty, omitted] {
        let k = key();
        let token = must_claim(&*store, &s, &k, &fp, LONG).await;
        assert_eq!(
            complete(&*store, &s, &k, token, &stored, LONG).await,
            FenceOutcome::Applied
        );
        assert_eq!(completed_response(get(&*store, &s, &k).await), stored);
    }
}

/// Invariant 4: another fingerprint never gets the record's response and never changes it,
/// while in flight or completed.
pub async fn different_fingerprint_never_replays_nor_overwrites<S: IdempotencyStore + ?Sized>(
    store: Arc<S>,
) {
    let (s, k) = (scope("mismatch"), key());
    let (fp_a, fp_b) = (fingerprint("request A"), fingerprint("request B"));
    let token = must_claim(&*store, &s, &k, &fp_a, LONG).await;
    match claim(&*store, &s, &k, &fp_b, LeaseToken::new(), LONG).await {
        ClaimOutcome::Existing(record) => assert_eq!(
            record.fingerprint, fp_a,
            "invariant 4: the in-flight record's fingerprint was overwritten"
        ),
        ClaimOutcome::Claimed => panic!("invariant 4: a different request took a held key"),
    }
    let stored = response(201, b"{\"request\":\"A\"}");
    assert_eq!(
        complete(&*store, &s, &k, token, &stored, LONG).await,
        FenceOutcome::Applied,
        "a mismatched claim must not disturb the holder"
    );
    match claim(&*store, &s, &k, &fp_b, LeaseToken::new(), LONG).await {
        ClaimOutcome::Existing(record) => {
            assert_eq!(
                record.fingerprint, fp_a,
                "invariant 4: fingerprint overwritten"
            );
            assert_eq!(
                record.state,
                RecordState::Completed {
                    response: stored.clone()
                },
                "invariant 4: the stored response changed"
            );
        }
        ClaimOutcome::Claimed => panic!("invariant 4: a different request took a completed key"),
    }
    assert_eq!(completed_response(get(&*store, &s, &k).await), stored);
}

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

fn engine<S: IdempotencyStore + ?Sized + 'static>(
    store: Arc<S>,
    config: EngineConfig,
) -> Engine<Arc<S>> {
    Engine::new(store, config)
}

/// The engine over this store: the first request proceeds, its retry replays, a concurrent
/// duplicate is told it is in flight, and a different request is refused.
pub async fn engine_runs_a_request_once_and_replays_it<S: IdempotencyStore + ?Sized + 'static>(
    store: Arc<S>,
) {
    let engine = engine(store, EngineConfig::default());
    let (s, k, fp) = (scope("engine"), key(), fingerprint("a"));
    let Begin::Proceed(guard) = engine.begin(s.clone(), k.clone(), fp).await.expect("begin") else {
        panic!("a fresh key must proceed")
    };
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

/// A guard dropped without completing (a panic, a cancelled request) frees the key.
pub async fn engine_dropped_guard_releases_the_key<S: IdempotencyStore + ?Sized + 'static>(
    store: Arc<S>,
) {
    let engine = engine(store, EngineConfig::default());
    let (s, k, fp) = (scope("drop"), key(), fingerprint("a"));
    let Begin::Proceed(guard) = engine.begin(s.clone(), k.clone(), fp).await.expect("begin") else {
        panic!("a fresh key must proceed")
    };
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
        EngineConfig::default().with_store_policy(StorePolicy::standard()),
    );
    let (s, k, fp) = (scope("5xx"), key(), fingerprint("a"));
    let Begin::Proceed(guard) = engine.begin(s.clone(), k.clone(), fp).await.expect("begin") else {
        panic!("a fresh key must proceed")
    };
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
            .with_lease(Duration::from_millis(1500))
            .with_heartbeat(true),
    );
    let (s, k, fp) = (scope("heartbeat"), key(), fingerprint("a"));
    let Begin::Proceed(guard) = engine.begin(s.clone(), k.clone(), fp).await.expect("begin") else {
        panic!("a fresh key must proceed")
    };
    // The guard's heartbeat runs on its own task from the claim until the response is stored.
    let slow = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(4000)).await;
        assert!(
            guard.lease().is_held(),
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
        EngineConfig::default().with_in_flight_wait(Duration::from_secs(10)),
    );
    let (s, k, fp) = (scope("wait"), key(), fingerprint("a"));
    let Begin::Proceed(guard) = engine.begin(s.clone(), k.clone(), fp).await.expect("begin") else {
        panic!("a fresh key must proceed")
    };
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
    use crate::faults::{Fault, FaultyStore, Op};
    let faulty = FaultyStore::new(store);
    let engine = Engine::new(faulty.clone(), EngineConfig::default().with_lease(LONG));
    let (s, k, fp) = (scope("deferred"), key(), fingerprint("a"));
    let Begin::Proceed(guard) = engine.begin(s.clone(), k.clone(), fp).await.expect("begin") else {
        panic!("a fresh key must proceed")
    };
    faulty.set(Op::Complete, Fault::Fail);
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
    faulty.clear(Op::Complete);
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
