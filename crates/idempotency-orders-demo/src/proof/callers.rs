//! The callers: each logical order sent with one key of its own through
//! [`idempotency-client`](idempotency_client), retried by the protocol until it has a final
//! answer.

use crate::orders::USER_HEADER;
use crate::{DemoError, OrderRequest};
use bytes::Bytes;
use idempotency::IDEMPOTENT_REPLAYED;
use idempotency_client::{Attempts, IdempotentRetry};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// The user every order is sent as (the orders service's scope).
pub(crate) const USER: &str = "shop";

/// One logical order and what its caller ended with.
#[derive(Clone, Debug)]
pub(crate) struct Answer {
    /// What was asked.
    pub(crate) request: OrderRequest,
    /// The key every attempt carried.
    pub(crate) key: String,
    /// The final answer, or why there was none.
    pub(crate) outcome: Result<Final, String>,
}

/// A final answer.
#[derive(Clone, Debug)]
pub(crate) struct Final {
    /// Its status.
    pub(crate) status: u16,
    /// Its body.
    pub(crate) body: Bytes,
    /// How many times the order was sent.
    pub(crate) attempts: u32,
    /// Whether it was a replay (the order ran on an attempt whose answer was lost).
    pub(crate) replayed: bool,
}

/// Sends `orders` orders to `url` from `callers` callers at once; every caller retries each
/// order until it has a final answer, within 120 s.
pub(crate) async fn send_all(
    orders: usize,
    callers: usize,
    url: &str,
) -> Result<Vec<Answer>, DemoError> {
    // One connection per attempt, so the proxy's turn decides each attempt's fate.
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(10))
        .build()?;
    let client = reqwest_middleware::ClientBuilder::new(http)
        .with(
            IdempotentRetry::builder()
                .max_attempts(200)
                .deadline(Duration::from_secs(120))
                .backoff(Duration::from_millis(10), Duration::from_millis(500))
                .max_retry_after(Duration::from_secs(10))
                .build(),
        )
        .build();
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..callers.max(1) {
        let (client, next, url) = (client.clone(), next.clone(), url.to_owned());
        tasks.push(tokio::spawn(async move {
            let mut answers = Vec::new();
            while next.fetch_add(1, Ordering::SeqCst) < orders {
                answers.push(send(&client, &url).await);
            }
            answers
        }));
    }
    let mut answers = Vec::with_capacity(orders);
    for task in tasks {
        answers.extend(
            task.await
                .map_err(|e| DemoError::OrdersProcess(format!("a caller failed: {e}")))?,
        );
    }
    Ok(answers)
}

async fn send(client: &reqwest_middleware::ClientWithMiddleware, url: &str) -> Answer {
    let request = OrderRequest {
        reference: uuid::Uuid::new_v4().to_string(),
        amount: 1_000 + i64::from(rand_cents()),
    };
    let key = uuid::Uuid::new_v4().to_string();
    let body = serde_json::to_vec(&request).unwrap_or_default();
    let sent = client
        .post(url)
        .header("idempotency-key", &key)
        .header(USER_HEADER, USER)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await;
    let outcome = match sent {
        Ok(response) => {
            let status = response.status().as_u16();
            let (attempts, replayed) = response
                .extensions()
                .get::<Attempts>()
                .map_or((0, false), |a| (a.attempts, a.replayed));
            match response.bytes().await {
                Ok(body) => Ok(Final {
                    status,
                    body,
                    attempts,
                    replayed,
                }),
                Err(e) => Err(format!("the answer's body was cut off: {e}")),
            }
        }
        Err(e) => Err(e.to_string()),
    };
    Answer {
        request,
        key,
        outcome,
    }
}

/// A few cents of variety, so two orders' bodies differ beside their reference.
fn rand_cents() -> u16 {
    uuid::Uuid::new_v4().as_bytes()[0].into()
}

/// What sending a key once more, straight to the service, answered: status, whether marked a
/// replay, body.
pub(crate) type Again = Result<(u16, bool, Bytes), String>;

/// Sends every answered order again with its key, straight to `url` (no proxy): each must
/// replay its first answer.
pub(crate) async fn send_again(answers: &[Answer], url: &str) -> Result<Vec<Again>, DemoError> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()?;
    let mut again = Vec::with_capacity(answers.len());
    for answer in answers {
        let body = serde_json::to_vec(&answer.request).unwrap_or_default();
        let sent = client
            .post(url)
            .header("idempotency-key", &answer.key)
            .header(USER_HEADER, USER)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await;
        again.push(match sent {
            Ok(response) => {
                let status = response.status().as_u16();
                let replayed = response.headers().contains_key(IDEMPOTENT_REPLAYED);
                response
                    .bytes()
                    .await
                    .map(|body| (status, replayed, body))
                    .map_err(|e| e.to_string())
            }
            Err(e) => Err(e.to_string()),
        });
    }
    Ok(again)
}
