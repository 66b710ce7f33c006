//! The opt-in route that tells a caller what became of one of its keys
//! ([`IdempotencyLayer::key_status_service`]).

use crate::body::{IdempotencyBody, full};
use crate::config::Shared;
use crate::layer::IdempotencyLayer;
use crate::refusal::Problem;
use crate::service::{RETRY_AFTER, Refused, answer, read_key, read_scope, store_problem};
use futures_util::future::BoxFuture;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use idempotency_core::{IdempotencyStore, KeyStatus};
use std::convert::Infallible;
use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};
use tower_service::Service;

/// Answers `GET` with what became of the key in the request's `Idempotency-Key` header (or
/// wherever the layer reads keys), in the caller's own scope, read the way the layer reads
/// them: made by [`IdempotencyLayer::key_status_service`], mounted on a route of the
/// application's choosing.
///
/// | the key | `200 application/json` |
/// | --- | --- |
/// | never used, expired, or released (sent again, its request runs) | `{"state":"absent"}` |
/// | its request is running | `{"state":"in_flight","retry_after_seconds":1}` and `Retry-After` |
/// | answered | `{"state":"completed","status":201,"answered":"<HTTP-date>","expires":"<HTTP-date>"}` |
///
/// Never the stored body or headers: sending the request again with its key is what replays
/// them. A key of another caller reads as `absent`, byte for byte the answer for a key nobody
/// used, so one caller learns nothing of another's keys. A missing or malformed key is a `400`,
/// a request without a caller (no scope) a `401`, the store unavailable a `503`, rendered as the
/// layer renders its refusals; any method but `GET` and `HEAD` is a `405`. Every answer carries
/// `Cache-Control: no-store`.
///
/// In the one-transaction modes a running request's record exists only from its commit; until
/// then the key reads `in_flight` from the lock its open transaction holds
/// ([`KeyStatus::InTransaction`](idempotency_core::KeyStatus::InTransaction)).
pub struct KeyStatusService<S> {
    shared: Arc<Shared<S>>,
}

impl<S> Clone for KeyStatusService<S> {
    fn clone(&self) -> Self {
        KeyStatusService {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S: IdempotencyStore + 'static> fmt::Debug for KeyStatusService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyStatusService")
            .field("store", &self.shared.engine.store().backend())
            .finish_non_exhaustive()
    }
}

impl<S: IdempotencyStore + 'static> IdempotencyLayer<S> {
    /// A service that tells a caller what became of one of its keys, for a route of the
    /// application's own (see [`KeyStatusService`] for what it answers). It reads keys and
    /// scopes as this layer does, over the same engine: a client told `503 outcome-unknown`, or
    /// whose connection dropped, asks it instead of sending the request again.
    ///
    /// ```
    /// use axum::{Router, routing::post};
    /// use idempotency_core::Scope;
    /// use idempotency_memory::MemoryStore;
    /// use idempotency_tower::IdempotencyLayer;
    ///
    /// #[derive(Clone)]
    /// struct UserId(String); // inserted by your authentication layer
    ///
    /// impl TryFrom<UserId> for Scope {
    ///     type Error = idempotency_core::ScopeError;
    ///     fn try_from(user: UserId) -> Result<Scope, Self::Error> {
    ///         Scope::new(user.0)
    ///     }
    /// }
    ///
    /// # fn main() -> Result<(), idempotency_core::ConfigError> {
    /// let layer = IdempotencyLayer::builder(MemoryStore::default())
    ///     .scope_from_extension::<UserId>()
    ///     .build()?;
    /// let app: Router = Router::new()
    ///     .route("/orders", post(|| async { "created" }))
    ///     .route_layer(layer.clone())
    ///     // GET /idempotency-status with the key in `Idempotency-Key`; added after the layer,
    ///     // so not covered by it. Authentication goes over both (`.layer(..)` last).
    ///     .route_service("/idempotency-status", layer.key_status_service());
    /// # let _ = app; Ok(()) }
    /// ```
    pub fn key_status_service(&self) -> KeyStatusService<S> {
        KeyStatusService {
            shared: Arc::clone(self.shared()),
        }
    }
}

