//! What the layer reads from a covered request before it claims the key: the key, the scope,
//! the body (within its limits and the budget of bodies held at once), and the URI the client sent.

use super::{RETRY_AFTER, Refused};
use crate::body::{BodyPermit, BoxError, ReadError, read_body};
use crate::config::{ScopeSource, Shared};
use crate::refusal::Problem;
use crate::route::Outcome;
use bytes::Bytes;
use http::header;
use http::request::Parts;
use http_body::Body;
use idempotency_core::{IdempotencyKey, Scope};

/// The request's key: `Ok(None)` when it has none and keys are optional.
pub(crate) fn read_key<S>(
    parts: &Parts,
    shared: &Shared<S>,
) -> Result<Option<IdempotencyKey>, Refused> {
    let settings = &shared.settings;
    if let Some(key_with) = &settings.key_with {
        return match key_with(parts) {
            None if settings.key_required => Err(Refused(Problem::KeyMissing, Outcome::KeyMissing)),
            None => Ok(None),
            Some(raw) => IdempotencyKey::parse(raw.as_bytes(), settings.key_format)
                .map(Some)
                .map_err(|e| Refused(Problem::KeyInvalid(e), Outcome::KeyInvalid)),
        };
    }
    let mut values = parts.headers.get_all(&settings.header).iter();
    match (values.next(), values.next()) {
        (None, _) if settings.key_required => {
            Err(Refused(Problem::KeyMissing, Outcome::KeyMissing))
        }
        (None, _) => Ok(None),
        (Some(_), Some(_)) => Err(Refused(Problem::KeyRepeated, Outcome::KeyInvalid)),
        (Some(value), None) => IdempotencyKey::parse(value.as_bytes(), settings.key_format)
            .map(Some)
            .map_err(|e| Refused(Problem::KeyInvalid(e), Outcome::KeyInvalid)),
    }
}

/// The request's scope, from the configured source.
pub(crate) fn read_scope<S>(parts: &Parts, shared: &Shared<S>) -> Result<Scope, Refused> {
    match &shared.scope {
        ScopeSource::Unscoped => Ok(Scope::unscoped()),
        ScopeSource::Extract(extract) => match extract(parts) {
            Ok(Some(scope)) => Ok(scope),
            Ok(None) => Err(Refused(Problem::ScopeMissing, Outcome::ScopeMissing)),
            Err(why) => {
                tracing::warn!(
                    why,
                    "the request's principal cannot form an idempotency scope: refused with 401"
                );
                Err(Refused(Problem::ScopeInvalid, Outcome::ScopeMissing))
            }
        },
    }
}

/// The whole request body, within the configured limit.
pub(super) async fn read_request_body<B, S>(
    parts: &Parts,
    body: B,
    shared: &Shared<S>,
) -> Result<(Bytes, BodyPermit), Refused>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    let limit = shared.settings.max_request_body;
    let too_large = || Refused(Problem::BodyTooLarge { limit }, Outcome::BodyTooLarge);
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        return Err(too_large());
    }
    let deadline = shared.settings.request_body_timeout;
    match tokio::time::timeout(deadline, read_body(body, limit, &shared.bodies)).await {
        Ok(read) => read.map_err(|e| match e {
            ReadError::TooLarge => too_large(),
            ReadError::Unreadable => Refused(Problem::BodyUnreadable, Outcome::BodyUnreadable),
            ReadError::Busy => Refused(
                Problem::Busy {
                    retry_after: RETRY_AFTER,
                },
                Outcome::Busy,
            ),
        }),
        // Counted with the bodies that could not be read.
        Err(_) => Err(Refused(
            Problem::BodyTimeout { deadline },
            Outcome::BodyUnreadable,
        )),
    }
}

/// The URI the client sent: under axum's `nest`, the request's own URI has the prefix stripped,
/// and the fingerprint must see the whole path.
pub(super) fn original_uri(parts: &Parts) -> &http::Uri {
    #[cfg(feature = "axum")]
    if let Some(original) = parts.extensions.get::<axum::extract::OriginalUri>() {
        return &original.0;
    }
    &parts.uri
}
