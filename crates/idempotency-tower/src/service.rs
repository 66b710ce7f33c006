//! The service: one request through the protocol.

use crate::body::{
    BoxError, IdempotencyBody, Kept, ReadError, boxed, full, keep_up_to, read_limited,
};
use crate::detach::DetachOnDrop;
use crate::layer::{ScopeSource, Shared};
use crate::problem::Problem;
use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::{HeaderValue, Request, Response, header};
use http_body::Body;
use idempotency_core::{
    Begin, Completion, Fingerprint, Guard, IDEMPOTENT_REPLAYED, IdempotencyKey, IdempotencyStore,
    Scope, StoreError, StoredResponse,
};
use sha2::{Digest, Sha256};
use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tower_service::Service;
use tracing::Instrument;

/// How long a client is told to wait after a 503 because the store was unreachable.
const STORE_RETRY_AFTER: Duration = Duration::from_secs(1);

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
    Inner: Service<Request<B>, Response = Response<ResB>> + Clone + Send + 'static,
    Inner::Future: Send + 'static,
    Inner::Error: Send + 'static,
    B: Body + From<Bytes> + Send + 'static,
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
            let future = { inner }.call(request);
            return Box::pin(async move { future.await.map(|r| r.map(boxed)) });
        }
        Box::pin(handle(inner, shared, request))
    }
}

fn count(outcome: &'static str) {
    metrics::counter!("idempotency_requests_total", "outcome" => outcome).increment(1);
}

fn record_store_call(backend: &'static str, op: &'static str, started: Instant, ok: bool) {
    metrics::histogram!("idempotency_store_duration_seconds", "backend" => backend, "op" => op)
        .record(started.elapsed().as_secs_f64());
    if !ok {
        metrics::counter!("idempotency_store_errors_total", "backend" => backend, "op" => op)
            .increment(1);
    }
}

/// A short, stable, non-reversible id of `(scope, key)` for logs: never the key itself.
fn key_hash(scope: &Scope, key: &IdempotencyKey) -> String {
    let mut h = Sha256::new();
    h.update(scope.as_str().as_bytes());
    h.update([0]);
    h.update(key.as_str().as_bytes());
    h.finalize()[..6]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

async fn handle<Inner, S, B, ResB>(
    mut inner: Inner,
    shared: Arc<Shared<S>>,
    request: Request<B>,
) -> Result<Response<IdempotencyBody>, Inner::Error>
where
    Inner: Service<Request<B>, Response = Response<ResB>> + Clone + Send + 'static,
    Inner::Future: Send + 'static,
    Inner::Error: Send + 'static,
    B: Body + From<Bytes> + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
    ResB: Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BoxError>,
    S: IdempotencyStore + 'static,
{
    let settings = &shared.settings;
    let problem = |p: Problem, outcome: &'static str| {
        count(outcome);
        Ok(p.into_response(settings.profile, &settings.problem_type_base))
    };
    let (parts, body) = request.into_parts();

    let mut values = parts.headers.get_all(&settings.header).iter();
    let raw_key = match (values.next(), values.next()) {
        (None, _) if settings.key_required => return problem(Problem::KeyMissing, "key_missing"),
        (None, _) => {
            count("passthrough");
            let response = inner.call(Request::from_parts(parts, body)).await?;
            return Ok(response.map(boxed));
        }
        (Some(_), Some(_)) => return problem(Problem::KeyRepeated, "key_invalid"),
        (Some(value), None) => value,
    };
    let key = match IdempotencyKey::parse(raw_key.as_bytes(), shared.engine.config().key_format) {
        Ok(key) => key,
        Err(e) => return problem(Problem::KeyInvalid(e), "key_invalid"),
    };
    let scope = match &settings.scope {
        ScopeSource::Unscoped => Scope::unscoped(),
        ScopeSource::Extract(extract) => match extract(&parts) {
            Some(scope) => scope,
            None => return problem(Problem::ScopeMissing, "scope_missing"),
        },
    };

    let limit = settings.max_request_body;
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        return problem(Problem::BodyTooLarge { limit }, "body_too_large");
    }
    let bytes = match read_limited(body, limit).await {
        Ok(bytes) => bytes,
        Err(ReadError::TooLarge) => {
            return problem(Problem::BodyTooLarge { limit }, "body_too_large");
        }
        Err(ReadError::Unreadable) => return problem(Problem::BodyUnreadable, "body_unreadable"),
    };
    let path_and_query = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let fingerprint = Fingerprint::of_request(
        parts.method.as_str(),
        path_and_query,
        &bytes,
        settings.canonicalization,
    );

    let span = tracing::info_span!(
        "idempotency",
        key = %key_hash(&scope, &key),
        method = %parts.method,
        outcome = tracing::field::Empty,
    );
    async {
        let backend = shared.engine.store().backend();
        let started = Instant::now();
        let begin = match tokio::time::timeout(
            settings.store_timeout,
            shared.engine.begin(scope, key, fingerprint),
        )
        .await
        {
            Ok(result) => result,
            Err(_) => Err(StoreError::Timeout {
                backend,
                timeout: settings.store_timeout,
            }),
        };
        record_store_call(backend, "claim", started, begin.is_ok());
        let span = tracing::Span::current();
        match begin {
            Err(error) if settings.fail_open => {
                tracing::warn!(%error, "idempotency store failed; running without idempotency (fail open)");
                span.record("outcome", "store_error_fail_open");
                count("store_error_fail_open");
                let response = inner.call(Request::from_parts(parts, B::from(bytes))).await?;
                Ok(response.map(boxed))
            }
            Err(error) => {
                tracing::warn!(%error, retryable = error.is_retryable(), "idempotency store failed; answering 503");
                span.record("outcome", "store_error");
                problem(
                    Problem::StoreUnavailable {
                        retry_after: STORE_RETRY_AFTER,
                    },
                    "store_error",
                )
            }
            Ok(Begin::Replay(stored)) => {
                span.record("outcome", "replayed");
                count("replayed");
                Ok(replay(stored))
            }
            Ok(Begin::InFlight { retry_after }) => {
                span.record("outcome", "conflict");
                problem(Problem::InFlight { retry_after }, "conflict")
            }
            Ok(Begin::Mismatch) => {
                span.record("outcome", "mismatch");
                problem(Problem::Mismatch, "mismatch")
            }
            Ok(Begin::Invalid(e)) => problem(Problem::KeyInvalid(e), "key_invalid"),
            Ok(Begin::Proceed(guard)) => {
                span.record("outcome", "executed");
                count("executed");
                let request = Request::from_parts(parts, B::from(bytes));
                run_once(inner, Arc::clone(&shared), guard, request).await
            }
        }
    }
    .instrument(span)
    .await
}

