//! The service: one request through the protocol.
//!
//! [`handle`] reads what the protocol needs from the request (key, scope, body), asks the
//! engine what to do, and answers; [`run_once`] runs the handler of a request that holds its key
//! and hands its response to the engine.

use crate::body::{BoxError, IdempotencyBody, Kept, RequestBody, boxed, full, keep_up_to};
use crate::config::Shared;
use crate::detach::DetachOnDrop;
use crate::refusal::{LibraryRefusal, Problem, render};
use crate::route::{Outcome, Route};
use bytes::Bytes;
use futures_util::FutureExt as _;
use futures_util::future::BoxFuture;
use http::{Request, Response};
use http_body::Body;
use idempotency_core::{
    Begin, Completion, ErrorChain, Guard, IdempotencyStore, StoreError, StoredResponse,
};
use std::fmt;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tower_service::Service;
use tracing::Instrument;

mod log_fields;
mod replay;
mod request;
mod stored_or_not;

use replay::{after_completion, replay, superseded};

use log_fields::{KeyHash, panic_message};
use request::{original_uri, read_request_body};
pub(crate) use request::{read_key, read_scope};
pub use stored_or_not::{Final, NotStored};
use stored_or_not::{opted_out, rejected_before_the_handler};

/// How long a client is told to wait after a 503 because the store was unreachable or the
/// request's transaction did not commit, and after a 409 for a lease lost at commit time.
pub(crate) const RETRY_AFTER: Duration = Duration::from_secs(1);

/// `Retry-After` for a caller that holds its share of the store: its records must expire
/// first, which takes far longer than a second; a minute keeps a polite client from hammering.
const SCOPE_FULL_RETRY_AFTER: Duration = Duration::from_secs(60);

/// The service made by [`IdempotencyLayer`](crate::IdempotencyLayer).
pub struct IdempotencyService<Inner, S> {
    inner: Inner,
    shared: Arc<Shared<S>>,
}

impl<Inner, S> IdempotencyService<Inner, S> {
    pub(crate) fn new(inner: Inner, shared: Arc<Shared<S>>) -> Self {
        IdempotencyService { inner, shared }
    }
}

impl<Inner: Clone, S> Clone for IdempotencyService<Inner, S> {
    fn clone(&self) -> Self {
        IdempotencyService {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<Inner: fmt::Debug, S: IdempotencyStore + 'static> fmt::Debug for IdempotencyService<Inner, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyService")
            .field("inner", &self.inner)
            .field("store", &self.shared.engine.store().backend())
            .finish()
    }
}

impl<Inner, S, B, ResB> Service<Request<B>> for IdempotencyService<Inner, S>
where
    Inner: Service<Request<RequestBody>, Response = Response<ResB>> + Clone + Send + 'static,
    Inner::Future: Send + 'static,
    Inner::Error: Send + 'static,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
    ResB: Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BoxError>,
    S: IdempotencyStore + 'static,
{
    type Response = Response<IdempotencyBody>;
    type Error = Inner::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        // Take the service that was driven to readiness; leave a fresh clone in its place.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let shared = Arc::clone(&self.shared);
        if !shared.settings.methods.contains(request.method()) {
            let future = { inner }.call(request.map(RequestBody::new));
            return Box::pin(async move { future.await.map(|r| r.map(boxed)) });
        }
        Box::pin(handle(inner, shared, request))
    }
}

/// A request the layer answers itself.
pub(crate) struct Refused(pub(crate) Problem, pub(crate) Outcome);

/// Answers `problem` and records `outcome`.
fn refuse<S>(
    shared: &Shared<S>,
    route: &Route,
    Refused(problem, outcome): Refused,
) -> Response<IdempotencyBody> {
    outcome.record(route);
    answer(shared, problem)
}

/// The response for `problem`, as the configured renderer writes it.
pub(crate) fn answer<S>(shared: &Shared<S>, problem: Problem) -> Response<IdempotencyBody> {
    render(&problem.refusal(shared.settings.profile), &shared.render)
}

