//! What the tables' tests and their schedule-checked tests share: a request's fingerprint and
//! a response to store.

use super::Duration;
use bytes::Bytes;
use idempotency_core::http::{HeaderMap, StatusCode};
use idempotency_core::{BodyCanonicalization, Fingerprint, StoredResponse};

/// A retention long enough that nothing expires during a test.
pub(super) const HOUR: Duration = Duration::from_secs(3600);

/// The fingerprint every test request has.
pub(super) fn fingerprint() -> Fingerprint {
    Fingerprint::of_request("POST", "/", b"", BodyCanonicalization::Raw)
}

/// The response every test request stores.
pub(super) fn response() -> StoredResponse {
    StoredResponse::new(
        StatusCode::OK,
        HeaderMap::new(),
        Bytes::from_static(b"done"),
    )
}
