//! Hostile input at scale: key parsing, fingerprinting (JSON canonicalisation included) and the
//! stored-response decoder never panic, whatever the bytes, and stay within their contracts.
//!
//! CI runs 2,000 cases per property; `HOSTILE_INPUT_CASES=20000 cargo test -p idempotency-core
//! --test hostile_input` runs them at scale (about 2.5 minutes in a debug build here).

use bytes::Bytes;
use idempotency_core::{
    BodyCanonicalization, Fingerprint, IdempotencyKey, KeyFormat, StoredResponse,
};
use proptest::prelude::*;

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("HOSTILE_INPUT_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(2_000),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// JSON-ish bytes: mostly structural characters, so the canonicaliser's deep paths are hit.
fn jsonish() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(
        prop_oneof![
            Just(b'{'),
            Just(b'}'),
            Just(b'['),
            Just(b']'),
            Just(b'"'),
            Just(b':'),
            Just(b','),
            Just(b'\\'),
            Just(b'u'),
            Just(b'd'),
            Just(b'8'),
            Just(b'0'),
            Just(b'-'),
            Just(b'.'),
            Just(b'e'),
            Just(b' '),
            Just(b'n'),
            any::<u8>(),
        ],
        0..200,
    )
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn key_parsing_never_panics(raw in proptest::collection::vec(any::<u8>(), 0..400)) {
        for format in [KeyFormat::UuidV4, KeyFormat::opaque(), KeyFormat::opaque_with_max_len(16)] {
            if let Ok(key) = IdempotencyKey::parse(&raw, format) {
                prop_assert!(key.as_str().bytes().all(|b| b.is_ascii_graphic()));
            }
        }
    }

    #[test]
    fn fingerprinting_never_panics_and_is_deterministic(body in jsonish(), path in "[ -~]{0,40}") {
        let a = Fingerprint::of_request("POST", &path, &body, BodyCanonicalization::Json);
        let b = Fingerprint::of_request("POST", &path, &body, BodyCanonicalization::Json);
        prop_assert_eq!(a, b);
        prop_assert_eq!(Fingerprint::from_bytes(&a.to_bytes()), Ok(a));
    }

    #[test]
    fn decoder_never_panics_on_corrupt_records(raw in proptest::collection::vec(any::<u8>(), 0..600)) {
        let _ = StoredResponse::decode(Bytes::from(raw.clone()));
        let mut framed = b"IDR\x01".to_vec();
        framed.extend_from_slice(&raw);
        let _ = StoredResponse::decode(Bytes::from(framed));
    }

    #[test]
    fn flipping_any_byte_of_a_record_is_caught_or_harmless(flip in 0usize..200, bit in 0u8..8) {
        let mut headers = idempotency_core::http::HeaderMap::new();
        headers.insert("location", "/tasks/1".parse().unwrap());
        let original = StoredResponse::new(idempotency_core::http::StatusCode::CREATED, headers, Bytes::from_static(b"{\"id\":1}"));
        let mut bytes = original.encode().to_vec();
        let i = flip % bytes.len();
        bytes[i] ^= 1 << bit;
        // A corrupted record decodes to an error or to some valid response; never a panic.
        if let Ok(decoded) = StoredResponse::decode(Bytes::from(bytes)) {
            prop_assert!(decoded.status().as_u16() >= 100);
        }
    }
}
