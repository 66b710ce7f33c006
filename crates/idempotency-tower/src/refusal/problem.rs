//! Every refusal the layer makes ([`Problem`]) and what each one says: its status, type, title,
//! detail and `Retry-After`, under each profile.

use super::{Profile, Refusal, RefusalKind};
use http::StatusCode;
use idempotency_core::KeyError;
use std::time::Duration;

/// Put in the extensions of a response the library made inside the handler (a [`TxRejection`]'s):
/// the layer never stores such a response as the key's result (it releases the key, so the
/// retry runs), and renders it again with its own profile and renderer.
///
/// [`TxRejection`]: crate::TxRejection
#[derive(Clone, Debug)]
#[cfg_attr(not(feature = "axum"), allow(dead_code))]
pub(crate) struct LibraryRefusal(pub(crate) Problem);

/// Every refusal the layer makes, with what it needs to say.
#[derive(Clone, Debug)]
pub(crate) enum Problem {
    KeyMissing,
    KeyInvalid(KeyError),
    KeyRepeated,
    ScopeMissing,
    ScopeInvalid,
    InFlight {
        retry_after: Duration,
    },
    Mismatch,
    BodyTooLarge {
        limit: usize,
    },
    BodyUnreadable,
    BodyTimeout {
        deadline: Duration,
    },
    StoreUnavailable {
        retry_after: Duration,
    },
    /// The store's call failed while every connection of its pool was in use.
    StoreBusy {
        retry_after: Duration,
    },
    ScopeFull {
        retry_after: Duration,
    },
    Busy {
        retry_after: Duration,
    },
    HandlerFailed,
    NotCommitted {
        retry_after: Duration,
    },
    OutcomeUnknown {
        retry_after: Duration,
    },
    TransactionMisused,
    #[cfg_attr(not(feature = "axum"), allow(dead_code))]
    TransactionUnavailable,
}

