//! Replays: byte for byte, whatever the body; a different request never replays (invariants 3 and 4).

use super::*;

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
            state: RecordState::Completed { response, .. },
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
            match record.state {
                RecordState::Completed { response, .. } => {
                    assert_eq!(response, stored, "invariant 4: the stored response changed")
                }
                other => panic!("invariant 4: the completed record became {other:?}"),
            }
        }
        ClaimOutcome::Claimed => panic!("invariant 4: a different request took a completed key"),
    }
    assert_eq!(completed_response(get(&*store, &s, &k).await), stored);
}
