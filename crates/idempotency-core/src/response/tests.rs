//! Tests of `response`.

use super::*;
use proptest::prelude::*;

fn sample() -> StoredResponse {
    let mut headers = HeaderMap::new();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert(header::LOCATION, HeaderValue::from_static("/tasks/1"));
    headers.append("x-multi", HeaderValue::from_static("one"));
    headers.append("x-multi", HeaderValue::from_static("two"));
    StoredResponse::new(
        StatusCode::CREATED,
        headers,
        Bytes::from_static(b"{\"id\":1}"),
    )
}

#[test]
fn round_trips_repeated_headers_in_order() {
    let r = sample();
    let back = StoredResponse::decode(r.encode()).unwrap();
    assert_eq!(back, r);
    let multi: Vec<_> = back.headers().get_all("x-multi").iter().collect();
    assert_eq!(multi, ["one", "two"]);
}

#[test]
fn capture_drops_what_must_not_be_replayed() {
    let mut h = HeaderMap::new();
    h.insert(
        header::DATE,
        HeaderValue::from_static("Sun, 29 Nov 2026 10:00:00 GMT"),
    );
    h.insert(
        header::SET_COOKIE,
        HeaderValue::from_static("session=secret"),
    );
    h.insert(
        header::CONNECTION,
        HeaderValue::from_static("keep-alive, x-hop"),
    );
    h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
    h.insert("x-hop", HeaderValue::from_static("1"));
    h.insert(
        header::TRANSFER_ENCODING,
        HeaderValue::from_static("chunked"),
    );
    h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("2"));
    h.insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    h.insert(header::ETAG, HeaderValue::from_static("\"v1\""));
    h.insert(header::LOCATION, HeaderValue::from_static("/tasks/1"));
    // Per-request ids, trace context and auth challenges belong to the first request.
    for name in PER_REQUEST_HEADERS.iter().chain(&["www-authenticate"]) {
        h.insert(*name, HeaderValue::from_static("first-request"));
    }
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("private"));
    let r = StoredResponse::capture(StatusCode::CREATED, &h, Bytes::from_static(b"{}"));
    let names: Vec<_> = r.headers().keys().map(|k| k.as_str()).collect();
    assert_eq!(names, ["etag", "location", "cache-control"]);
}

#[test]
fn omitted_body_is_flagged_and_round_trips() {
    let mut h = HeaderMap::new();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    h.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
    let r = StoredResponse::capture_without_body(StatusCode::OK, &h);
    assert!(r.body_omitted());
    assert!(r.body().is_empty());
    assert!(r.headers().get(header::CONTENT_ENCODING).is_none());
    assert_eq!(StoredResponse::decode(r.encode()).unwrap(), r);
}

#[test]
fn corrupt_input_is_a_typed_error() {
    let good = sample().encode();
    assert_eq!(
        StoredResponse::decode(Bytes::new()),
        Err(DecodeError::Truncated)
    );
    assert_eq!(
        StoredResponse::decode(Bytes::from_static(b"XYZ\x01")),
        Err(DecodeError::BadMagic)
    );
    assert_eq!(
        StoredResponse::decode(Bytes::from_static(b"IDR\x07")),
        Err(DecodeError::UnsupportedVersion(7))
    );
    let mut trailing = good.to_vec();
    trailing.push(0);
    assert_eq!(
        StoredResponse::decode(trailing.into()),
        Err(DecodeError::TrailingBytes(1))
    );
    for cut in 0..good.len() {
        assert!(StoredResponse::decode(good.slice(..cut)).is_err());
    }
    // A huge header count must not allocate: it is refused as truncated.
    let mut bogus = b"IDR\x01\x00\xc8\x00".to_vec();
    bogus.extend_from_slice(&u32::MAX.to_be_bytes());
    assert_eq!(
        StoredResponse::decode(bogus.into()),
        Err(DecodeError::Truncated)
    );
}

