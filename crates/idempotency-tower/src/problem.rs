//! RFC 9457 `application/problem+json` answers for every refusal the layer makes.

use crate::body::{IdempotencyBody, full};
use crate::config::Profile;
use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use idempotency_core::KeyError;
use std::time::Duration;

/// Every problem the layer answers with. Its `type` URI is the configured base followed by the
/// slug, e.g. `urn:idempotency:problem:key-missing`; the slugs are stable.
#[derive(Debug)]
pub(crate) enum Problem {
    KeyMissing,
    KeyInvalid(KeyError),
    KeyRepeated,
    ScopeMissing,
    InFlight {
        retry_after: Duration,
    },
    Mismatch,
    BodyTooLarge {
        limit: usize,
    },
    BodyUnreadable,
    StoreUnavailable {
        retry_after: Duration,
    },
    /// The handler panicked, or its response body failed.
    HandlerFailed,
    /// The request's transaction did not commit: none of its writes exist.
    NotCommitted {
        retry_after: Duration,
    },
    /// The handler ended (or kept) the request's transaction itself.
    TransactionMisused,
    /// A handler asked for a transaction the request does not have.
    #[cfg_attr(not(feature = "axum"), allow(dead_code))]
    TransactionUnavailable,
}

/// Seconds for `Retry-After`, rounded up, at least 1.
pub(crate) fn retry_after_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0).max(u64::from(d.is_zero()))
}

impl Problem {
    fn parts(
        &self,
        profile: Profile,
    ) -> (StatusCode, &'static str, &'static str, String, &'static str) {
        match self {
            Problem::KeyMissing => (
                StatusCode::BAD_REQUEST,
                "key-missing",
                "Idempotency-Key is missing",
                "This operation requires an Idempotency-Key header.".into(),
                "idempotency_key_missing",
            ),
            Problem::KeyInvalid(e) => (
                StatusCode::BAD_REQUEST,
                "key-invalid",
                "Idempotency-Key is invalid",
                format!("{e}."),
                "idempotency_key_invalid",
            ),
            Problem::KeyRepeated => (
                StatusCode::BAD_REQUEST,
                "key-repeated",
                "Idempotency-Key is repeated",
                "Send exactly one Idempotency-Key header.".into(),
                "idempotency_key_invalid",
            ),
            Problem::ScopeMissing => (
                StatusCode::UNAUTHORIZED,
                "scope-missing",
                "No authenticated principal",
                "Idempotency keys are scoped per caller, and this request has no authenticated caller.".into(),
                "idempotency_scope_missing",
            ),
            Problem::InFlight { .. } => (
                StatusCode::CONFLICT,
                "in-flight",
                "A request is outstanding for this Idempotency-Key",
                "The first request with this key is still running; retry after the time in Retry-After.".into(),
                match profile {
                    Profile::Ietf => "idempotency_key_in_flight",
                    Profile::Stripe => "idempotency_key_in_use",
                },
            ),
            Problem::Mismatch => (
                match profile {
                    Profile::Ietf => StatusCode::UNPROCESSABLE_ENTITY,
                    Profile::Stripe => StatusCode::BAD_REQUEST,
                },
                "key-reused",
                "Idempotency-Key is already used",
                "This key was used with a different request (method, path or body); keys can only be reused with the same request.".into(),
                match profile {
                    Profile::Ietf => "idempotency_key_reused",
                    Profile::Stripe => "idempotency_error",
                },
            ),
            Problem::BodyTooLarge { limit } => (
                StatusCode::PAYLOAD_TOO_LARGE,
                "body-too-large",
                "Request body too large",
                format!("Requests with an Idempotency-Key may carry at most {limit} bytes."),
                "request_body_too_large",
            ),
            Problem::BodyUnreadable => (
                StatusCode::BAD_REQUEST,
                "body-unreadable",
                "Request body could not be read",
                "The request body ended early or could not be read.".into(),
                "request_body_unreadable",
            ),
            Problem::StoreUnavailable { .. } => (
                StatusCode::SERVICE_UNAVAILABLE,
                "store-unavailable",
                "Idempotency store unavailable",
                "The request was not run because its idempotency could not be guaranteed; retry later.".into(),
                "idempotency_store_unavailable",
            ),
            Problem::NotCommitted { .. } => (
                StatusCode::SERVICE_UNAVAILABLE,
                "not-committed",
                "The request's changes were not committed",
                "The request ran, but its changes could not be committed together with its idempotency record, so none of them were kept; retry later.".into(),
                "idempotency_not_committed",
            ),
            Problem::TransactionMisused => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "transaction-misused",
                "The request's transaction was ended by its handler",
                "The handler ended or kept its idempotency transaction itself, so its changes and its response could not be tied together; the key stays claimed until its lease runs out.".into(),
                "idempotency_transaction_misused",
            ),
            Problem::TransactionUnavailable => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "transaction-unavailable",
                "The request has no idempotency transaction",
                "The handler needs an idempotency transaction, but this route is not covered by the idempotency layer or its store is not transactional.".into(),
                "idempotency_transaction_unavailable",
            ),
            Problem::HandlerFailed => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "handler-failed",
                "The request failed",
                "The request failed before it produced a response; its key was released, so a retry runs it again.".into(),
                "handler_failed",
            ),
        }
    }

    /// The problem's response.
    pub(crate) fn into_response(
        self,
        profile: Profile,
        type_base: &str,
    ) -> Response<IdempotencyBody> {
        let (status, slug, title, detail, code) = self.parts(profile);
        let body = serde_json::json!({
            "type": format!("{type_base}{slug}"),
            "title": title,
            "status": status.as_u16(),
            "detail": detail,
            "code": code,
        });
        let mut response = Response::new(full(Bytes::from(body.to_string())));
        *response.status_mut() = status;
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        let retry_after = match self {
            Problem::InFlight { retry_after }
            | Problem::StoreUnavailable { retry_after }
            | Problem::NotCommitted { retry_after } => Some(retry_after),
            _ => None,
        };
        if let Some(d) = retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(retry_after_secs(d)));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1000)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1001)), 2);
        assert_eq!(retry_after_secs(Duration::from_secs(59)), 59);
    }
}
