//! The answers the layer gives by itself (refusals): what each one says, and how it is written
//! (RFC 9457 problem+json by default, Stripe's error envelope in the Stripe profile, or your
//! own renderer).

use crate::body::{IdempotencyBody, full};
use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
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
    /// The store's call failed while every connection of its pool was in use: the database may
    /// be fine, the application's requests hold the connections (503 `store-busy`,
    /// `Retry-After`).
    StoreBusy,
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

/// Renders `refusal` with `render`, marked as the library's answer
/// ([`IDEMPOTENCY_REFUSAL`](idempotency_core::IDEMPOTENCY_REFUSAL): its slug), adding
/// `Retry-After` when the renderer did not.
pub(crate) fn render(refusal: &Refusal, render: &RenderRefusal) -> Response<IdempotencyBody> {
    let mut response = render(refusal);
    response.headers_mut().insert(
        idempotency_core::IDEMPOTENCY_REFUSAL,
        HeaderValue::from_static(refusal.slug),
    );
    if let Some(d) = refusal.retry_after
        && !response.headers().contains_key(header::RETRY_AFTER)
    {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(retry_after_secs(d)));
    }
    response.map(full)
}

mod problem;
pub(crate) use problem::{LibraryRefusal, Problem};

#[cfg(test)]
mod tests;