/// The 503 for a store call that failed, said as what it is (and logged): a pool whose every
/// connection is held (by requests waiting on hot rows, say) is not a store that is down.
pub(crate) fn store_problem<S: IdempotencyStore + 'static>(
    shared: &Shared<S>,
    error: &StoreError,
    retry_after: Duration,
) -> Problem {
    match shared.engine.store().pool_status() {
        Some(pool) if pool.idle == 0 && pool.open >= pool.max => {
            tracing::warn!(error = %ErrorChain(error), in_use = pool.open, max = pool.max, waiting = pool.waiting, "every connection of the idempotency store's pool is in use, so the key could not be checked in time; answering 503 store-busy (see idempotency_store_pool_connections: a pool held by requests waiting on the database, a lock, or a pool too small)");
            Problem::StoreBusy { retry_after }
        }
        _ => {
            tracing::warn!(error = %ErrorChain(error), retryable = error.is_retryable(), "idempotency store failed; answering 503");
            Problem::StoreUnavailable { retry_after }
        }
    }
}

async fn handle<Inner, S, B, ResB>(
    mut inner: Inner,
    shared: Arc<Shared<S>>,
    request: Request<B>,
) -> Result<Response<IdempotencyBody>, Inner::Error>
where
    Inner: Service<Request<RequestBody>, Response = Response<ResB>> + Clone + Send + 'static,
    Inner::Future: Send + 'static,
    Inner::Error: Send + 'static,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
    ResB: Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BoxError>,
    S: IdempotencyStore + 'static,
{
    let (parts, body) = request.into_parts();
    if let Some(cover) = &shared.settings.cover_if
        && !cover(&parts)
    {
        let response = inner
            .call(Request::from_parts(parts, RequestBody::new(body)))
            .await?;
        return Ok(response.map(boxed));
    }
    let route = Route::of(&parts, &shared.routes);
    let key = match read_key(&parts, &shared) {
        Ok(Some(key)) => key,
        Ok(None) => {
            Outcome::Passthrough.record(&route);
            let response = inner
                .call(Request::from_parts(parts, RequestBody::new(body)))
                .await?;
            return Ok(response.map(boxed));
        }
        Err(refused) => return Ok(refuse(&shared, &route, refused)),
    };
    let scope = match read_scope(&parts, &shared) {
        Ok(scope) => scope,
        Err(refused) => return Ok(refuse(&shared, &route, refused)),
    };
    let (bytes, body_permit) = match read_request_body(&parts, body, &shared).await {
        Ok(read) => read,
        Err(refused) => return Ok(refuse(&shared, &route, refused)),
    };
    let path_and_query = original_uri(&parts)
        .path_and_query()
        .map_or("/", |p| p.as_str());
    let fingerprint = shared.settings.fingerprint.fingerprint(
        parts.method.as_str(),
        path_and_query,
        &parts.headers,
        &bytes,
    );

    let span = tracing::info_span!(
        "idempotency",
        key = %KeyHash(&scope, &key),
        method = %parts.method,
        route = %route,
        outcome = tracing::field::Empty,
    );
    async move {
        // The body's bytes stay counted until the response is produced.
        let _body_permit = body_permit;
        let request = Request::from_parts(parts, RequestBody::from_bytes(bytes));
        match shared.engine.begin(scope, key, fingerprint).await {
            // Only a store that could not be reached: one that answered (a corrupt record, a
            // write short of its replicas) may hold this key's record.
            Err(error) if shared.settings.fail_open && error.is_unreachable() => {
                tracing::warn!(error = %ErrorChain(&error), "idempotency store failed; running without idempotency (fail open)");
                Outcome::StoreErrorFailOpen.record(&route);
                Ok(inner.call(request).await?.map(boxed))
            }
            Err(StoreError::ScopeFull { retry_after, .. }) => {
                tracing::debug!("this caller may not start new keys now; answering 429");
                let retry_after = retry_after.unwrap_or(SCOPE_FULL_RETRY_AFTER);
                let problem = Problem::ScopeFull { retry_after };
                Ok(refuse(&shared, &route, Refused(problem, Outcome::ScopeFull)))
            }
            Err(error @ StoreError::Busy { .. }) => {
                tracing::warn!(error = %ErrorChain(&error), "the database is contended: no request transaction ended in time to admit this one; answering 503 store-busy");
                let problem = Problem::StoreBusy {
                    retry_after: RETRY_AFTER,
                };
                Ok(refuse(&shared, &route, Refused(problem, Outcome::StoreError)))
            }
            Err(error) => {
                let problem = store_problem(&shared, &error, RETRY_AFTER);
                Ok(refuse(&shared, &route, Refused(problem, Outcome::StoreError)))
            }
            Ok(Begin::Replay(stored)) => {
                Outcome::Replayed.record(&route);
                Ok(replay(stored, &shared.settings.replay_header))
            }
            Ok(Begin::InFlight { retry_after }) => Ok(refuse(
                &shared,
                &route,
                Refused(Problem::InFlight { retry_after }, Outcome::Conflict),
            )),
            Ok(Begin::Mismatch) => Ok(refuse(
                &shared,
                &route,
                Refused(Problem::Mismatch, Outcome::Mismatch),
            )),
            // Counted once its answer is known: `executed` when the handler's answer (or the
            // library's word on its commit) goes out, else as the record or the failure that
            // answered instead (a replay, a conflict, a mismatch, a failed handler).
            Ok(Begin::Proceed(guard)) => run_once(inner, shared, guard, request, route).await,
        }
    }
    .instrument(span)
    .await
}

