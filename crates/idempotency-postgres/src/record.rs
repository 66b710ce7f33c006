//! Reading a record back from the columns every read of the store selects, as either driver
//! read them.

use crate::error::BACKEND;
use bytes::Bytes;
use idempotency_core::store::{CorruptRecord, Record, RecordState};
use idempotency_core::{Fingerprint, StoreError, StoredResponse};
use std::time::Duration;

/// A record's columns, in the order the statements select them (`RECORD_COLUMNS`), as either
/// driver read them.
pub(crate) struct RecordColumns<'a> {
    pub(crate) request_hash: &'a [u8],
    pub(crate) in_flight: bool,
    /// The lease left while in flight, the retention left once completed.
    pub(crate) remaining_ms: i64,
    pub(crate) response: Option<Vec<u8>>,
}

/// A column that could not be read as its type.
pub(crate) fn corrupt_field(what: &'static str) -> StoreError {
    StoreError::corrupt(BACKEND, CorruptRecord::Field(what))
}

impl RecordColumns<'_> {
    /// The record these columns hold.
    pub(crate) fn into_record(self) -> Result<Record, StoreError> {
        let fingerprint = Fingerprint::from_bytes(self.request_hash)
            .map_err(|e| StoreError::corrupt(BACKEND, e))?;
        let remaining = Duration::from_millis(self.remaining_ms.max(0) as u64);
        let state = match (self.in_flight, self.response) {
            (true, None) => RecordState::InFlight {
                lease_remaining: remaining,
            },
            (false, Some(bytes)) => RecordState::Completed {
                response: StoredResponse::decode(Bytes::from(bytes))
                    .map_err(|e| StoreError::corrupt(BACKEND, e))?,
                retention_remaining: remaining,
            },
            _ => {
                return Err(corrupt_field("a row must be either in flight or completed"));
            }
        };
        Ok(Record { fingerprint, state })
    }
}
