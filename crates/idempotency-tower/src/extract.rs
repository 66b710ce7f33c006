//! axum extractors (feature `axum`).

use crate::refusal::Profile;
use crate::refusal::{Problem, problem_json, render};
use axum_core::extract::{FromRequestParts, OptionalFromRequestParts};
use axum_core::response::{IntoResponse, Response};
use http::request::Parts;
use idempotency_core::store::StoreTransaction;
use idempotency_core::{KeyClaim, StoreError, Transaction, TransactionError, TransactionSlot};
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::time::Duration;

/// The request's idempotency transaction, as an axum extractor: the handler's writes in it and
/// the response it returns commit together (see
/// [`TransactionalStore`](idempotency_core::store::TransactionalStore)). `T` is the store's transaction
/// type, `idempotency_postgres::PostgresTransaction` for PostgreSQL.
///
/// ```ignore
/// async fn create_task(tx: Tx<PostgresTransaction>, Json(task): Json<NewTask>) -> impl IntoResponse {
///     tx.execute("INSERT INTO tasks (title) VALUES ($1)", &[&task.title]).await?;
///     (StatusCode::CREATED, "created") // stored and committed with the insert
/// }
/// ```
///
/// As `Option<Tx<T>>` it is `None` where the request has no transaction (a route or method the
/// layer does not cover, or a store that is not transactional), so one handler can serve both.
/// Drop it before the handler returns (never move it into a spawned task or the response body).
pub struct Tx<T: 'static>(pub Transaction<T>);

impl<T: 'static> Tx<T> {
    /// Rolls back every write of the request's transaction when the request ends, and stores
    /// the handler's answer alone ([`TransactionSlot::discard_writes`]): for a refusal decided
    /// after some writes (an order whose third item is out of stock), which every retry must
    /// get without running again. The key stays held until the answer is stored, so a
    /// duplicate never runs meanwhile.
    pub fn discard_writes(&self) {
        self.0.discard_writes();
    }
}

impl<T: 'static> Deref for Tx<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T: 'static> DerefMut for Tx<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.0
    }
}

impl<T: 'static> fmt::Debug for Tx<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Tx").field(&self.0).finish()
    }
}

impl<S: Send + Sync, T: StoreTransaction> FromRequestParts<S> for Tx<T> {
    type Rejection = TxRejection;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, TxRejection> {
        let slot = parts
            .extensions
            .get::<TransactionSlot>()
            .cloned()
            .ok_or(TxRejection(TransactionError::Unavailable))?;
        slot.open::<T>().await.map(Tx).map_err(TxRejection)
    }
}

impl<S: Send + Sync, T: StoreTransaction> OptionalFromRequestParts<S> for Tx<T> {
    type Rejection = TxRejection;

    async fn from_request_parts(
        parts: &mut Parts,
        _state: &S,
    ) -> Result<Option<Self>, TxRejection> {
        let Some(slot) = parts.extensions.get::<TransactionSlot>().cloned() else {
            return Ok(None);
        };
        slot.open::<T>()
            .await
            .map(|tx| Some(Tx(tx)))
            .map_err(TxRejection)
    }
}

/// Why [`Tx`] could not be extracted; answers with RFC 9457 problem+json: 409 when the lease was
/// lost, 503 with `Retry-After` when the store failed, `500 transaction-misused` when the
/// transaction is already taken (two `Tx` extractors in one handler), 500 for a
/// misconfiguration (no transaction on this route, or another store's transaction type). The
/// layer never stores it, and releases the key.
#[derive(Debug)]
pub struct TxRejection(pub TransactionError);

impl fmt::Display for TxRejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl std::error::Error for TxRejection {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

impl IntoResponse for TxRejection {
    fn into_response(self) -> Response {
        let retry_after = Duration::from_secs(1);
        let problem = match &self.0 {
            TransactionError::LeaseLost => Problem::InFlight { retry_after },
            // Logged where it was refused; the layer releases the key.
            TransactionError::InUse => Problem::TransactionMisused,
            TransactionError::Store(error @ StoreError::Busy { .. }) => {
                tracing::warn!(error = %idempotency_core::ErrorChain(error), "the database is contended: no request transaction ended in time to admit this one; answering 503 store-busy");
                Problem::StoreBusy { retry_after }
            }
            TransactionError::Store(error) => {
                tracing::warn!(error = %idempotency_core::ErrorChain(error), "could not open the request's idempotency transaction");
                Problem::StoreUnavailable { retry_after }
            }
            other => {
                tracing::error!(error = %other, "the handler asked for an idempotency transaction it cannot have");
                Problem::TransactionUnavailable
            }
        };
        // Rendered here for a route the layer does not cover; the layer renders it again with
        // its own profile and renderer, and never stores it (`LibraryRefusal`).
        let renderer: crate::RenderRefusal = std::sync::Arc::new(|refusal| {
            problem_json(refusal, crate::config::DEFAULT_PROBLEM_TYPE_BASE)
        });
        let mut response = render(&problem.clone().refusal(Profile::default()), &renderer)
            .map(axum_core::body::Body::new);
        response
            .extensions_mut()
            .insert(crate::refusal::LibraryRefusal(problem));
        response
    }
}

/// The request's [`KeyClaim`] (key, scope, fencing token, `lost()`), as an axum extractor:
/// `Claim(claim): Claim`, or `Option<Claim>` on routes the layer may not cover. It lives here,
/// with [`Tx`], so that the core crate knows no web framework.
#[derive(Clone, Debug)]
pub struct Claim(pub KeyClaim);

impl Deref for Claim {
    type Target = KeyClaim;
    fn deref(&self) -> &KeyClaim {
        &self.0
    }
}

/// The request has no [`KeyClaim`]: the idempotency layer does not cover it (a method, route or
/// request without a key). Answers 500 problem+json: a handler that needs its claim is on a
/// route the layer must cover.
#[derive(Clone, Copy, Debug)]
pub struct KeyClaimRejection;

impl fmt::Display for KeyClaimRejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(
            "this request has no idempotency claim: the idempotency layer does not cover it",
        )
    }
}

impl std::error::Error for KeyClaimRejection {}

impl IntoResponse for KeyClaimRejection {
    fn into_response(self) -> Response {
        let body = format!(
            "{{\"type\":\"urn:idempotency:problem:claim-unavailable\",\"title\":\"The request has no idempotency claim\",\"status\":500,\"detail\":\"{self}.\",\"code\":\"idempotency_claim_unavailable\"}}"
        );
        let mut response = (http::StatusCode::INTERNAL_SERVER_ERROR, body).into_response();
        response.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/problem+json"),
        );
        response
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Claim {
    type Rejection = KeyClaimRejection;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, KeyClaimRejection> {
        parts
            .extensions
            .get::<KeyClaim>()
            .cloned()
            .map(Claim)
            .ok_or(KeyClaimRejection)
    }
}

impl<S: Send + Sync> OptionalFromRequestParts<S> for Claim {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut Parts,
        _: &S,
    ) -> Result<Option<Self>, std::convert::Infallible> {
        Ok(parts.extensions.get::<KeyClaim>().cloned().map(Claim))
    }
}
