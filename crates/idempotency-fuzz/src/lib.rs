//! What the fuzz targets check, one function per target: each takes the fuzzer's bytes, feeds
//! them to one of the parsers a client or a store controls the input of, and panics when a
//! property breaks (a panic in the code under test is a failure too). The cargo-fuzz targets in
//! `fuzz/` call these functions; `tests/corpus.rs` replays the committed corpus and the
//! regression inputs through them on the stable toolchain, inside `cargo test`.
//!
//! ```
//! // Every function takes any bytes and returns only if the properties hold.
//! idempotency_fuzz::key(b"\"a\\\"b\"");
//! idempotency_fuzz::stored_response(b"IDR\x01");
//! idempotency_fuzz::json_fingerprint(br#"{"b": [1, 2.50, "\u00e9"], "a": null}"#);
//! idempotency_fuzz::refusals(b"\x00key\n{}");
//! ```

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, StatusCode};
use http_body_util::BodyExt;
use idempotency_core::{
    BodyCanonicalization, FingerprintAlgorithm, FingerprintSpec, IdempotencyKey, KeyFormat,
    StoredResponse,
};
use idempotency_tower::{IdempotencyLayer, Profile};
use tower::ServiceExt;

/// The key parser (`Idempotency-Key`, bare or as a structured-field string), in both formats:
/// an accepted key is 1 to 255 visible ASCII bytes, and its quoted form (what a client following
/// the IETF draft sends) parses back to the same key; `UuidV4` keys are lowercase hyphenated
/// version 4 UUIDs and parse back from their own text.
pub fn key(data: &[u8]) {
    for format in [KeyFormat::opaque(), KeyFormat::UuidV4] {
        let Ok(key) = IdempotencyKey::parse(data, format) else {
            continue;
        };
        let text = key.as_str();
        assert!(
            (1..=idempotency_core::MAX_KEY_LEN).contains(&text.len()),
            "{format:?}: a key of {} bytes accepted",
            text.len()
        );
        assert!(
            text.bytes().all(|b| b.is_ascii_graphic()),
            "{format:?}: {text:?} accepted with a byte that is not visible ASCII"
        );
        let mut quoted = Vec::with_capacity(text.len() + 2);
        quoted.push(b'"');
        for byte in text.bytes() {
            if byte == b'"' || byte == b'\\' {
                quoted.push(b'\\');
            }
            quoted.push(byte);
        }
        quoted.push(b'"');
        assert_eq!(
            IdempotencyKey::parse(&quoted, format).as_ref(),
            Ok(&key),
            "{format:?}: the quoted form of {text:?} names another key"
        );
        if format == KeyFormat::UuidV4 {
            let hyphens: Vec<usize> = text.match_indices('-').map(|(at, _)| at).collect();
            assert!(
                text.len() == 36
                    && hyphens == [8, 13, 18, 23]
                    && text.as_bytes()[14] == b'4'
                    && !text.bytes().any(|b| b.is_ascii_uppercase()),
                "a UUID key is stored as a lowercase hyphenated version 4 UUID: {text:?}"
            );
            assert_eq!(
                IdempotencyKey::parse(text.as_bytes(), format).as_ref(),
                Ok(&key)
            );
        }
    }
}

/// The decoder of stored records (a store's bytes, which a damaged or forged row controls):
/// never a panic; what it accepts encodes to bytes it decodes to the same response, and those
/// bytes are a fixed point.
pub fn stored_response(data: &[u8]) {
    let Ok(decoded) = StoredResponse::decode(Bytes::copy_from_slice(data)) else {
        return;
    };
    let encoded = decoded.encode();
    assert_eq!(
        encoded.len(),
        decoded.encoded_len(),
        "encoded_len is the encoding's length"
    );
    let again = match StoredResponse::decode(encoded.clone()) {
        Ok(again) => again,
        Err(error) => panic!("a decoded response encodes to bytes that do not decode: {error}"),
    };
    assert_eq!(again.status(), decoded.status());
    assert_eq!(again.headers(), decoded.headers());
    assert_eq!(again.body(), decoded.body());
    assert_eq!(again.body_omitted(), decoded.body_omitted());
    assert_eq!(again.encode(), encoded, "the encoding is a fixed point");
}

/// The canonical JSON fingerprint (a client's body): never a panic, the same fingerprint for the
/// same request, and, for a body that was read as JSON, the same fingerprint when white space is
/// added between its tokens (what a client that re-serialises its document on retry may do).
pub fn json_fingerprint(data: &[u8]) {
    let spec = FingerprintSpec::new().body(BodyCanonicalization::Json);
    let mut headers = HeaderMap::new();
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    let first = spec.fingerprint("POST", "/orders", &headers, data);
    assert_eq!(
        first,
        spec.fingerprint("POST", "/orders", &headers, data),
        "deterministic"
    );
    if first.algorithm() != FingerprintAlgorithm::Sha256CanonicalJson {
        return;
    }
    let spaced = spaced_out(data);
    let second = spec.fingerprint("POST", "/orders", &headers, &spaced);
    assert_eq!(
        second,
        first,
        "white space between tokens changed the fingerprint of {:?} (spaced: {:?})",
        String::from_utf8_lossy(data),
        String::from_utf8_lossy(&spaced)
    );
    // Projections never panic either, whatever the document.
    if let Ok(projected) = FingerprintSpec::new().ignore_json("/a/0") {
        projected.fingerprint("POST", "/orders", &headers, data);
    }
}

