//! The orders service: `POST /orders` charges payments with the key derived from its own
//! request's, then writes the order in the request's transaction, behind the idempotency
//! layer. It can park itself at a point of a request ([`ParkAt`]) for the proof to SIGKILL it
//! there.

use crate::{CALLER_HEADER, Charge, DemoError, Order, OrderRequest, quoted_schema, service_layer};
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use bytes::Bytes;
use idempotency::{Claim, ClaimMode, IDEMPOTENT_REPLAYED, PostgresTransaction, Tx};
use idempotency_client::IdempotentRetry;
use reqwest_middleware::ClientWithMiddleware;
use std::io::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use uuid::Uuid;

/// Orders' key table, in the demo's schema.
pub const KEY_TABLE: &str = "orders_keys";
/// The header that names the caller (the orders service's scope).
pub const USER_HEADER: &str = "x-user";
/// What the process prints (a line on stdout) when it parks for its SIGKILL.
pub const PARKED: &str = "parked for SIGKILL";

/// Where a request of this process stops for good, waiting to be killed: the `n`th (from 1)
/// to get there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParkAt {
    /// After its charge was answered, before the order is written and committed.
    AfterCharge(usize),
    /// After its order and answer committed, before the answer leaves the process.
    AfterCommit(usize),
}

/// Which key orders sends payments with a charge.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ChargeKey {
    /// `claim.derive_key("charge")`: the same on every run of one order.
    #[default]
    Derived,
    /// A fresh UUID on every run: the flaw the proof must catch (a run after a kill charges
    /// again).
    FreshEachRun,
}

/// How the orders service runs.
#[derive(Clone, Debug)]
pub struct OrdersConfig {
    /// The database of both the key table and the orders.
    pub database_url: String,
    /// The schema of the tables ([`crate::prepare_schema`]).
    pub schema: String,
    /// Payments' base URL (`http://host:port`).
    pub payments: String,
    /// The claim mode: the lease mode or the one-transaction mode (the speculative mode runs a
    /// handler's code for every duplicate up to its first statement, so not for a handler
    /// whose first act is a call to another service).
    pub claim_mode: ClaimMode,
    /// The lease of a key (the lease mode): how long a killed process's keys stay held.
    pub lease: Duration,
    /// Where to park for the SIGKILL, if anywhere.
    pub park: Option<ParkAt>,
    /// The charge's key: [`ChargeKey::Derived`] but to show the proof failing.
    pub charge_key: ChargeKey,
}

struct Orders {
    payments: ClientWithMiddleware,
    charges_url: String,
    insert: String,
    park: Option<ParkAt>,
    charge_key: ChargeKey,
    charged: AtomicUsize,
    committed: AtomicUsize,
}

/// Orders on `config`'s store (its key table [`KEY_TABLE`], migrated), for [`axum::serve()`].
pub async fn router(config: &OrdersConfig) -> Result<Router, DemoError> {
    let insert = format!(
        "INSERT INTO {}.orders (id, reference, amount, charge_id) VALUES ($1, $2, $3, $4)",
        quoted_schema(&config.schema)?
    );
    let layer = service_layer(&config.database_url, &config.schema, KEY_TABLE, USER_HEADER)
        .await?
        .claim_mode(config.claim_mode)
        .lease(config.lease)
        .build()?;
    // One connection per attempt, so a lossy proxy decides each attempt's fate; the same
    // key on every attempt, within 20 s.
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(5))
        .build()?;
    let retry = IdempotentRetry::builder()
        .max_attempts(40)
        .deadline(Duration::from_secs(20))
        .backoff(Duration::from_millis(5), Duration::from_millis(200))
        .build();
    let orders = Arc::new(Orders {
        payments: reqwest_middleware::ClientBuilder::new(http)
            .with(retry)
            .build(),
        charges_url: format!("{}/charges", config.payments.trim_end_matches('/')),
        insert,
        park: config.park,
        charge_key: config.charge_key,
        charged: AtomicUsize::new(0),
        committed: AtomicUsize::new(0),
    });
    Ok(Router::new()
        .route("/orders", post(create_order))
        .route_layer(layer)
        // Outside the layer: runs once the answer is committed and stored.
        .route_layer(middleware::from_fn_with_state(
            orders.clone(),
            park_after_commit,
        ))
        .with_state(orders))
}

