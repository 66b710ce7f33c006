//! The SDK-like clients of the contention workload: one key per order, the same key on every
//! attempt, a share of first attempts cut off after a few milliseconds (a client timeout), and
//! retries with full-jitter backoff on what the protocol says to retry: a cut or refused
//! connection, the library's own retryable answers (`Idempotency-Refusal` on a `409`, `429` or
//! `503`, `Retry-After` honoured within the cap) and the handler's `503`.

use super::shop::NewOrder;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rand::{Rng, SeedableRng};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// The HTTP client the workload's clients share (keep-alive connections per instance).
pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// A new HTTP client.
pub fn http_client() -> HttpClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(64)
        .build(connector)
}

/// How the clients behave.
#[derive(Clone, Copy, Debug)]
pub struct ClientBehaviour {
    /// The share of first attempts cut off (the client's timeout fires).
    pub cut_share: f64,
    /// The shortest and longest cut-off.
    pub cut_after: (Duration, Duration),
    /// The first backoff; it doubles per attempt up to `backoff_cap` (full jitter).
    pub backoff: Duration,
    /// The longest backoff, and the longest `Retry-After` honoured.
    pub backoff_cap: Duration,
    /// The bound of one attempt that is not cut (a hung server).
    pub attempt_timeout: Duration,
}

impl Default for ClientBehaviour {
    fn default() -> Self {
        ClientBehaviour {
            cut_share: 0.25,
            cut_after: (Duration::from_millis(5), Duration::from_millis(50)),
            backoff: Duration::from_millis(10),
            backoff_cap: Duration::from_millis(250),
            attempt_timeout: Duration::from_secs(10),
        }
    }
}

/// What one attempt got.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// The handler's final answer (`201` or the stored refusal), first or replayed.
    Final {
        /// The status.
        status: u16,
        /// The body, byte for byte.
        body: Bytes,
        /// Whether it came as a replay (`Idempotent-Replayed: true`).
        replayed: bool,
    },
    /// An answer to retry: the library's retryable refusals and the handler's `503`.
    Retry {
        /// The status.
        status: u16,
        /// The library's refusal slug (`Idempotency-Refusal`), `None` for the handler's.
        refusal: Option<String>,
        /// `Retry-After`, in seconds.
        retry_after: Option<u64>,
    },
    /// An answer the protocol does not allow here (a `422` mismatch, a `500`): counted as a
    /// failure of the run.
    Unexpected {
        /// The status.
        status: u16,
        /// The body.
        body: Bytes,
    },
    /// The client cut the attempt off (its timeout), or the connection failed.
    Cut,
}

/// One attempt: when it started, how long it took, what it got.
#[derive(Clone, Debug)]
pub struct Attempt {
    /// When it was sent.
    pub sent: Instant,
    /// How long until its answer (or the cut).
    pub took: Duration,
    /// What it got.
    pub answer: Answer,
}

/// A logical order's life at one client: every attempt, in order.
#[derive(Clone, Debug)]
pub struct KeyLog {
    /// The idempotency key.
    pub key: String,
    /// The order sent with it.
    pub order: NewOrder,
    /// The attempts.
    pub attempts: Vec<Attempt>,
}

impl KeyLog {
    /// The first final answer, if any.
    pub fn first_final(&self) -> Option<(u16, &Bytes)> {
        self.finals().next()
    }

    /// Every final answer, first and replays.
    pub fn finals(&self) -> impl Iterator<Item = (u16, &Bytes)> {
        self.attempts.iter().filter_map(|a| match &a.answer {
            Answer::Final { status, body, .. } => Some((*status, body)),
            _ => None,
        })
    }

    /// When the first final answer came.
    pub fn answered_at(&self) -> Option<Instant> {
        self.attempts
            .iter()
            .find(|a| matches!(a.answer, Answer::Final { .. }))
            .map(|a| a.sent + a.took)
    }
}

/// The user every order is sent as (one scope: duplicates must meet).
pub const USER: &str = "contention-user";

