//! [`IdempotentRetry`]: the `reqwest-middleware` middleware that sends a request with one key,
//! and sends it again with the same key when the protocol says so.

use crate::error::ClientError;
use crate::policy::{IDEMPOTENT_REPLAYED, Profile, Verdict, classify};
use http::{Extensions, HeaderName, HeaderValue, Method};
use rand::Rng as _;
use reqwest::{Request, Response};
use reqwest_middleware::{Middleware, Next};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tracing::Instrument as _;

/// What the caller learns of a logical request: in the extensions of the response the
/// middleware hands back (`response.extensions().get::<Attempts>()`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attempts {
    /// The key every attempt carried: the caller's, or the one the middleware made.
    pub key: String,
    /// How many times the request was sent.
    pub attempts: u32,
    /// Whether the answer is a replay of the key's first answer (`Idempotent-Replayed`): the
    /// request ran before, on an attempt whose answer was lost, or on an earlier call.
    pub replayed: bool,
}

#[derive(Debug)]
struct Settings {
    profile: Profile,
    header: HeaderName,
    methods: Vec<Method>,
    max_attempts: u32,
    deadline: Duration,
    base_backoff: Duration,
    max_backoff: Duration,
    max_retry_after: Duration,
}

/// Sends a `POST`, `PATCH` or `DELETE` with an `Idempotency-Key` (the caller's, or a fresh UUID
/// v4), the same on every attempt, and sends it again:
///
/// - when no answer came: the connection was refused, reset, or timed out;
/// - on the server's own "not now" ([`classify`](crate::classify)): a `409` that is the key's
///   (in flight, not a stored business conflict), `429`, `503`, and a proxy's `502` or `504`,
///   after its `Retry-After` when it gave one (at most
///   [`max_retry_after`](IdempotentRetryBuilder::max_retry_after): a longer one is handed over
///   as the answer);
///
/// never on a replay, nor on `400`, `401`, `403`, `404`, `422` or any other answer. Between
/// attempts it waits a full-jitter backoff (a random time up to
/// `base_backoff * 2^attempt`, capped), within an attempt budget and an overall deadline.
///
/// ```no_run
/// use idempotency_client::IdempotentRetry;
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
///     .with(IdempotentRetry::default())
///     .build();
/// let order = client
///     .post("http://127.0.0.1:3000/orders")
///     .body(r#"{"sku":"tea"}"#)
///     .send()
///     .await?;
/// let attempts = order.extensions().get::<idempotency_client::Attempts>();
/// # let _ = attempts; Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct IdempotentRetry {
    settings: Arc<Settings>,
}

impl Default for IdempotentRetry {
    fn default() -> Self {
        IdempotentRetry::builder().build()
    }
}

impl IdempotentRetry {
    /// A builder with the defaults: IETF profile, header `Idempotency-Key`, methods `POST`,
    /// `PATCH` and `DELETE`, 5 attempts within 30 s, backoff from 100 ms up to 5 s, a
    /// `Retry-After` honoured up to 10 s.
    pub fn builder() -> IdempotentRetryBuilder {
        IdempotentRetryBuilder {
            settings: Settings {
                profile: Profile::Ietf,
                header: HeaderName::from_static("idempotency-key"),
                methods: vec![Method::POST, Method::PATCH, Method::DELETE],
                max_attempts: 5,
                deadline: Duration::from_secs(30),
                base_backoff: Duration::from_millis(100),
                max_backoff: Duration::from_secs(5),
                max_retry_after: Duration::from_secs(10),
            },
        }
    }

    /// The wait before attempt `attempt + 1` (full jitter): a random time up to
    /// `base * 2^(attempt - 1)`, at most the cap.
    fn backoff(&self, attempt: u32) -> Duration {
        let settings = &self.settings;
        let ceiling = settings
            .base_backoff
            .saturating_mul(1u32 << attempt.saturating_sub(1).min(20))
            .min(settings.max_backoff);
        let millis = u64::try_from(ceiling.as_millis()).unwrap_or(u64::MAX);
        Duration::from_millis(rand::rng().random_range(0..=millis))
    }
}

/// Builds an [`IdempotentRetry`].
#[derive(Debug)]
pub struct IdempotentRetryBuilder {
    settings: Settings,
}

impl IdempotentRetryBuilder {
    /// The server's dialect (default [`Profile::Ietf`]).
    pub fn profile(mut self, profile: Profile) -> Self {
        self.settings.profile = profile;
        self
    }

    /// The key's header (default `Idempotency-Key`).
    pub fn header_name(mut self, header: HeaderName) -> Self {
        self.settings.header = header;
        self
    }

    /// The methods sent with a key and retried (default `POST`, `PATCH`, `DELETE`); others pass
    /// through untouched.
    pub fn methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.settings.methods = methods.into_iter().collect();
        self
    }

    /// At most this many attempts per logical request, the first included (default 5; at
    /// least 1).
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.settings.max_attempts = attempts.max(1);
        self
    }

    /// No attempt starts, and none is waited for, past this long after the first (default
    /// 30 s).
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.settings.deadline = deadline;
        self
    }

    /// The backoff's first ceiling and its cap (defaults 100 ms and 5 s).
    pub fn backoff(mut self, base: Duration, max: Duration) -> Self {
        self.settings.base_backoff = base;
        self.settings.max_backoff = max.max(base);
        self
    }

    /// The longest `Retry-After` waited for (default 10 s); an answer that asks for more is
    /// handed over as it is.
    pub fn max_retry_after(mut self, wait: Duration) -> Self {
        self.settings.max_retry_after = wait;
        self
    }

    /// The middleware.
    pub fn build(self) -> IdempotentRetry {
        IdempotentRetry {
            settings: Arc::new(self.settings),
        }
    }
}

