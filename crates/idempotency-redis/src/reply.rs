//! Reading the Lua scripts' replies. The tags are named the same way in `lua/claim.lua` and
//! `lua/get.lua`; a test checks that both sides agree.

use crate::error::{BACKEND, corrupt};
use bytes::Bytes;
use idempotency_core::store::{Record, RecordState};
use idempotency_core::{Fingerprint, StoreError, StoredResponse};
use redis::Value;
use std::time::Duration;

/// `{CLAIMED}`: the key was free (or already this token's) and is now claimed.
pub(crate) const CLAIMED: i64 = 1;
/// `{IN_FLIGHT, fp, pttl}`: another request holds the key; its lease has `pttl` ms left.
pub(crate) const IN_FLIGHT: i64 = 2;
/// `{COMPLETED, fp, resp, pttl}`: the request completed with the stored response `resp`; the
/// record expires in `pttl` ms.
pub(crate) const COMPLETED: i64 = 3;

fn bytes_of(value: Value) -> Result<Vec<u8>, StoreError> {
    match value {
        Value::BulkString(bytes) => Ok(bytes),
        _ => Err(corrupt("expected a bulk string")),
    }
}

/// Reads the rest of an `{IN_FLIGHT, fp, pttl}` or `{COMPLETED, fp, resp, pttl}` reply.
pub(crate) fn record_from_reply(
    mut items: std::vec::IntoIter<Value>,
    tag: i64,
) -> Result<Record, StoreError> {
    let fp = bytes_of(items.next().ok_or(corrupt("missing fingerprint"))?)?;
    let fingerprint = Fingerprint::from_bytes(&fp).map_err(|e| StoreError::corrupt(BACKEND, e))?;
    let state = match (tag, items.next()) {
        (IN_FLIGHT, Some(Value::Int(pttl))) => RecordState::InFlight {
            lease_remaining: Duration::from_millis(pttl.max(0) as u64),
        },
        (COMPLETED, Some(resp)) => {
            let Some(Value::Int(pttl)) = items.next() else {
                return Err(corrupt("a completed reply must end with its TTL"));
            };
            RecordState::Completed {
                response: StoredResponse::decode(Bytes::from(bytes_of(resp)?))
                    .map_err(|e| StoreError::corrupt(BACKEND, e))?,
                retention_remaining: Duration::from_millis(pttl.max(0) as u64),
            }
        }
        _ => return Err(corrupt("unexpected script reply")),
    };
    Ok(Record { fingerprint, state })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Lua scripts name their reply tags with the same numbers as this module.
    #[test]
    fn the_scripts_and_the_reader_agree_on_the_tags() {
        let line = "local CLAIMED, IN_FLIGHT, COMPLETED = 1, 2, 3";
        assert_eq!(
            line,
            format!("local CLAIMED, IN_FLIGHT, COMPLETED = {CLAIMED}, {IN_FLIGHT}, {COMPLETED}")
        );
        for (name, script) in [
            ("claim", crate::scripts::CLAIM),
            ("get", crate::scripts::GET),
        ] {
            assert!(
                script.contains(line),
                "lua/{name}.lua must declare `{line}`"
            );
        }
    }
}
