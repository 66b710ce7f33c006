//! The answers that are the key's, not the handler's: a stored response replayed, and what a
//! request answers when its key turned out another's.

use super::{Problem, RETRY_AFTER, Refused, answer, refuse};
use crate::body::{IdempotencyBody, full};
use crate::config::Shared;
use crate::route::{Outcome, Route};
use http::{HeaderValue, Response};
use idempotency_core::protocol::Answer;
use idempotency_core::{
    Completion, IDEMPOTENCY_KEY_EXPIRES, IDEMPOTENCY_ORIGINAL_DATE, Replayed, Superseded,
};
use std::time::SystemTime;

/// What a request answers when its key turned out another's as its guard ended: a duplicate
/// completed first (its writes rolled back), or, in the speculative mode, the key's lookup
/// found it taken (the handler's statements were refused).
/// Counted under that answer's outcome too (the request already counts as `executed`: its
/// handler ran), which the span then shows.
pub(super) fn superseded<S>(
    shared: &Shared<S>,
    route: &Route,
    superseded: Superseded,
) -> Response<IdempotencyBody> {
    match superseded {
        Superseded::Replay(stored) => {
            Outcome::Replayed.record(route);
            replay(stored, &shared.settings.replay_header)
        }
        Superseded::Mismatch => {
            refuse(shared, route, Refused(Problem::Mismatch, Outcome::Mismatch))
        }
        Superseded::InFlight { retry_after } => refuse(
            shared,
            route,
            Refused(Problem::InFlight { retry_after }, Outcome::Conflict),
        ),
        // A cause this version does not know: the retry finds out.
        _ => answer(
            shared,
            Problem::InFlight {
                retry_after: RETRY_AFTER,
            },
        ),
    }
}

/// What the client of a request that ran is answered, as core decides it
/// ([`Completion::answer`]): `None` for the handler's own response, otherwise the key's
/// answer. A request whose key turned out another's ([`Completion::Superseded`]) is counted
/// under that answer's outcome too ([`superseded`]).
pub(super) fn after_completion<S>(
    shared: &Shared<S>,
    route: &Route,
    completion: Completion,
) -> Option<Response<IdempotencyBody>> {
    if let Completion::Superseded(other) = completion {
        return Some(superseded(shared, route, other));
    }
    let problem = match completion.answer() {
        Answer::HandlerResponse => return None,
        Answer::Replay(stored) => return Some(replay(stored, &shared.settings.replay_header)),
        Answer::Mismatch => Problem::Mismatch,
        Answer::InFlight { retry_after } => Problem::InFlight { retry_after },
        Answer::NotCommitted => Problem::NotCommitted {
            retry_after: RETRY_AFTER,
        },
        Answer::OutcomeUnknown => Problem::OutcomeUnknown {
            retry_after: RETRY_AFTER,
        },
        Answer::TransactionMisused => Problem::TransactionMisused,
        // An answer this version does not know: the retry finds out.
        _ => Problem::InFlight {
            retry_after: RETRY_AFTER,
        },
    };
    Some(answer(shared, problem))
}

/// The stored response, byte for byte, marked as a replay, with when its key was first
/// answered (`Idempotency-Original-Date`) and when it expires (`Idempotency-Key-Expires`).
pub(super) fn replay(replayed: Replayed, marker: &http::HeaderName) -> Response<IdempotencyBody> {
    let (answered, expires) = replayed.dates();
    let (original_date, key_expires) = (http_date(answered), http_date(expires));
    let stored = replayed.into_response();
    let omitted = stored.body_omitted();
    let (status, headers, body) = stored.into_parts();
    let mut response = Response::new(full(body));
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    let headers = response.headers_mut();
    headers.insert(marker.clone(), HeaderValue::from_static("true"));
    headers.insert(IDEMPOTENCY_ORIGINAL_DATE, original_date);
    headers.insert(IDEMPOTENCY_KEY_EXPIRES, key_expires);
    if omitted {
        headers.insert(
            http::HeaderName::from_static("idempotent-replay-body"),
            HeaderValue::from_static("omitted"),
        );
    }
    response
}

/// `time` as an HTTP-date (RFC 9110 §5.6.7, IMF-fixdate), to the second.
pub(crate) fn http_date(time: SystemTime) -> HeaderValue {
    // Always 29 ASCII characters, so always a valid value; the String becomes its bytes
    // without a copy.
    HeaderValue::try_from(httpdate::fmt_http_date(time))
        .unwrap_or_else(|_| HeaderValue::from_static("Thu, 01 Jan 1970 00:00:00 GMT"))
}
