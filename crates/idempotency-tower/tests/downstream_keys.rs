//! Keys for the calls a handler makes to other services (`KeyClaim::derive_key`), through the
//! real layer on the memory store: a handler that charges a provider and then fails runs again
//! when its client retries, and the provider, which replays a repeated key, charges once; the
//! same client key from another user, or another step of the same handler, reaches the provider
//! with another key.
#![allow(clippy::unwrap_used)]

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::routing::post;
use http_body_util::BodyExt;
use idempotency_core::Scope;
use idempotency_memory::MemoryStore;
use idempotency_tower::{Claim, IdempotencyLayer};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tower::ServiceExt;

const KEY: &str = "8e03978e-40d5-43e8-bc93-6894a57f9324";

/// A payment provider that keeps its own idempotency keys: a repeated key gets the first
/// charge's id back, a new one charges.
#[derive(Default)]
struct Provider {
    charges: Mutex<HashMap<String, usize>>,
    charged: AtomicUsize,
    calls: Mutex<Vec<String>>,
}

impl Provider {
    fn charge(&self, idempotency_key: &str) -> usize {
        self.calls.lock().unwrap().push(idempotency_key.to_owned());
        *self
            .charges
            .lock()
            .unwrap()
            .entry(idempotency_key.to_owned())
            .or_insert_with(|| self.charged.fetch_add(1, Ordering::SeqCst) + 1)
    }
}

/// `/orders` charges (step `charge`) and then fails its first run after the charge (as a crash
/// between the charge and the order's commit would); `/refunds` charges and refunds (steps
/// `charge` and `refund`).
fn app(provider: &Arc<Provider>) -> Router {
    let runs = Arc::new(AtomicUsize::new(0));
    let orders = {
        let provider = provider.clone();
        move |Claim(claim): Claim| {
            let provider = provider.clone();
            let runs = runs.clone();
            async move {
                let charge = provider.charge(claim.derive_key("charge").as_str());
                if runs.fetch_add(1, Ordering::SeqCst) == 0 {
                    return (
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "failed after the charge".to_owned(),
                    );
                }
                (
                    StatusCode::CREATED,
                    format!("order paid by charge {charge}"),
                )
            }
        }
    };
    let refunds = {
        let provider = provider.clone();
        move |Claim(claim): Claim| {
            let provider = provider.clone();
            async move {
                let charge = provider.charge(claim.derive_key("charge").as_str());
                let refund = provider.charge(claim.derive_key("refund").as_str());
                (
                    StatusCode::CREATED,
                    format!("charge {charge}, refund {refund}"),
                )
            }
        }
    };
    Router::new()
        .route("/orders", post(orders))
        .route("/refunds", post(refunds))
        .route_layer(
            IdempotencyLayer::builder(MemoryStore::default())
                .scope_with(|parts| {
                    let user = parts.headers.get("x-user")?.to_str().ok()?;
                    Scope::new(user).ok()
                })
                .build()
                .expect("valid idempotency layer settings"),
        )
}

async fn send(app: &Router, path: &str, user: &str) -> (StatusCode, String) {
    let request = Request::post(path)
        .header("x-user", user)
        .header("idempotency-key", KEY)
        .body(Body::empty())
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test]
async fn a_handler_run_again_sends_the_same_key_and_the_provider_charges_once() {
    let provider = Arc::new(Provider::default());
    let app = app(&provider);

    let first = send(&app, "/orders", "alice").await;
    assert_eq!(first.0, StatusCode::INTERNAL_SERVER_ERROR, "{first:?}");
    // The failure released the key: the client's retry runs the handler again.
    let retry = send(&app, "/orders", "alice").await;
    assert_eq!(
        retry,
        (StatusCode::CREATED, "order paid by charge 1".to_owned())
    );
    let replay = send(&app, "/orders", "alice").await;
    assert_eq!(replay, retry, "the stored answer, without a third run");

    let calls = provider.calls.lock().unwrap().clone();
    assert_eq!(calls.len(), 2, "two runs, two calls: {calls:?}");
    assert_eq!(calls[0], calls[1], "one key for both runs");
    assert_eq!(provider.charged.load(Ordering::SeqCst), 1, "charged once");
    assert!(!calls[0].contains(KEY) && !calls[0].contains("8e03978e"));
}

#[tokio::test]
async fn another_user_or_another_step_reaches_the_provider_with_another_key() {
    let provider = Arc::new(Provider::default());
    let app = app(&provider);

    // Bob sent the same client key as Alice: his order is charged on its own.
    assert_eq!(
        send(&app, "/orders", "alice").await.0,
        StatusCode::INTERNAL_SERVER_ERROR
    );
    assert_eq!(
        send(&app, "/orders", "bob").await,
        (StatusCode::CREATED, "order paid by charge 2".to_owned())
    );
    // Two steps of one handler, two keys (on another route, the same client key).
    assert_eq!(
        send(&app, "/refunds", "carol").await,
        (StatusCode::CREATED, "charge 3, refund 4".to_owned())
    );
    let calls = provider.calls.lock().unwrap().clone();
    assert_eq!(calls.len(), 4, "{calls:?}");
    let distinct: std::collections::HashSet<_> = calls.iter().collect();
    assert_eq!(
        distinct.len(),
        4,
        "every user and step its own key: {calls:?}"
    );
}