impl Problem {
    /// The refusal this problem makes under `profile`.
    pub(crate) fn refusal(self, profile: Profile) -> Refusal {
        let retry_after = match &self {
            Problem::InFlight { retry_after }
            | Problem::StoreUnavailable { retry_after }
            | Problem::StoreBusy { retry_after }
            | Problem::ScopeFull { retry_after }
            | Problem::Busy { retry_after }
            | Problem::NotCommitted { retry_after }
            | Problem::OutcomeUnknown { retry_after } => Some(*retry_after),
            _ => None,
        };
        let kind = match &self {
            Problem::KeyMissing => RefusalKind::KeyMissing,
            Problem::KeyInvalid(_) => RefusalKind::KeyInvalid,
            Problem::KeyRepeated => RefusalKind::KeyRepeated,
            Problem::ScopeMissing => RefusalKind::ScopeMissing,
            Problem::ScopeInvalid => RefusalKind::ScopeInvalid,
            Problem::InFlight { .. } => RefusalKind::InFlight,
            Problem::Mismatch => RefusalKind::Mismatch,
            Problem::BodyTooLarge { .. } => RefusalKind::BodyTooLarge,
            Problem::BodyUnreadable => RefusalKind::BodyUnreadable,
            Problem::BodyTimeout { .. } => RefusalKind::BodyTimeout,
            Problem::StoreUnavailable { .. } => RefusalKind::StoreUnavailable,
            Problem::StoreBusy { .. } => RefusalKind::StoreBusy,
            Problem::ScopeFull { .. } => RefusalKind::ScopeFull,
            Problem::Busy { .. } => RefusalKind::Busy,
            Problem::HandlerFailed => RefusalKind::HandlerFailed,
            Problem::NotCommitted { .. } => RefusalKind::NotCommitted,
            Problem::OutcomeUnknown { .. } => RefusalKind::OutcomeUnknown,
            Problem::TransactionMisused => RefusalKind::TransactionMisused,
            Problem::TransactionUnavailable => RefusalKind::TransactionUnavailable,
        };
        let (status, slug, title, detail, code) = self.parts(profile);
        Refusal {
            kind,
            status,
            slug,
            title,
            detail,
            code,
            retry_after,
        }
    }

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
                sentence(e),
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
            Problem::ScopeInvalid => (
                StatusCode::UNAUTHORIZED,
                "scope-invalid",
                "Unusable authenticated principal",
                "Idempotency keys are scoped per caller, and this request's caller cannot be used as a scope.".into(),
                "idempotency_scope_invalid",
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
            Problem::BodyTimeout { deadline } => (
                StatusCode::REQUEST_TIMEOUT,
                "body-timeout",
                "Request body too slow",
                format!(
                    "The request body did not arrive within {} ms; nothing ran, send it again.",
                    deadline.as_millis()
                ),
                "request_body_timeout",
            ),
            Problem::StoreUnavailable { .. } => (
                StatusCode::SERVICE_UNAVAILABLE,
                "store-unavailable",
                "Idempotency store unavailable",
                "The request was not run because its idempotency could not be guaranteed; retry later.".into(),
                "idempotency_store_unavailable",
            ),
            Problem::StoreBusy { .. } => (
                StatusCode::SERVICE_UNAVAILABLE,
                "store-busy",
                "Idempotency store busy",
                "The idempotency store's connections, or its places for request transactions, were all in use (the application's own requests hold them, or wait on each other's locks), so the request could not be checked in time and was not run; retry after the time in Retry-After.".into(),
                "idempotency_store_busy",
            ),
            Problem::ScopeFull { .. } => (
                StatusCode::TOO_MANY_REQUESTS,
                "scope-full",
                "Too many stored requests for this caller",
                "This caller's requests hold their whole share of the idempotency store; new keys are refused until some of them expire (retry after the time in Retry-After). Keys already used still replay.".into(),
                match profile {
                    Profile::Ietf => "idempotency_scope_full",
                    Profile::Stripe => "rate_limit",
                },
            ),
            Problem::Busy { .. } => (
                StatusCode::SERVICE_UNAVAILABLE,
                "busy",
                "Too many request bodies in flight",
                "The server holds as many request bodies as it allows at once; nothing ran, retry after the time in Retry-After.".into(),
                "server_busy",
            ),
            Problem::NotCommitted { .. } => (
                StatusCode::SERVICE_UNAVAILABLE,
                "not-committed",
                "The request's changes were not committed",
                "The request ran, but the database refused to commit its changes together with its idempotency record, so none of them exist. Retry with the same Idempotency-Key: the retry runs the request.".into(),
                "idempotency_not_committed",
            ),
            Problem::OutcomeUnknown { .. } => (
                StatusCode::SERVICE_UNAVAILABLE,
                "outcome-unknown",
                "The request's outcome is unknown",
                "The request ran, but the database did not confirm its commit (it timed out or the connection dropped while committing), so its changes may or may not exist. Retry with the same Idempotency-Key to learn the outcome, never with a new one: if the commit happened, the retry replays its answer; if not, it runs the request.".into(),
                "idempotency_outcome_unknown",
            ),
            Problem::TransactionMisused => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "transaction-misused",
                "The request's transaction was misused by its handler",
                "The handler ended its idempotency transaction itself, kept it after returning, or asked for it while it already held it, so its changes and its response could not be tied together. Retry with the same Idempotency-Key: a request whose transaction rolled back runs again at once; one whose handler kept it waits until its lease runs out.".into(),
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
}

/// An error's message as a sentence for a problem's `detail`, like every other detail: its first
/// letter capitalised and a full stop at the end (`the idempotency key is empty` becomes
/// `The idempotency key is empty.`).
fn sentence(error: &dyn std::fmt::Display) -> String {
    let text = error.to_string();
    let mut chars = text.chars();
    let mut out = String::with_capacity(text.len() + 1);
    if let Some(first) = chars.next() {
        out.extend(first.to_uppercase());
        out.push_str(chars.as_str());
    }
    if !out.ends_with('.') {
        out.push('.');
    }
    out
}