/// Runs the handler and hands its response to the guard. It runs in the caller's task; if the
/// client disconnects first, it is moved to its own task and still runs to the end, so a side
/// effect is never cut in half and its response is still stored for the retry.
///
/// The handler finds the request's [`KeyClaim`](idempotency_core::KeyClaim) in the request
/// extensions, and, on a transactional store, the
/// [`TransactionSlot`](idempotency_core::TransactionSlot) its writes commit with.
async fn run_once<Inner, S, ResB>(
    mut inner: Inner,
    shared: Arc<Shared<S>>,
    guard: Guard<S>,
    mut request: Request<RequestBody>,
    route: Route,
) -> Result<Response<IdempotencyBody>, Inner::Error>
where
    Inner: Service<Request<RequestBody>, Response = Response<ResB>> + Send + 'static,
    Inner::Future: Send + 'static,
    Inner::Error: Send + 'static,
    ResB: Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BoxError>,
    S: IdempotencyStore + 'static,
{
    // Speculative mode: the key's lookup rides the handler's first statement, so a database
    // that does not answer it holds the handler with nothing to bound it.
    let overdue = guard.lookup_overdue();
    let route = if overdue.is_some() {
        route.counted_once()
    } else {
        route
    };
    let on_panic = Arc::clone(&shared);
    let on_panic_route = route.clone();
    let tracked = on_panic.engine.track(
        async move {
            let extensions = request.extensions_mut();
            extensions.insert(guard.claim().clone());
            if let Some(transaction) = guard.transaction() {
                extensions.insert(transaction.clone());
            }
            // A panicking handler (one that unwraps a statement the speculative mode refused,
            // say) is caught here, its locals dropped by unwinding, so the guard is still ours:
            // releasing it rolls the transaction back and reads the key's lookup, so a retry of
            // a completed key replays instead of answering 500.
            let called = AssertUnwindSafe(inner.call(request)).catch_unwind().await;
            let response = match called {
                Ok(Ok(response)) => response,
                Err(panic) => {
                    if let Completion::Superseded(other) = guard.release().await {
                        tracing::debug!(panic = panic_message(&*panic), "the handler panicked on a key another request holds; answering with that request's outcome");
                        return Ok(superseded(&shared, &route, other));
                    }
                    tracing::error!(panic = panic_message(&*panic), "the handler panicked; its transaction rolled back and its key was released");
                    return Ok(refuse(
                        &shared,
                        &route,
                        Refused(Problem::HandlerFailed, Outcome::HandlerFailed),
                    ));
                }
                Ok(Err(e)) => {
                    if let Completion::Superseded(other) = guard.release().await {
                        return Ok(superseded(&shared, &route, other));
                    }
                    Outcome::Executed.record(&route);
                    return Err(e);
                }
            };
            let (parts, body) = response.into_parts();
            if let Some(LibraryRefusal(problem)) = parts.extensions.get::<LibraryRefusal>() {
                // The library answered inside the handler (a refused `Tx`): never the key's
                // result. The key is released, so the retry runs; the answer is rendered the
                // way the layer renders every refusal.
                if let Completion::Superseded(other) = guard.release().await {
                    return Ok(superseded(&shared, &route, other));
                }
                Outcome::Executed.record(&route);
                return Ok(answer(&shared, problem.clone()));
            }
            let policy = &shared.settings.replay_policy;
            if !policy.stores(parts.status)
                || opted_out(&parts)
                || rejected_before_the_handler(&parts, &shared.settings.rejection_statuses)
            {
                // The policy does not keep this status, or the handler said not to: its
                // transaction rolls back and the key is released, so the retry runs on a clean
                // slate.
                let released = guard.release().await;
                if !matches!(released, Completion::Superseded(_)) {
                    Outcome::Executed.record(&route);
                }
                // The speculative lookup may not have been settled: the handler may then have
                // built its answer from statements the database refused, so only what core
                // says agrees with the key is passed on.
                return Ok(after_completion(&shared, &route, released)
                    .unwrap_or_else(|| Response::from_parts(parts, boxed(body))));
            }
            let cap = shared.settings.max_stored_body;
            let (stored, body) = match keep_up_to(body, cap).await {
                Ok(Kept::Whole(bytes)) => (
                    StoredResponse::capture(parts.status, &parts.headers, bytes.clone()),
                    full(bytes),
                ),
                Ok(Kept::Over(body)) => (
                    StoredResponse::capture_without_body(parts.status, &parts.headers),
                    body,
                ),
                Err(error) => {
                    tracing::warn!(error = %ErrorChain(&*error), "the handler's response body failed; releasing the key");
                    if let Completion::Superseded(other) = guard.release().await {
                        return Ok(superseded(&shared, &route, other));
                    }
                    return Ok(refuse(
                        &shared,
                        &route,
                        Refused(Problem::HandlerFailed, Outcome::HandlerFailed),
                    ));
                }
            };
            let completion = guard.complete_with(policy, stored).await;
            if !matches!(completion, Completion::Superseded(_)) {
                Outcome::Executed.record(&route);
            }
            Ok(after_completion(&shared, &route, completion)
                .unwrap_or_else(|| Response::from_parts(parts, body)))
        }
        .in_current_span(),
    );
    let mut detached = DetachOnDrop::new(tracked);
    let finished = match overdue {
        None => detached.await,
        Some(overdue) => tokio::select! {
            biased;
            finished = &mut detached => finished,
            () = overdue => {
                tracing::warn!(
                    "the key's lookup was not answered within the store timeout (a frozen \
                     database, a locked key table): the client is told the outcome is not known \
                     yet; the request runs on, and commits only if its key turns out free"
                );
                Outcome::StoreError.record(&on_panic_route);
                // Dropping `detached` hands the request to the runtime.
                return Ok(answer(
                    &on_panic,
                    Problem::OutcomeUnknown {
                        retry_after: RETRY_AFTER,
                    },
                ));
            }
        },
    };
    match finished {
        Ok(result) => result,
        Err(_panic) => {
            tracing::error!("the handler panicked; its key is released");
            Ok(refuse(
                &on_panic,
                &on_panic_route,
                Refused(Problem::HandlerFailed, Outcome::HandlerFailed),
            ))
        }
    }
}

#[cfg(test)]
mod tests;