/// `json` with white space after every structural character outside strings.
fn spaced_out(json: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(json.len() * 2 + 2);
    out.extend_from_slice(b" \n");
    let (mut in_string, mut escaped) = (false, false);
    for &byte in json {
        out.push(byte);
        if in_string {
            match (escaped, byte) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
        } else if byte == b'"' {
            in_string = true;
        } else if matches!(byte, b'{' | b'}' | b'[' | b']' | b',' | b':') {
            out.extend_from_slice(b" \t\r\n ");
        }
    }
    out.extend_from_slice(b"\r\n");
    out
}

/// The refusals a request can provoke, through the layer on the memory store: the first byte
/// picks the profile (bit 0: Stripe), whether the body is declared JSON (bit 1) and whether a
/// second request repeats the key with another body (bit 2); the bytes up to the first newline
/// are the key header's value, the rest the body. Every answer the layer makes itself carries
/// `Idempotency-Refusal` and a JSON body: problem+json whose `status` is the response's and
/// whose `type` ends with the slug (IETF), or Stripe's envelope with its `type` and `code`
/// (Stripe). The handler's own answer carries no such header.
pub fn refusals(data: &[u8]) {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let profile = if flags & 1 == 1 {
        Profile::Stripe
    } else {
        Profile::Ietf
    };
    let (key, body) = match rest.iter().position(|&b| b == b'\n') {
        Some(at) => (&rest[..at], &rest[at + 1..]),
        None => (rest, &[][..]),
    };
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
    else {
        return;
    };
    runtime.block_on(async {
        let layer = match IdempotencyLayer::builder(idempotency_memory::MemoryStore::default())
            .unscoped()
            .profile(profile)
            .build()
        {
            Ok(layer) => layer,
            Err(error) => panic!("the default settings are refused: {error}"),
        };
        let app = axum::Router::new()
            .route(
                "/orders",
                axum::routing::post(|| async { (StatusCode::CREATED, "created") }),
            )
            .layer(layer);
        let mut bodies = vec![Bytes::copy_from_slice(body)];
        if flags & 4 == 4 {
            let mut other = body.to_vec();
            other.push(b' ');
            other.push(b'x');
            bodies.push(Bytes::from(other));
        }
        for body in bodies {
            let mut request = Request::builder().method(Method::POST).uri("/orders");
            if let Ok(value) = HeaderValue::from_bytes(key) {
                request = request.header("idempotency-key", value);
            }
            if flags & 2 == 2 {
                request = request.header("content-type", "application/json");
            }
            let Ok(request) = request.body(axum::body::Body::from(body)) else {
                return;
            };
            let response = match app.clone().oneshot(request).await {
                Ok(response) => response,
                Err(never) => match never {},
            };
            check_answer(profile, response).await;
        }
    });
}

async fn check_answer(profile: Profile, response: http::Response<axum::body::Body>) {
    let (parts, body) = response.into_parts();
    let body = match body.collect().await {
        Ok(body) => body.to_bytes(),
        Err(error) => panic!("the answer's body failed: {error}"),
    };
    let Some(slug) = parts.headers.get(idempotency_core::IDEMPOTENCY_REFUSAL) else {
        assert_eq!(
            parts.status,
            StatusCode::CREATED,
            "only the handler answers without a slug"
        );
        assert_eq!(&body[..], b"created");
        return;
    };
    let slug = match slug.to_str() {
        Ok(slug) => slug.to_owned(),
        Err(_) => panic!("a refusal slug that is not visible ASCII: {slug:?}"),
    };
    let json: serde_json::Value = match serde_json::from_slice(&body) {
        Ok(json) => json,
        Err(error) => panic!(
            "the refusal {slug} is not JSON ({error}): {:?}",
            String::from_utf8_lossy(&body)
        ),
    };
    match profile {
        Profile::Ietf => {
            assert_eq!(
                parts
                    .headers
                    .get(http::header::CONTENT_TYPE)
                    .map(HeaderValue::as_bytes),
                Some(&b"application/problem+json"[..])
            );
            assert_eq!(
                json["status"].as_u64(),
                Some(u64::from(parts.status.as_u16())),
                "{json}"
            );
            let problem_type = json["type"].as_str().unwrap_or_default();
            assert!(
                problem_type.ends_with(&slug),
                "type {problem_type} for slug {slug}"
            );
            assert!(
                json["title"].is_string() && json["detail"].is_string(),
                "{json}"
            );
        }
        _ => {
            let kind = json["error"]["type"].as_str().unwrap_or_default();
            assert!(
                ["idempotency_error", "invalid_request_error", "api_error"].contains(&kind),
                "Stripe error type {kind:?}: {json}"
            );
            assert!(json["error"]["code"].is_string() && json["error"]["message"].is_string());
        }
    }
    assert!(
        parts.status.is_client_error() || parts.status.is_server_error(),
        "a refusal answered {}",
        parts.status
    );
}
