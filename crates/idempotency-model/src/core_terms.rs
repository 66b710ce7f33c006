//! The model's records and responses in core's own types, so that the decisions the model
//! takes are core's functions ([`idempotency_core::protocol`]) applied to core's values.

use crate::state::{Made, Outcome, Record};
use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use idempotency_core::store::{self, RecordState};
use idempotency_core::{FINGERPRINT_LEN, Fingerprint, Replayed, StoredResponse};
use std::time::Duration;

/// How long the engine keeps responses (any value: the model has no clock).
pub(crate) const RETENTION: Duration = Duration::from_secs(86_400);
/// The lease a live claim reports.
const LEASE: Duration = Duration::from_secs(15);

/// The fingerprint of request body `body`.
pub(crate) fn fingerprint(body: u8) -> Fingerprint {
    let mut bytes = [body; FINGERPRINT_LEN];
    bytes[0] = 1; // SHA-256 of the raw body
    match Fingerprint::from_bytes(&bytes) {
        Ok(fingerprint) => fingerprint,
        Err(error) => unreachable!("a well-formed fingerprint was refused: {error}"),
    }
}

/// What a handler's stored response looks like in the store: its status, and the body it was
/// made for in its body.
pub(crate) fn response(made: Made) -> StoredResponse {
    let status = match made.outcome {
        Outcome::Created => StatusCode::CREATED,
        Outcome::Refused => StatusCode::CONFLICT,
        Outcome::Failed | Outcome::Garbage => {
            unreachable!("only created and refused outcomes are stored")
        }
    };
    StoredResponse::new(status, HeaderMap::new(), Bytes::from(vec![made.body]))
}

/// A replay read back in the model's terms.
pub(crate) fn made(replayed: &Replayed) -> Made {
    let outcome = if replayed.status() == StatusCode::CREATED {
        Outcome::Created
    } else {
        Outcome::Refused
    };
    let body = replayed.body().first().copied().unwrap_or(u8::MAX);
    Made { outcome, body }
}

/// The key's live record as a store returns it to the engine; `None` when it has none (free,
/// or a claim whose lease ran out, which a claim takes over).
pub(crate) fn live(record: Record) -> Option<store::Record> {
    match record {
        Record::Free | Record::Claimed { expired: true, .. } => None,
        Record::Claimed { body, .. } => Some(store::Record {
            fingerprint: fingerprint(body),
            state: RecordState::InFlight {
                lease_remaining: LEASE,
            },
        }),
        Record::Completed(made) => Some(store::Record {
            fingerprint: fingerprint(made.body),
            state: RecordState::Completed {
                response: response(made),
                retention_remaining: RETENTION,
            },
        }),
    }
}