/// Charges the order with the key derived from the request's, then writes the order in the
/// request's transaction: a run after a crash, a lapsed lease or on another instance sends
/// payments the same key, and payments answers with the first charge.
async fn create_order(
    State(orders): State<Arc<Orders>>,
    Claim(claim): Claim,
    tx: Tx<PostgresTransaction>,
    body: Bytes,
) -> Response {
    let Ok(asked) = serde_json::from_slice::<OrderRequest>(&body) else {
        return (StatusCode::UNPROCESSABLE_ENTITY, "not an order").into_response();
    };
    let charge_key = match orders.charge_key {
        ChargeKey::Derived => claim.derive_key("charge").as_str().to_owned(),
        ChargeKey::FreshEachRun => Uuid::new_v4().to_string(),
    };
    let charged = orders
        .payments
        .post(&orders.charges_url)
        .header("idempotency-key", charge_key)
        .header(CALLER_HEADER, "orders")
        .header("content-type", "application/json")
        .body(body.to_vec())
        .send()
        .await;
    let charge = match charged {
        Ok(answer) if answer.status() == reqwest::StatusCode::CREATED => {
            let body = match answer.bytes().await {
                Ok(body) => body,
                Err(e) => return unavailable(&format!("payments' answer was cut off: {e}")),
            };
            match serde_json::from_slice::<Charge>(&body) {
                Ok(charge) => charge,
                Err(e) => {
                    return (
                        StatusCode::BAD_GATEWAY,
                        format!("payments' answer is not a charge: {e}"),
                    )
                        .into_response();
                }
            }
        }
        // Payments said no: its answer, as it is, is this order's (not stored: a 502).
        Ok(answer) => {
            let status = answer.status();
            return (
                StatusCode::BAD_GATEWAY,
                format!("payments answered {status}"),
            )
                .into_response();
        }
        // Whether payments charged is unknown; the retry sends the same charge key.
        Err(e) => return unavailable(&format!("payments did not answer: {e}")),
    };
    if orders.park == Some(ParkAt::AfterCharge(next(&orders.charged))) {
        park("after the charge").await;
    }
    let order = Order {
        id: Uuid::new_v4(),
        reference: asked.reference,
        amount: asked.amount,
        charge_id: charge.id,
    };
    match tx
        .execute(
            &orders.insert,
            &[&order.id, &order.reference, &order.amount, &order.charge_id],
        )
        .await
    {
        Ok(_) => (StatusCode::CREATED, Json(order)).into_response(),
        Err(e) => unavailable(&format!("the order was not written: {e}")),
    }
}

/// After the layer stored a first answer (not a replay), parks the `n`th such request.
async fn park_after_commit(
    State(orders): State<Arc<Orders>>,
    request: Request,
    next_service: Next,
) -> Response {
    let response = next_service.run(request).await;
    let first = response.status() == StatusCode::CREATED
        && !response.headers().contains_key(IDEMPOTENT_REPLAYED);
    if first
        && let Some(ParkAt::AfterCommit(n)) = orders.park
        && next(&orders.committed) == n
    {
        park("after the commit").await;
    }
    response
}

/// The count `counter` reaches with this request (from 1).
fn next(counter: &AtomicUsize) -> usize {
    counter.fetch_add(1, Ordering::SeqCst) + 1
}

/// Says so on stdout and waits for the SIGKILL, for ever.
async fn park(point: &str) {
    {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{PARKED}: {point}");
        let _ = out.flush();
    }
    std::future::pending::<()>().await;
}

/// `503` with `Retry-After: 1`: not stored, so the caller's retry runs the order again.
fn unavailable(why: &str) -> Response {
    tracing::warn!(why, "an order answered 503");
    (
        StatusCode::SERVICE_UNAVAILABLE,
        [("retry-after", "1")],
        why.to_owned(),
    )
        .into_response()
}
