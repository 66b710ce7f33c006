//! The answers the layer gives by itself (refusals): what each one says, and how it is written
//! (RFC 9457 problem+json by default, Stripe's error envelope in the Stripe profile, or your
//! own renderer).

use crate::body::{IdempotencyBody, full};
use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use idempotency_core::KeyError;
use std::sync::Arc;
use std::time::Duration;

/// Which wire conventions the layer follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Profile {
    /// The IETF draft (`draft-ietf-httpapi-idempotency-key-header`): a key reused with another
    /// request is `422 Unprocessable Content`.
    #[default]
    Ietf,
    /// Stripe's API: a key reused with another request is `400` with code `idempotency_error`,
    /// an in-flight duplicate is `409` with code `idempotency_key_in_use`.
    Stripe,
}

/// Which refusal the layer makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RefusalKind {
    /// A covered request without a key (400).
    KeyMissing,
    /// A malformed key (400).
    KeyInvalid,
    /// Two key headers (400).
    KeyRepeated,
    /// No authenticated principal to scope the key (401).
    ScopeMissing,
    /// The authenticated principal cannot form a scope (401).
    ScopeInvalid,
    /// The same request is still running (409, `Retry-After`).
    InFlight,
    /// The key was used with a different request (422; Stripe profile 400).
    Mismatch,
    /// The request body is over the limit (413).
    BodyTooLarge,
    /// The request body could not be read (400).
    BodyUnreadable,
    /// The request body did not arrive within the read deadline (408).
    BodyTimeout,
    /// The store could not be reached (503, `Retry-After`).
    StoreUnavailable,
    /// The caller may not start new keys for now: it holds its share of the store, or used its
    /// new keys of the window (429, `Retry-After`); its existing keys still replay.
    ScopeFull,
    /// The layer holds as many request bodies as it may at once (503, `Retry-After`).
    Busy,
    /// The handler panicked or its response body failed (500).
    HandlerFailed,
    /// The request's transaction did not commit, so none of its writes exist: retry with the
    /// same key (503, `Retry-After`).
    NotCommitted,
    /// The request's `COMMIT` was not confirmed (a timeout or a lost connection), so its writes
    /// may or may not exist: retry with the same key to learn the outcome (503,
    /// `Retry-After`).
    OutcomeUnknown,
    /// The handler ended or kept its transaction itself (500).
    TransactionMisused,
    /// A handler asked for a transaction the request does not have (500).
    TransactionUnavailable,
}

/// A refusal: its kind and status, a stable slug (`key-reused`) and code
/// (`idempotency_key_reused`), a title and a detail for people, and, for 409 and 503, how long to
/// wait before retrying. A [renderer](crate::IdempotencyLayerBuilder::render_refusals) turns it
/// into a response; the layer adds `Retry-After` if the renderer did not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    kind: RefusalKind,
    status: StatusCode,
    slug: &'static str,
    title: &'static str,
    detail: String,
    code: &'static str,
    retry_after: Option<Duration>,
}

impl Refusal {
    /// Which refusal.
    pub fn kind(&self) -> RefusalKind {
        self.kind
    }
    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        self.status
    }
    /// A stable, URL-safe name (`key-missing`, `in-flight`, ...): the problem `type` ends with it.
    pub fn slug(&self) -> &'static str {
        self.slug
    }
    /// A short summary for people.
    pub fn title(&self) -> &'static str {
        self.title
    }
    /// What happened and what to do, for people.
    pub fn detail(&self) -> &str {
        &self.detail
    }
    /// A stable code for programs (`idempotency_key_reused`, ...).
    pub fn code(&self) -> &'static str {
        self.code
    }
    /// How long the client should wait before retrying, for 409 and 503.
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }
}

/// Writes a refusal as a response (see
/// [`render_refusals`](crate::IdempotencyLayerBuilder::render_refusals)).
pub type RenderRefusal = Arc<dyn Fn(&Refusal) -> Response<Bytes> + Send + Sync>;

/// A refusal as RFC 9457 `application/problem+json`:
/// `{"type": "<type_base><slug>", "title", "status", "detail", "code"}`.
pub fn problem_json(refusal: &Refusal, type_base: &str) -> Response<Bytes> {
    let body = serde_json::json!({
        "type": format!("{type_base}{}", refusal.slug),
        "title": refusal.title,
        "status": refusal.status.as_u16(),
        "detail": refusal.detail,
        "code": refusal.code,
    });
    json_response(refusal.status, "application/problem+json", body)
}

/// A refusal in Stripe's error envelope:
/// `{"error": {"type": "idempotency_error", "code", "message"}}` (`invalid_request_error` for
/// refusals that are not about the key, `api_error` for 5xx).
pub fn stripe_error(refusal: &Refusal) -> Response<Bytes> {
    let kind = match refusal.kind {
        RefusalKind::KeyMissing
        | RefusalKind::KeyInvalid
        | RefusalKind::KeyRepeated
        | RefusalKind::InFlight
        | RefusalKind::Mismatch => "idempotency_error",
        _ if refusal.status.is_server_error() => "api_error",
        _ => "invalid_request_error",
    };
    let body = serde_json::json!({
        "error": {
            "type": kind,
            "code": refusal.code,
            "message": refusal.detail,
        }
    });
    let mut response = json_response(refusal.status, "application/json", body);
    // Stripe's own hint to its SDKs: a duplicate in flight, or the store or commit failing,
    // is worth retrying (with the same key) after `Retry-After`.
    if refusal.retry_after.is_some() {
        response
            .headers_mut()
            .insert("stripe-should-retry", HeaderValue::from_static("true"));
    }
    response
}

fn json_response(
    status: StatusCode,
    content_type: &'static str,
    body: serde_json::Value,
) -> Response<Bytes> {
    let mut response = Response::new(Bytes::from(body.to_string()));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

/// Seconds for `Retry-After`, rounded up, at least 1.
pub(crate) fn retry_after_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0).max(u64::from(d.is_zero()))
}

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
                "The request's transaction was ended by its handler",
                "The handler rolled back, ended or kept its idempotency transaction itself, so its changes and its response could not be tied together. Retry with the same Idempotency-Key: a rolled-back request runs again at once; otherwise the key stays claimed until its lease runs out.".into(),
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

/// Renders `refusal` with `render`, adding `Retry-After` when the renderer did not.
pub(crate) fn render(refusal: &Refusal, render: &RenderRefusal) -> Response<IdempotencyBody> {
    let mut response = render(refusal);
    if let Some(d) = refusal.retry_after
        && !response.headers().contains_key(header::RETRY_AFTER)
    {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(retry_after_secs(d)));
    }
    response.map(full)
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

#[cfg(test)]
mod tests;