/// Runs the handler and stores its response. It runs in the caller's task; if the client
/// disconnects first, it is moved to its own task and still runs to the end, so a side effect is
/// never cut in half and its response is still stored for the retry.
async fn run_once<Inner, S, B, ResB>(
    mut inner: Inner,
    shared: Arc<Shared<S>>,
    guard: Guard<S>,
    request: Request<B>,
) -> Result<Response<IdempotencyBody>, Inner::Error>
where
    Inner: Service<Request<B>, Response = Response<ResB>> + Send + 'static,
    Inner::Future: Send + 'static,
    Inner::Error: Send + 'static,
    B: Send + 'static,
    ResB: Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BoxError>,
    S: IdempotencyStore + 'static,
{
    let outer = Arc::clone(&shared);
    let run = DetachOnDrop::new(
        async move {
            let settings = &shared.settings;
            let backend = shared.engine.store().backend();
            // If the handler panics, `guard` is dropped while unwinding and releases the key.
            // While it runs, the guard's heartbeat keeps the lease from running out.
            let response = match guard.keep_alive(inner.call(request)).await {
                Ok(response) => response,
                Err(e) => {
                    finish(backend, "release", settings.store_timeout, async {
                        guard.release().await.map(|_| Completion::Released)
                    })
                    .await;
                    return Err(e);
                }
            };
            let (parts, body) = response.into_parts();
            if !guard.will_store(parts.status) {
                finish(backend, "release", settings.store_timeout, async {
                    guard.release().await.map(|_| Completion::Released)
                })
                .await;
                return Ok(Response::from_parts(parts, boxed(body)));
            }
            match keep_up_to(body, settings.max_stored_body).await {
                Ok(Kept::Whole(bytes)) => {
                    let stored =
                        StoredResponse::capture(parts.status, &parts.headers, bytes.clone());
                    finish(
                        backend,
                        "complete",
                        settings.store_timeout,
                        guard.complete(stored),
                    )
                    .await;
                    Ok(Response::from_parts(parts, full(bytes)))
                }
                Ok(Kept::Over(body)) => {
                    let stored = StoredResponse::capture_without_body(parts.status, &parts.headers);
                    finish(
                        backend,
                        "complete",
                        settings.store_timeout,
                        guard.complete(stored),
                    )
                    .await;
                    Ok(Response::from_parts(parts, body))
                }
                Err(error) => {
                    tracing::warn!(%error, "the handler's response body failed; releasing the key");
                    finish(backend, "release", settings.store_timeout, async {
                        guard.release().await.map(|_| Completion::Released)
                    })
                    .await;
                    count("handler_failed");
                    Ok(Problem::HandlerPanicked
                        .into_response(settings.profile, &settings.problem_type_base))
                }
            }
        }
        .in_current_span(),
    );
    match run.await {
        Ok(result) => result,
        Err(_panic) => {
            tracing::error!("the handler panicked; its key is released");
            count("handler_failed");
            let settings = &outer.settings;
            Ok(Problem::HandlerPanicked
                .into_response(settings.profile, &settings.problem_type_base))
        }
    }
}

/// Awaits a completion or release with the store timeout, and records what happened. The
/// response goes to the client whatever this says: a failure here only means a retry may get
/// 409 until the lease runs out, then run again.
async fn finish(
    backend: &'static str,
    op: &'static str,
    timeout: Duration,
    step: impl std::future::Future<Output = Result<Completion, StoreError>>,
) {
    let started = Instant::now();
    let result = tokio::time::timeout(timeout, step).await;
    record_store_call(backend, op, started, matches!(result, Ok(Ok(_))));
    let label = match result {
        Ok(Ok(Completion::Stored)) => "stored",
        Ok(Ok(Completion::Released)) => "released",
        // The engine already logged the lost lease.
        Ok(Ok(Completion::Stale)) => "stale",
        Ok(Err(error)) => {
            tracing::warn!(%error, op, "could not store the outcome; the key frees when its lease runs out");
            "error"
        }
        Err(_) => {
            tracing::warn!(
                op,
                ?timeout,
                "storing the outcome timed out; the key frees when its lease runs out"
            );
            "error"
        }
    };
    metrics::counter!("idempotency_completions_total", "result" => label).increment(1);
}

/// The stored response, byte for byte, marked as a replay.
fn replay(stored: StoredResponse) -> Response<IdempotencyBody> {
    let omitted = stored.body_omitted();
    let (status, headers, body) = stored.into_parts();
    let mut response = Response::new(full(body));
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    let headers = response.headers_mut();
    headers.insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    if omitted {
        headers.insert(
            http::HeaderName::from_static("idempotent-replay-body"),
            HeaderValue::from_static("omitted"),
        );
    }
    response
}
