//! Tests of `fingerprint`.

/// Records stored before fingerprints could be configured must still match: the default
/// spec digests exactly what the first version did.
#[test]
fn the_default_spec_keeps_the_first_versions_digest() {
    use sha2::{Digest, Sha256};
    let (method, path, body) = ("POST", "/tasks?x=1", br#"{"b":1,"a":2}"#.as_slice());
    let canonical = br#"{"a":2,"b":1}"#;
    let mut first = Sha256::new();
    first.update(b"idempotency-fingerprint-v1");
    first.update([FingerprintAlgorithm::Sha256CanonicalJson as u8]);
    for part in [method.as_bytes(), path.as_bytes(), canonical] {
        first.update((part.len() as u64).to_be_bytes());
        first.update(part);
    }
    let digest: [u8; 32] = first.finalize().into();
    let now = Fingerprint::of_request(method, path, body, BodyCanonicalization::Json);
    assert_eq!(now.digest(), &digest);
    let spec = FingerprintSpec::new().fingerprint(method, path, &http::HeaderMap::new(), body);
    assert_eq!(spec, now);
}

#[test]
fn a_spec_counts_its_headers_and_projections() {
    let mut v1 = http::HeaderMap::new();
    v1.insert("api-version", "1".parse().unwrap());
    let mut v2 = http::HeaderMap::new();
    v2.insert("api-version", "2".parse().unwrap());
    let none = http::HeaderMap::new();
    let body = br#"{"item":"tea","sent_at":1}"#;
    let plain = FingerprintSpec::new();
    let versioned = FingerprintSpec::new().header(http::HeaderName::from_static("api-version"));
    assert_eq!(
        plain.fingerprint("POST", "/o", &v1, body),
        plain.fingerprint("POST", "/o", &v2, body)
    );
    assert_ne!(
        versioned.fingerprint("POST", "/o", &v1, body),
        versioned.fingerprint("POST", "/o", &v2, body)
    );
    assert_ne!(
        versioned.fingerprint("POST", "/o", &v1, body),
        versioned.fingerprint("POST", "/o", &none, body)
    );
    assert_ne!(
        versioned.fingerprint("POST", "/o", &none, body),
        plain.fingerprint("POST", "/o", &none, body)
    );
    let ignoring = FingerprintSpec::new().ignore_json("/sent_at").unwrap();
    let later = br#"{"sent_at":2, "item":"tea"}"#;
    assert_eq!(
        ignoring.fingerprint("POST", "/o", &none, body),
        ignoring.fingerprint("POST", "/o", &none, later)
    );
    assert_ne!(
        plain.fingerprint("POST", "/o", &none, body),
        plain.fingerprint("POST", "/o", &none, later)
    );
    let other_item = br#"{"item":"coffee","sent_at":1}"#;
    assert_ne!(
        ignoring.fingerprint("POST", "/o", &none, body),
        ignoring.fingerprint("POST", "/o", &none, other_item)
    );
    let keeping = FingerprintSpec::new().keep_json("/item").unwrap();
    assert_eq!(
        keeping.fingerprint("POST", "/o", &none, body),
        keeping.fingerprint("POST", "/o", &none, later)
    );
    assert!(FingerprintSpec::new().ignore_json("sent_at").is_err());
}

use super::*;
use BodyCanonicalization::{Json, Raw};

#[test]
fn every_part_counts() {
    let base = Fingerprint::of_request("POST", "/tasks", b"{}", Raw);
    assert_ne!(base, Fingerprint::of_request("PATCH", "/tasks", b"{}", Raw));
    assert_ne!(
        base,
        Fingerprint::of_request("POST", "/tasks?x=1", b"{}", Raw)
    );
    assert_ne!(base, Fingerprint::of_request("POST", "/tasks", b"{ }", Raw));
    assert_eq!(base, Fingerprint::of_request("POST", "/tasks", b"{}", Raw));
    assert_ne!(
        Fingerprint::of_request("PO", "ST/x", b"", Raw),
        Fingerprint::of_request("POST", "/x", b"", Raw)
    );
}

#[test]
fn json_mode_ignores_key_order_and_white_space_only() {
    let a = Fingerprint::of_request("POST", "/t", br#"{"a":1,"b":[1,2]}"#, Json);
    let b = Fingerprint::of_request("POST", "/t", b"{ \"b\": [1, 2],\n \"a\": 1 }", Json);
    let c = Fingerprint::of_request("POST", "/t", br#"{"a":1,"b":[2,1]}"#, Json);
    assert_eq!(a, b);
    assert_ne!(a, c);
    assert_eq!(a.algorithm(), FingerprintAlgorithm::Sha256CanonicalJson);
    let not_json = Fingerprint::of_request("POST", "/t", b"a=1", Json);
    assert_eq!(not_json.algorithm(), FingerprintAlgorithm::Sha256Raw);
    assert_eq!(not_json, Fingerprint::of_request("POST", "/t", b"a=1", Raw));
}

/// Issue 28 item 5: the same bytes sent as another media type are another request, and a
/// header's values cannot move to the next header without changing the digest.
#[test]
fn a_body_declared_not_json_is_not_read_as_json() {
    let spec = FingerprintSpec::new();
    let body = br#"{"a":1}"#;
    let with = |content_type: &str| {
        let mut headers = http::HeaderMap::new();
        headers.insert(http::header::CONTENT_TYPE, content_type.parse().unwrap());
        spec.fingerprint("POST", "/t", &headers, body)
    };
    let json = with("application/json");
    assert_eq!(json.algorithm(), FingerprintAlgorithm::Sha256CanonicalJson);
    assert_eq!(json, with("application/json; charset=utf-8"));
    assert_eq!(json, with("Application/JSON"));
    assert_eq!(json, with("application/merge-patch+json"));
    // No Content-Type: read as JSON, as before.
    assert_eq!(
        json,
        spec.fingerprint("POST", "/t", &http::HeaderMap::new(), body)
    );
    for other in [
        "text/plain",
        "application/x-www-form-urlencoded",
        "application/jsonx",
        "json",
    ] {
        let fingerprint = with(other);
        assert_eq!(
            fingerprint.algorithm(),
            FingerprintAlgorithm::Sha256Raw,
            "{other}"
        );
        assert_ne!(fingerprint, json, "{other}");
    }
}

#[test]
fn header_values_cannot_move_between_headers() {
    let (a, b) = (
        http::HeaderName::from_static("x-a"),
        http::HeaderName::from_static("x-b"),
    );
    let spec = FingerprintSpec::new().header(a.clone()).header(b.clone());
    let mut first = http::HeaderMap::new();
    first.append(&a, "v".parse().unwrap());
    first.append(&a, "header".parse().unwrap());
    first.append(&a, "x-b".parse().unwrap());
    let mut second = http::HeaderMap::new();
    second.append(&a, "v".parse().unwrap());
    second.append(&b, "header".parse().unwrap());
    second.append(&b, "x-b".parse().unwrap());
    assert_ne!(
        spec.fingerprint("POST", "/t", &first, b""),
        spec.fingerprint("POST", "/t", &second, b"")
    );
}

#[test]
fn stored_form_round_trips_and_rejects_garbage() {
    let fp = Fingerprint::of_request("POST", "/t", b"x", Json);
    assert_eq!(Fingerprint::from_bytes(&fp.to_bytes()), Ok(fp));
    assert!(Fingerprint::from_bytes(&[]).is_err());
    assert!(Fingerprint::from_bytes(&[9; 33]).is_err());
    assert!(Fingerprint::from_bytes(&[1; 32]).is_err());
}
