//! Which of a handler's responses are stored: the handler's own opt-outs ([`NotStored`],
//! `Cache-Control: no-store`) and the statuses a framework answers with before a handler runs,
//! unless the handler marked its answer [`Final`].

use http::{StatusCode, header};

/// Put in a response's extensions to keep it from being stored, the way `Cache-Control:
/// no-store` on the response does: the key is released and the request's transaction rolled
/// back, so the client's retry with the same key runs again. For answers the client is expected
/// to fix and resend with the same key (a validation error, say). In axum, return
/// `(Extension(NotStored), ...)` among the response's parts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NotStored;

/// Put in a response's extensions to say that the handler produced it after it began its work,
/// so the layer stores it even with a status a framework rejects requests with before the
/// handler runs (400, 404, 405, 411, 413, 415, 422 by default; see
/// [`rejection_statuses`](crate::IdempotencyLayerBuilder::rejection_statuses)). For a handler
/// that changed something and then answers one of those: its retry must replay, not run again.
/// In axum, return `(Extension(Final), StatusCode::UNPROCESSABLE_ENTITY, ...)`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Final;

/// Whether the response has a status a framework answers with before the handler runs, and the
/// handler did not mark it [`Final`].
pub(super) fn rejected_before_the_handler(
    parts: &http::response::Parts,
    statuses: &[StatusCode],
) -> bool {
    statuses.contains(&parts.status) && parts.extensions.get::<Final>().is_none()
}

/// Whether the handler asked for its response not to be stored.
pub(super) fn opted_out(parts: &http::response::Parts) -> bool {
    parts.extensions.get::<NotStored>().is_some()
        || parts
            .headers
            .get_all(header::CACHE_CONTROL)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|directive| directive.trim().eq_ignore_ascii_case("no-store"))
}