/// An error the transport reports before any answer: worth another attempt with the key.
fn no_answer(error: &reqwest_middleware::Error) -> Option<&reqwest::Error> {
    match error {
        reqwest_middleware::Error::Reqwest(error)
            if error.is_connect() || error.is_timeout() || error.is_request() =>
        {
            Some(error)
        }
        _ => None,
    }
}

#[async_trait::async_trait]
impl Middleware for IdempotentRetry {
    async fn handle(
        &self,
        mut request: Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<Response> {
        let settings = &self.settings;
        if !settings.methods.contains(request.method()) {
            return next.run(request, extensions).await;
        }
        let key = match request.headers().get(&settings.header) {
            Some(key) => String::from_utf8_lossy(key.as_bytes()).into_owned(),
            None => {
                let key = uuid::Uuid::new_v4().to_string();
                let value =
                    HeaderValue::from_str(&key).map_err(reqwest_middleware::Error::middleware)?;
                request.headers_mut().insert(settings.header.clone(), value);
                key
            }
        };
        // One span per logical request, and one per attempt inside it: the key is never shown
        // (a key replays its answer to whoever sends it), only a digest of it, which ties the
        // attempts of one key together across a client's and a server's logs.
        let span = tracing::info_span!(
            "idempotent_request",
            method = %request.method(),
            host = request.url().host_str().unwrap_or(""),
            path = request.url().path(),
            key_digest = %key_digest(&key),
            attempts = tracing::field::Empty,
            status = tracing::field::Empty,
            replayed = tracing::field::Empty,
        );
        let deadline = Instant::now() + settings.deadline;
        let mut attempts = 0;
        // Each attempt but the last sends a copy; the last sends the request itself. A body that
        // cannot be copied (a stream) is refused at the first attempt, before anything is sent.
        let mut request = Some(request);
        let request_span = span.clone();
        async move {
            loop {
                attempts += 1;
                let last = attempts >= settings.max_attempts;
                let this = match request.as_ref() {
                    Some(_) if last => request.take(),
                    Some(original) => original.try_clone(),
                    None => None,
                };
                let Some(this) = this else {
                    return Err(reqwest_middleware::Error::middleware(
                        ClientError::BodyNotReplayable,
                    ));
                };
                let attempt = tracing::debug_span!(
                    "attempt",
                    n = attempts,
                    status = tracing::field::Empty,
                    retry_in_ms = tracing::field::Empty,
                );
                request_span.record("attempts", attempts);
                let sent = tokio::time::timeout_at(
                    deadline,
                    next.clone()
                        .run(this, extensions)
                        .instrument(attempt.clone()),
                )
                .await;
                let wait = match sent {
                    Err(_) => {
                        return Err(reqwest_middleware::Error::middleware(
                            ClientError::DeadlineExceeded {
                                key,
                                attempts,
                                deadline: settings.deadline,
                            },
                        ));
                    }
                    Ok(Ok(mut response)) => {
                        attempt.record("status", response.status().as_u16());
                        let verdict =
                            classify(settings.profile, response.status(), response.headers());
                        let wait = match verdict {
                            Verdict::Final => None,
                            Verdict::Retry { after: Some(after) }
                                if after > settings.max_retry_after =>
                            {
                                None
                            }
                            Verdict::Retry { after } => {
                                Some(after.unwrap_or_else(|| self.backoff(attempts)))
                            }
                        };
                        match wait {
                            Some(wait) if !last && Instant::now() + wait < deadline => {
                                attempt.record("retry_in_ms", wait.as_millis() as u64);
                                tracing::debug!(
                                    parent: &attempt,
                                    status = response.status().as_u16(),
                                    "not final; sending again with the same key"
                                );
                                wait
                            }
                            _ => {
                                let replayed = response.headers().contains_key(IDEMPOTENT_REPLAYED);
                                request_span.record("status", response.status().as_u16());
                                request_span.record("replayed", replayed);
                                response.extensions_mut().insert(Attempts {
                                    key,
                                    attempts,
                                    replayed,
                                });
                                return Ok(response);
                            }
                        }
                    }
                    Ok(Err(error)) => {
                        let wait = self.backoff(attempts);
                        if no_answer(&error).is_none() {
                            return Err(error);
                        }
                        if last || Instant::now() + wait >= deadline {
                            let reqwest_middleware::Error::Reqwest(source) = error else {
                                return Err(error);
                            };
                            return Err(reqwest_middleware::Error::middleware(
                                ClientError::GaveUp {
                                    key,
                                    attempts,
                                    source,
                                },
                            ));
                        }
                        attempt.record("retry_in_ms", wait.as_millis() as u64);
                        tracing::debug!(
                            parent: &attempt,
                            error = %error,
                            "no answer; sending again with the same key"
                        );
                        wait
                    }
                };
                tokio::time::sleep(wait).await;
            }
        }
        .instrument(span)
        .await
    }
}

/// The first 16 hex digits of the SHA-256 of `key`: names a key in logs without showing it.
fn key_digest(key: &str) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(key.as_bytes());
    digest[..8]
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}