fn arb_response() -> impl Strategy<Value = StoredResponse> {
    let header = (
        "x-[a-z0-9-]{1,20}",
        proptest::collection::vec(0x20u8..0x7f, 0..40),
    );
    (
        100u16..1000,
        proptest::collection::vec(header, 0..10),
        proptest::collection::vec(any::<u8>(), 0..2048),
        any::<bool>(),
    )
        .prop_map(|(status, headers, body, omitted)| {
            let mut map = HeaderMap::new();
            for (name, value) in headers {
                map.append(
                    HeaderName::from_bytes(name.as_bytes()).unwrap(),
                    HeaderValue::from_bytes(&value).unwrap(),
                );
            }
            let status = StatusCode::from_u16(status).unwrap();
            if omitted {
                StoredResponse::capture_without_body(status, &map)
            } else {
                StoredResponse::new(status, map, Bytes::from(body))
            }
        })
}

/// A record as large as the store allows, claiming more headers than a `HeaderMap` can
/// hold (2^15), and holding them: a typed error, not a panic in `with_capacity` or `append`.
#[test]
fn more_headers_than_a_header_map_holds_is_corrupt_not_a_panic() {
    for (claimed, present) in [(40_000u32, 0usize), (40_000, 40_000), (1 << 20, 0)] {
        let mut raw = b"IDR\x01".to_vec();
        raw.extend_from_slice(&201u16.to_be_bytes());
        raw.push(0);
        raw.extend_from_slice(&claimed.to_be_bytes());
        for i in 0..present {
            let name = format!("x-{i}");
            raw.extend_from_slice(&(name.len() as u16).to_be_bytes());
            raw.extend_from_slice(name.as_bytes());
            raw.extend_from_slice(&1u32.to_be_bytes());
            raw.push(b'v');
        }
        // Padding so that the count passes the "6 bytes per header" bound.
        raw.resize(raw.len().max(claimed as usize * 6 + 16), 0);
        let decoded = std::panic::catch_unwind(|| StoredResponse::decode(Bytes::from(raw)));
        assert!(
            matches!(decoded, Ok(Err(_))),
            "{claimed} headers claimed, {present} present: {decoded:?}"
        );
    }
}

/// An encoding with up to 40,000 header fields (past a header map's 2^15), whose counts
/// and lengths may lie, with bytes flipped anywhere.
fn arb_large_encoding() -> impl Strategy<Value = Vec<u8>> {
    (
        0u32..40_000,
        0usize..40_000,
        any::<u32>(),
        proptest::collection::vec((any::<usize>(), any::<u8>()), 0..8),
    )
        .prop_map(|(claimed, present, body_len, flips)| {
            let mut raw = b"IDR\x01".to_vec();
            raw.extend_from_slice(&200u16.to_be_bytes());
            raw.push(0);
            raw.extend_from_slice(&claimed.to_be_bytes());
            for i in 0..present {
                let name = format!("h{}", i % 64);
                raw.extend_from_slice(&(name.len() as u16).to_be_bytes());
                raw.extend_from_slice(name.as_bytes());
                raw.extend_from_slice(&2u32.to_be_bytes());
                raw.extend_from_slice(b"ok");
            }
            raw.extend_from_slice(&(body_len % 4096).to_be_bytes());
            raw.resize(raw.len() + (body_len % 4096) as usize, b'x');
            for (at, byte) in flips {
                let at = at % raw.len();
                raw[at] ^= byte;
            }
            raw
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn decoder_never_panics_on_large_input(raw in arb_large_encoding()) {
        let _ = StoredResponse::decode(Bytes::from(raw));
    }
}

proptest! {
    #[test]
    fn encoding_round_trips_any_response(r in arb_response()) {
        let encoded = r.encode();
        prop_assert_eq!(encoded.len(), r.encoded_len());
        prop_assert_eq!(StoredResponse::decode(encoded).unwrap(), r);
    }

    #[test]
    fn decoder_never_panics(raw in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = StoredResponse::decode(Bytes::from(raw.clone()));
        let mut prefixed = b"IDR\x01".to_vec();
        prefixed.extend_from_slice(&raw);
        let _ = StoredResponse::decode(Bytes::from(prefixed));
    }
}
