//! Two services behind the idempotency layer, end to end: the proof that a retried order is
//! created once and charged once when the network loses requests and answers and the service
//! that charges is killed in the middle of a request.
//!
//! - **payments** (`POST /charges`): records a charge in the request's transaction, behind the
//!   layer (scoped by the calling service).
//! - **orders** (`POST /orders`): charges payments through
//!   [`idempotency-client`](idempotency_client) with the key derived from its own request's
//!   ([`KeyClaim::derive_key`](idempotency::KeyClaim::derive_key)`("charge")`), then writes the
//!   order in the request's transaction. It runs as a process of its own, so it can be
//!   SIGKILLed between the charge and its commit, and after the commit before its answer leaves.
//! - [`proof`]: callers send orders through a [`LossyProxy`](proxy::LossyProxy) to orders,
//!   whose calls to payments go through another; the orders process is killed and restarted on
//!   a schedule; then every order is checked against both services' tables.
//!
//! ```no_run
//! # async fn run() -> Result<(), idempotency_orders_demo::DemoError> {
//! use idempotency_orders_demo::proof::{self, ProofConfig};
//! let report = proof::run(&ProofConfig::new(
//!     "postgres://postgres@127.0.0.1:5432/postgres",
//!     std::env::current_exe()?,
//! ))
//! .await?;
//! assert!(report.failures().is_empty(), "{report}");
//! # Ok(()) }
//! ```
//!
//! From the command line: `cargo run -p idempotency-orders-demo -- prove`.

pub mod orders;
pub mod payments;
pub mod proof;
pub mod proxy;

use idempotency::postgres::tokio_postgres::{self, NoTls};
use idempotency::{IdempotencyLayer, PostgresStore, Scope, ScopeSet};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// The header orders sends to payments to say who calls: payments' scope, so another caller's
/// charge keys are kept apart.
pub const CALLER_HEADER: &str = "x-caller";

/// What a caller asks orders for, and orders asks payments to charge.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct OrderRequest {
    /// The caller's reference for this order (one per logical order).
    pub reference: String,
    /// The amount to charge, in cents.
    pub amount: i64,
}

/// A charge, as payments answers it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Charge {
    /// The charge's id.
    pub id: Uuid,
    /// The order's reference.
    pub reference: String,
    /// The amount charged, in cents.
    pub amount: i64,
}

/// An order, as orders answers it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Order {
    /// The order's id.
    pub id: Uuid,
    /// The caller's reference.
    pub reference: String,
    /// The amount, in cents.
    pub amount: i64,
    /// The charge that paid for it.
    pub charge_id: Uuid,
}

/// Why a service or the proof could not run.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// The database refused a statement or could not be reached.
    #[error("PostgreSQL: {0}")]
    Database(#[from] tokio_postgres::Error),
    /// The idempotency store could not be built or migrated.
    #[error("the idempotency store: {0}")]
    Store(#[from] idempotency::postgres::PostgresStoreError),
    /// The idempotency layer's settings cannot run on its store.
    #[error("the idempotency layer: {0}")]
    Config(#[from] idempotency::ConfigError),
    /// A socket or a child process failed.
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    /// An HTTP client could not be built.
    #[error("HTTP client: {0}")]
    Http(#[from] reqwest::Error),
    /// A name the demo makes up from its input is not a valid identifier.
    #[error("not a valid schema name: {0:?} (lowercase letters, digits and `_`)")]
    SchemaName(String),
    /// The orders process did not start or stopped on its own.
    #[error("the orders process: {0}")]
    OrdersProcess(String),
}

/// `schema` quoted, after checking it is a plain identifier (the demo builds SQL with it).
pub fn quoted_schema(schema: &str) -> Result<String, DemoError> {
    let plain = !schema.is_empty()
        && schema.len() <= 40
        && schema
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if plain {
        Ok(format!("\"{schema}\""))
    } else {
        Err(DemoError::SchemaName(schema.to_owned()))
    }
}

/// Creates `schema` and both services' business tables in it, if missing.
pub async fn prepare_schema(database_url: &str, schema: &str) -> Result<(), DemoError> {
    let s = quoted_schema(schema)?;
    let client = connect(database_url).await?;
    client
        .batch_execute(&format!(
            "CREATE SCHEMA IF NOT EXISTS {s}; \
             CREATE TABLE IF NOT EXISTS {s}.charges (id uuid PRIMARY KEY, \
               reference text NOT NULL, amount bigint NOT NULL); \
             CREATE TABLE IF NOT EXISTS {s}.orders (id uuid PRIMARY KEY, \
               reference text NOT NULL, amount bigint NOT NULL, charge_id uuid NOT NULL)"
        ))
        .await?;
    Ok(())
}

/// A service's idempotency layer: its key table `table` in `schema` (migrated), handlers
/// offered the request's transaction, each request scoped by the value of its header
/// `scope_header` (a request without it is refused with `401`).
pub(crate) async fn service_layer(
    database_url: &str,
    schema: &str,
    table: &str,
    scope_header: &'static str,
) -> Result<idempotency::IdempotencyLayerBuilder<PostgresStore, ScopeSet>, DemoError> {
    let store = PostgresStore::builder(database_url)
        .schema(schema)
        .table(table)
        .transactions(true)
        .build()
        .await?;
    store.migrate().await?;
    Ok(IdempotencyLayer::builder(store).scope_with(move |parts| {
        let value = parts.headers.get(scope_header)?.to_str().ok()?;
        Scope::new(value).ok()
    }))
}

/// A plain connection to `database_url` (no TLS: the demo runs on loopback), its driver task
/// spawned.
pub async fn connect(database_url: &str) -> Result<tokio_postgres::Client, DemoError> {
    let (client, connection) = tokio_postgres::connect(database_url, NoTls).await?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "a demo connection ended");
        }
    });
    Ok(client)
}
