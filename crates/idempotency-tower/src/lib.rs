#![doc = include_str!("../README.md")]
//!
//! # What it answers
//! | situation | response |
//! | --- | --- |
//! | method not covered (GET, HEAD, ...), or [`cover_if`](IdempotencyLayerBuilder::cover_if) says no | passed through untouched |
//! | key missing (when required), malformed, repeated | 400 problem+json |
//! | no scope (no authenticated caller) | 401 problem+json |
//! | same key, request still running | 409 problem+json, `Retry-After` from the remaining lease |
//! | same key, different request | 422 problem+json (Stripe profile: 400 in Stripe's error envelope) |
//! | same key, same request, completed | the stored status, headers, body + `Idempotent-Replayed: true`, `Idempotency-Original-Date`, `Idempotency-Key-Expires` |
//! | request body over the limit | 413 problem+json, nothing stored |
//! | handler returns a status the policy does not store (5xx), or marks its response [`NotStored`] / `Cache-Control: no-store` | passed through, key released |
//! | 400, 404, 405, 411, 413, 415 or 422 not marked [`Final`] (axum's extractors and router answer with these before the handler runs) | passed through, key released: the corrected retry runs |
//! | handler panics | 500 problem+json, key released |
//! | handler (or its response body) slower than its lease | the heartbeat extends the lease until the response is stored; retries get 409 |
//! | storing the response fails | the response goes out; the key stays claimed and the response is stored in the background |
//! | the request's transaction does not commit | 503 `not-committed` (none of its writes exist; the retry runs), or 409 if its lease was taken over |
//! | the request's `COMMIT` is not confirmed (a timeout, a lost connection) | 503 `outcome-unknown`: retried with the same key, it replays if the commit happened, runs if not |
//! | store unreachable or slower than its timeout | 503 problem+json + `Retry-After` (or run anyway with `fail_open`) |
//!
//! What became of a key, without sending it again: [`IdempotencyLayer::key_status_service`], a
//! route of your choosing that answers a caller about its own keys only.
//!
//! Refusals are RFC 9457 problem+json by default; [`Profile::Stripe`] writes Stripe's error
//! envelope, and [`render_refusals`](IdempotencyLayerBuilder::render_refusals) any shape.
//!
//! A client that disconnects does not cut the handler's side effect in half: the handler runs
//! inline, and is moved to its own task if the request future is dropped; its response is still
//! stored for the retry. A server's graceful shutdown awaits
//! [`IdempotencyLayer::drain`] so that such handlers finish before the process exits.
//!
//! # Which requests
//! The key comes from the `Idempotency-Key` header or [`key_with`](IdempotencyLayerBuilder::key_with);
//! "the same request" is method, path and query as the client sent them (under axum's `nest`,
//! with the prefix) and the canonical JSON body, or what
//! [`fingerprint_with`](IdempotencyLayerBuilder::fingerprint_with) says. The inner service gets a
//! [`RequestBody`]; the layer accepts any request body type, hyper's `Incoming` included.
//!
//! # What the handler sees
//! The request extensions of a request that holds its key carry its
//! [`KeyClaim`](idempotency_core::KeyClaim) (key, scope, fencing token, `lost()`), and on a
//! transactional store (PostgreSQL) its
//! [`TransactionSlot`](idempotency_core::TransactionSlot): writes made in it commit together with
//! the stored response. With the `axum` feature, [`Claim`] (`Claim(claim): Claim`) and
//! `Tx<PostgresTransaction>` are extractors.
//!
//! # Observability
//! A `tracing` span `idempotency` per covered request with a hash of the scope and key (never
//! the key or the body), the route axum matched, and its outcome. `metrics` counters
//! `idempotency_requests_total{outcome, route}`
//! (`executed`, `replayed`, `conflict`, `mismatch`, `key_missing`, `key_invalid`,
//! `scope_missing`, `body_too_large`, `store_error`, ...), `idempotency_completions_total{result}`
//! (`stored`, `released`, `stale`, `error`), `idempotency_store_errors_total{backend, op}`, and
//! the histogram `idempotency_store_duration_seconds{backend, op}`.

mod body;
mod config;
mod detach;
#[cfg(feature = "axum")]
mod extract;
mod key_status;
mod layer;
mod refusal;
mod route;
mod service;

pub use body::{BoxError, IdempotencyBody, RequestBody};
#[cfg(feature = "axum")]
pub use extract::{Claim, KeyClaimRejection, Tx, TxRejection};
pub use key_status::KeyStatusService;
pub use layer::{IdempotencyLayer, IdempotencyLayerBuilder, ScopeNotSet, ScopeSet};
pub use refusal::{Profile, Refusal, RefusalKind, RenderRefusal, problem_json, stripe_error};
pub use service::IdempotencyService;
pub use service::{Final, NotStored};
