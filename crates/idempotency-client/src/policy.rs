//! Which answers a client sends again with the same key, and after how long: the protocol's
//! rules, as pure functions of the answer (unit-tested here, and through a server in
//! `tests/retry_classes.rs`).

use http::{HeaderMap, HeaderName, StatusCode, header};
use std::time::{Duration, SystemTime};

/// The header that marks a replayed answer (the IETF draft's servers, Stripe, this library).
pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// The header this library's server puts on every answer it makes by itself (never on a
/// handler's, first or replayed): a `409` that carries it is a duplicate in flight, not a
/// stored business conflict.
pub const IDEMPOTENCY_REFUSAL: HeaderName = HeaderName::from_static("idempotency-refusal");

/// Stripe's explicit retry advice, which its own SDKs obey before anything else.
pub const STRIPE_SHOULD_RETRY: HeaderName = HeaderName::from_static("stripe-should-retry");

/// The server's dialect.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Profile {
    /// The IETF draft (`draft-ietf-httpapi-idempotency-key-header`), as this library's server
    /// speaks it: a `409` is retried only when it says it is the key's, not the handler's
    /// (`Idempotency-Refusal` or `Retry-After`).
    #[default]
    Ietf,
    /// Stripe's API: `Stripe-Should-Retry` decides when present; otherwise a `409` (another
    /// request with the key in progress) is retried as its SDKs do.
    Stripe,
}

/// What to do with an answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The key's answer, or the caller's to handle: hand it over.
    Final,
    /// Send the request again with the same key, no sooner than `after` when the server said
    /// (`Retry-After`).
    Retry {
        /// The server's `Retry-After`, when it gave one.
        after: Option<Duration>,
    },
}

/// The rule for an answer with `status` and `headers` under `profile`:
///
/// - a replay (`Idempotent-Replayed`) is the key's answer, whatever its status: final;
/// - `Stripe-Should-Retry` (Stripe profile) decides when present;
/// - `409`: retried when it is the key's (in flight): with `Idempotency-Refusal` or
///   `Retry-After` (IETF), always (Stripe); a business `409` is final;
/// - `429`, `503` (the server's own "not now": store unavailable, outcome unknown, busy) and a
///   proxy's `502` and `504`: retried;
/// - everything else (`2xx`, `400`, `401`, `403`, `404`, `422`, `500`, ...): final.
pub fn classify(profile: Profile, status: StatusCode, headers: &HeaderMap) -> Verdict {
    if headers.contains_key(IDEMPOTENT_REPLAYED) {
        return Verdict::Final;
    }
    let after = retry_after(headers, SystemTime::now());
    let retry = Verdict::Retry { after };
    if profile == Profile::Stripe
        && let Some(advice) = headers.get(STRIPE_SHOULD_RETRY)
    {
        return match advice.as_bytes() {
            b"true" => retry,
            _ => Verdict::Final,
        };
    }
    match status {
        StatusCode::CONFLICT => {
            let the_keys = match profile {
                Profile::Ietf => {
                    headers.contains_key(IDEMPOTENCY_REFUSAL)
                        || headers.contains_key(header::RETRY_AFTER)
                }
                Profile::Stripe => true,
            };
            if the_keys { retry } else { Verdict::Final }
        }
        StatusCode::TOO_MANY_REQUESTS
        | StatusCode::SERVICE_UNAVAILABLE
        | StatusCode::BAD_GATEWAY
        | StatusCode::GATEWAY_TIMEOUT => retry,
        _ => Verdict::Final,
    }
}

/// `Retry-After` as a wait from `now`: delta-seconds or an HTTP-date (RFC 9110 §10.2.3); a
/// date in the past is no wait; a value that is neither is ignored.
pub fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let value = headers.get(header::RETRY_AFTER)?.to_str().ok()?.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let date = httpdate::parse_http_date(value).ok()?;
    Some(date.duration_since(now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, HeaderValue::from_static(value));
        }
        map
    }

    fn verdict(profile: Profile, status: u16, pairs: &[(&'static str, &'static str)]) -> Verdict {
        classify(
            profile,
            StatusCode::from_u16(status).unwrap(),
            &headers(pairs),
        )
    }

    #[test]
    fn the_keys_own_not_now_is_retried_and_nothing_else() {
        let retried = |status, pairs: &[(&'static str, &'static str)]| {
            matches!(verdict(Profile::Ietf, status, pairs), Verdict::Retry { .. })
        };
        assert!(retried(409, &[("idempotency-refusal", "in-flight")]));
        assert!(retried(409, &[("retry-after", "1")]));
        assert!(!retried(409, &[]), "a business 409");
        for status in [429, 503, 502, 504] {
            assert!(retried(status, &[]), "{status}");
        }
        for status in [200, 201, 204, 400, 401, 403, 404, 422, 500] {
            assert!(!retried(status, &[]), "{status}");
        }
        for status in [409, 503, 429] {
            assert!(
                !retried(
                    status,
                    &[("idempotent-replayed", "true"), ("retry-after", "1")]
                ),
                "a replayed {status} is the key's answer"
            );
        }
    }

    #[test]
    fn stripe_advice_decides_and_its_409_is_retried() {
        assert_eq!(
            verdict(Profile::Stripe, 409, &[("stripe-should-retry", "false")]),
            Verdict::Final
        );
        assert!(matches!(
            verdict(Profile::Stripe, 409, &[]),
            Verdict::Retry { .. }
        ));
        assert!(matches!(
            verdict(Profile::Stripe, 500, &[("stripe-should-retry", "true")]),
            Verdict::Retry { .. }
        ));
        assert_eq!(verdict(Profile::Stripe, 400, &[]), Verdict::Final);
    }

    #[test]
    fn retry_after_reads_seconds_and_dates() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        assert_eq!(
            retry_after(&headers(&[("retry-after", "3")]), now),
            Some(Duration::from_secs(3))
        );
        let later = httpdate::fmt_http_date(now + Duration::from_secs(5));
        let mut map = HeaderMap::new();
        map.insert(header::RETRY_AFTER, HeaderValue::from_str(&later).unwrap());
        assert_eq!(retry_after(&map, now), Some(Duration::from_secs(5)));
        let earlier = httpdate::fmt_http_date(now - Duration::from_secs(5));
        map.insert(
            header::RETRY_AFTER,
            HeaderValue::from_str(&earlier).unwrap(),
        );
        assert_eq!(retry_after(&map, now), Some(Duration::ZERO));
        assert_eq!(retry_after(&headers(&[("retry-after", "soon")]), now), None);
        assert_eq!(retry_after(&HeaderMap::new(), now), None);
    }
}
