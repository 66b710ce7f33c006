//! The cases, by topic. Each takes the store under test and panics with a message naming the
//! violated invariant (numbered as in the [`IdempotencyStore`] docs). The list that the macros
//! expand is `crate::__with_cases!`; a test checks that it names exactly the public functions of
//! these files.

mod claim;
mod engine;
mod expiry;
mod fencing;
mod once;
mod replay;
mod wake;

pub use claim::*;
pub use engine::*;
pub use expiry::*;
pub use fencing::*;
pub use once::*;
pub use replay::*;
pub use wake::*;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode, header};
use idempotency_core::store::{ClaimOutcome, FenceOutcome, Record, RecordState};
use idempotency_core::{
    Begin, BodyCanonicalization, Completion, Engine, EngineConfig, Fingerprint, Guard,
    IdempotencyKey, IdempotencyStore, KeyFormat, KeyStatus, LeaseToken, ReplayPolicy, Scope,
    StoredResponse,
};
use std::sync::Arc;
use std::time::Duration;

/// A lease long enough never to run out during a case.
pub(crate) const LONG: Duration = Duration::from_secs(300);
/// A lease or retention short enough to run out during a case.
const SHORT: Duration = Duration::from_millis(400);
/// How long to wait for a SHORT period to have passed by every store's clock.
const PAST_SHORT: Duration = Duration::from_millis(1200);

pub(crate) fn scope(case: &str) -> Scope {
    Scope::new(format!("conformance:{case}:{}", uuid::Uuid::new_v4()))
        .expect("a generated scope is valid")
}

pub(crate) fn key() -> IdempotencyKey {
    IdempotencyKey::parse(
        uuid::Uuid::new_v4().to_string().as_bytes(),
        KeyFormat::UuidV4,
    )
    .expect("a generated UUID v4 is a valid key")
}

pub(crate) fn fingerprint(body: &str) -> Fingerprint {
    Fingerprint::of_request("POST", "/tasks", body.as_bytes(), BodyCanonicalization::Raw)
}

pub(crate) fn response(status: u16, body: &'static [u8]) -> StoredResponse {
    let mut headers = HeaderMap::new();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    StoredResponse::new(
        StatusCode::from_u16(status).expect("valid status"),
        headers,
        Bytes::from_static(body),
    )
}

async fn claim<S: IdempotencyStore + ?Sized>(
    store: &S,
    scope: &Scope,
    key: &IdempotencyKey,
    fp: &Fingerprint,
    token: LeaseToken,
    lease: Duration,
) -> ClaimOutcome {
    store
        .claim(scope, key, fp, token, lease)
        .await
        .expect("invariant 8: claim must not fail against a healthy store")
}

async fn must_claim<S: IdempotencyStore + ?Sized>(
    store: &S,
    scope: &Scope,
    key: &IdempotencyKey,
    fp: &Fingerprint,
    lease: Duration,
) -> LeaseToken {
    let token = LeaseToken::new();
    let outcome = claim(store, scope, key, fp, token, lease).await;
    assert_eq!(
        outcome,
        ClaimOutcome::Claimed,
        "a free key must be claimable"
    );
    token
}

async fn get<S: IdempotencyStore + ?Sized>(
    store: &S,
    scope: &Scope,
    key: &IdempotencyKey,
) -> Option<Record> {
    store
        .get(scope, key)
        .await
        .expect("invariant 8: get must not fail against a healthy store")
}

async fn complete<S: IdempotencyStore + ?Sized>(
    store: &S,
    scope: &Scope,
    key: &IdempotencyKey,
    token: LeaseToken,
    response: &StoredResponse,
    retention: Duration,
) -> FenceOutcome {
    store
        .complete(scope, key, token, response, retention)
        .await
        .expect("invariant 8: complete must not fail against a healthy store")
}

async fn release<S: IdempotencyStore + ?Sized>(
    store: &S,
    scope: &Scope,
    key: &IdempotencyKey,
    token: LeaseToken,
) -> FenceOutcome {
    store
        .release(scope, key, token)
        .await
        .expect("invariant 8: release must not fail against a healthy store")
}

fn completed_response(record: Option<Record>) -> StoredResponse {
    match record {
        Some(Record {
            state: RecordState::Completed { response, .. },
            ..
        }) => response,
        other => panic!("expected a completed record, got {other:?}"),
    }
}
