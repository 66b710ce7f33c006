//! [`Engine::status`]: what became of a key, without sending its request again.

use super::Engine;
use super::replayed::{answered_ago, dates};
use crate::store::{RecordState, StoreOp};
use crate::{IdempotencyKey, IdempotencyStore, Scope, StoreError};
use http::StatusCode;
use std::time::{Duration, SystemTime};

/// What became of a key, as [`Engine::status`] reads it. Never the stored body or headers: a
/// replay (the request sent again with its key) is what gives those.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyStatus {
    /// The key has no live record in this scope: never used, expired, released after a
    /// failure or rollback (its request may be sent again and runs), or, in the
    /// one-transaction modes, held by a request whose transaction has not committed yet (its
    /// record exists only from its commit; sent again, the request waits for it or is answered
    /// in flight).
    Absent,
    /// A request with the key is running (a lease-mode claim).
    InFlight {
        /// Time left on its lease, by the store's clock; its heartbeat extends it while it runs.
        lease_remaining: Duration,
        /// When to ask again: the lease's time left, at most
        /// [`EngineConfig::in_flight_retry_after`](crate::EngineConfig#structfield.in_flight_retry_after).
        retry_after: Duration,
    },
    /// The key's request was answered and the answer is stored: sent again, it replays.
    Completed {
        /// The stored answer's status.
        status: StatusCode,
        /// How long ago it was first answered: the engine's retention less
        /// `expires_in` (zero for a record kept longer than today's retention).
        answered_ago: Duration,
        /// How long the key still replays it; after that the key is free.
        expires_in: Duration,
    },
}

impl KeyStatus {
    /// For a completed key: when it was first answered and when it expires, by this process's
    /// clock (read once for both).
    pub fn dates(&self) -> Option<(SystemTime, SystemTime)> {
        match self {
            KeyStatus::Completed {
                answered_ago,
                expires_in,
                ..
            } => Some(dates(*answered_ago, *expires_in)),
            _ => None,
        }
    }
}

impl<S: IdempotencyStore + 'static> Engine<S> {
    /// What became of `key` in `scope`: in flight, completed (its status, when it was first
    /// answered, when it expires) or absent. One read of the store, bounded by
    /// [`EngineConfig::store_timeout`](crate::EngineConfig#structfield.store_timeout); it claims
    /// nothing and changes nothing.
    ///
    /// A client told `503` with an unknown outcome asks this instead of sending the request
    /// again. `scope` must be the caller's own, taken from its credentials as for its requests:
    /// a key of another scope reads as absent, whatever it holds there.
    pub async fn status(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
    ) -> Result<KeyStatus, StoreError> {
        let shared = &self.shared;
        let record = shared
            .call(StoreOp::Get, shared.store.get(scope, key))
            .await?;
        Ok(match record.map(|record| record.state) {
            None => KeyStatus::Absent,
            Some(RecordState::InFlight { lease_remaining }) => KeyStatus::InFlight {
                lease_remaining,
                retry_after: lease_remaining.min(shared.config.in_flight_retry_after),
            },
            Some(RecordState::Completed {
                response,
                retention_remaining,
            }) => KeyStatus::Completed {
                status: response.status(),
                answered_ago: answered_ago(shared.config.retention, retention_remaining),
                expires_in: retention_remaining,
            },
        })
    }
}
