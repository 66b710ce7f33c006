//! The payments service: `POST /charges` records one charge per run, in the request's
//! transaction, behind the idempotency layer. A charge that runs twice shows as two rows of
//! one reference in `charges`: payments' own count.

use crate::{CALLER_HEADER, Charge, DemoError, OrderRequest, quoted_schema, service_layer};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use bytes::Bytes;
use idempotency::{PostgresTransaction, Tx};
use std::sync::Arc;
use std::time::Duration;
use uuid::Uuid;

/// Payments' key table, in the demo's schema.
pub const KEY_TABLE: &str = "payments_keys";

/// Payments on the store of `schema` (its key table [`KEY_TABLE`], migrated), for
/// [`axum::serve()`].
pub async fn router(database_url: &str, schema: &str) -> Result<Router, DemoError> {
    let insert = format!(
        "INSERT INTO {}.charges (id, reference, amount) VALUES ($1, $2, $3)",
        quoted_schema(schema)?
    );
    let layer = service_layer(database_url, schema, KEY_TABLE, CALLER_HEADER)
        .await?
        .lease(Duration::from_secs(10))
        .build()?;
    Ok(Router::new()
        .route("/charges", post(charge))
        .route_layer(layer)
        .with_state(Arc::from(insert)))
}

/// Charges the amount: one row in `charges`, committed with the stored answer.
async fn charge(
    State(insert): State<Arc<str>>,
    tx: Tx<PostgresTransaction>,
    body: Bytes,
) -> Response {
    let Ok(asked) = serde_json::from_slice::<OrderRequest>(&body) else {
        return (StatusCode::UNPROCESSABLE_ENTITY, "not a charge request").into_response();
    };
    let charge = Charge {
        id: Uuid::new_v4(),
        reference: asked.reference,
        amount: asked.amount,
    };
    match tx
        .execute(&*insert, &[&charge.id, &charge.reference, &charge.amount])
        .await
    {
        Ok(_) => (StatusCode::CREATED, Json(charge)).into_response(),
        Err(e) => {
            tracing::warn!(error = %e, "the charge was not recorded");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                [("retry-after", "1")],
                "the charge was not recorded",
            )
                .into_response()
        }
    }
}