/// Sends one attempt of `order` with `key` to `addr`, cut off after `cut` if set.
pub async fn attempt(
    client: &HttpClient,
    addr: SocketAddr,
    key: &str,
    body: &Bytes,
    cut: Option<Duration>,
    behaviour: &ClientBehaviour,
) -> Attempt {
    let sent = Instant::now();
    let bound = cut.unwrap_or(behaviour.attempt_timeout);
    let answer = match tokio::time::timeout(bound, send(client, addr, key, body)).await {
        Ok(Some(answer)) => answer,
        Ok(None) | Err(_) => Answer::Cut,
    };
    Attempt {
        sent,
        took: sent.elapsed(),
        answer,
    }
}

async fn send(client: &HttpClient, addr: SocketAddr, key: &str, body: &Bytes) -> Option<Answer> {
    let request = hyper::Request::post(format!("http://{addr}/orders"))
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .header("x-user", USER)
        .body(Full::new(body.clone()))
        .ok()?;
    let response = client.request(request).await.ok()?;
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = response.into_body().collect().await.ok()?.to_bytes();
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let refusal = header("idempotency-refusal").map(str::to_owned);
    let replayed = header("idempotent-replayed") == Some("true");
    let retry_after = header("retry-after").and_then(|v| v.parse().ok());
    Some(match (status, refusal) {
        (409 | 429 | 503, Some(refusal)) => Answer::Retry {
            status,
            refusal: Some(refusal),
            retry_after,
        },
        (503, None) => Answer::Retry {
            status,
            refusal: None,
            retry_after,
        },
        (201 | 409, None) => Answer::Final {
            status,
            body,
            replayed,
        },
        _ => Answer::Unexpected { status, body },
    })
}

/// The wait before the attempt after `failed` failed attempts: full jitter over an exponential
/// backoff, at least what `Retry-After` asked within the cap.
pub fn backoff(
    rng: &mut impl Rng,
    failed: u32,
    retry_after: Option<u64>,
    behaviour: &ClientBehaviour,
) -> Duration {
    let exp = behaviour
        .backoff
        .saturating_mul(1 << failed.min(16))
        .min(behaviour.backoff_cap);
    let jittered = exp.mul_f64(rng.random::<f64>());
    let asked = retry_after
        .map(Duration::from_secs)
        .unwrap_or_default()
        .min(behaviour.backoff_cap);
    jittered.max(asked.mul_f64(0.5 + rng.random::<f64>() / 2.0))
}

/// Sends `order` with `key` until a final answer comes or `deadline` passes, over `addrs` (the
/// attempts go round the instances). The first attempt is cut off with probability
/// `cut_share`.
pub async fn run_key(
    client: &HttpClient,
    addrs: &[SocketAddr],
    key: String,
    order: NewOrder,
    behaviour: ClientBehaviour,
    deadline: Instant,
) -> KeyLog {
    let body = Bytes::from(serde_json::to_vec(&order).unwrap_or_default());
    let mut log = KeyLog {
        key,
        order,
        attempts: Vec::new(),
    };
    let (mut rng, start) = {
        let mut rng = rand::rng();
        let start = rng.random_range(0..addrs.len().max(1));
        (rand::rngs::SmallRng::from_rng(&mut rng), start)
    };
    let mut failed = 0u32;
    loop {
        let cut = (log.attempts.is_empty() && rng.random_bool(behaviour.cut_share)).then(|| {
            let (low, high) = behaviour.cut_after;
            low + (high.saturating_sub(low)).mul_f64(rng.random::<f64>())
        });
        let addr = addrs[(start + log.attempts.len()) % addrs.len()];
        let sent = attempt(client, addr, &log.key, &body, cut, &behaviour).await;
        let retry_after = match &sent.answer {
            Answer::Retry { retry_after, .. } => *retry_after,
            _ => None,
        };
        let done = matches!(
            sent.answer,
            Answer::Final { .. } | Answer::Unexpected { .. }
        );
        log.attempts.push(sent);
        if done || Instant::now() >= deadline {
            return log;
        }
        tokio::time::sleep(backoff(&mut rng, failed, retry_after, &behaviour)).await;
        failed += 1;
    }
}