impl<S, B> Service<Request<B>> for KeyStatusService<S>
where
    S: IdempotencyStore + 'static,
    B: Send + 'static,
{
    type Response = Response<IdempotencyBody>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let shared = Arc::clone(&self.shared);
        Box::pin(async move { Ok(no_store(status(&shared, request).await)) })
    }
}

async fn status<S: IdempotencyStore + 'static, B>(
    shared: &Shared<S>,
    request: Request<B>,
) -> Response<IdempotencyBody> {
    if request.method() != Method::GET && request.method() != Method::HEAD {
        let mut response = Response::new(full(bytes::Bytes::new()));
        *response.status_mut() = StatusCode::METHOD_NOT_ALLOWED;
        response
            .headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
        return response;
    }
    let (parts, _body) = request.into_parts();
    let key = match read_key(&parts, shared) {
        Ok(Some(key)) => key,
        Ok(None) => return answer(shared, Problem::KeyMissing),
        Err(Refused(problem, _)) => return answer(shared, problem),
    };
    let scope = match read_scope(&parts, shared) {
        Ok(scope) => scope,
        Err(Refused(problem, _)) => return answer(shared, problem),
    };
    match shared.engine.status(&scope, &key).await {
        Ok(status) => json(&status),
        Err(error) => answer(shared, store_problem(shared, &error, RETRY_AFTER)),
    }
}

/// The status as JSON; an in-flight key's also says when to ask again in `Retry-After`.
fn json(status: &KeyStatus) -> Response<IdempotencyBody> {
    let mut retry_after = None;
    let body = match status {
        KeyStatus::InFlight {
            retry_after: after, ..
        }
        | KeyStatus::InTransaction { retry_after: after } => {
            let seconds = after.as_secs_f64().ceil().max(1.0) as u64;
            retry_after = Some(seconds);
            serde_json::json!({ "state": "in_flight", "retry_after_seconds": seconds })
        }
        KeyStatus::Completed { status: code, .. } => {
            let (answered, expires) = status
                .dates()
                .unwrap_or((std::time::UNIX_EPOCH, std::time::UNIX_EPOCH));
            serde_json::json!({
                "state": "completed",
                "status": code.as_u16(),
                "answered": httpdate::fmt_http_date(answered),
                "expires": httpdate::fmt_http_date(expires),
            })
        }
        // Absent, and any state a later version reports: the client sends the request again.
        _ => serde_json::json!({ "state": "absent" }),
    };
    let mut response = Response::new(full(body.to_string().into()));
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if let Some(seconds) = retry_after {
        headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
    }
    response
}

fn no_store(mut response: Response<IdempotencyBody>) -> Response<IdempotencyBody> {
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    async fn body(response: Response<IdempotencyBody>) -> (Option<HeaderValue>, serde_json::Value) {
        use http_body_util::BodyExt;
        let retry_after = response.headers().get(header::RETRY_AFTER).cloned();
        let bytes = response
            .into_body()
            .collect()
            .await
            .expect("a full body")
            .to_bytes();
        (
            retry_after,
            serde_json::from_slice(&bytes).expect("a JSON body"),
        )
    }

    #[tokio::test]
    async fn a_key_held_by_a_transaction_reads_in_flight_as_a_leased_one_does() {
        let leased = json(&KeyStatus::InFlight {
            lease_remaining: Duration::from_secs(30),
            retry_after: Duration::from_millis(1_000),
        });
        let in_transaction = json(&KeyStatus::InTransaction {
            retry_after: Duration::from_millis(1_000),
        });
        let (leased, in_transaction) = (body(leased).await, body(in_transaction).await);
        assert_eq!(
            in_transaction.1,
            serde_json::json!({ "state": "in_flight", "retry_after_seconds": 1 })
        );
        assert_eq!(
            in_transaction, leased,
            "the client cannot tell the modes apart"
        );
    }
}
