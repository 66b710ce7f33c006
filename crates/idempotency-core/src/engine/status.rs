//! [`Engine::status`]: what became of a key, without sending its request again.

use super::Engine;
use super::protocol::TRANSACTION_RETRY_AFTER;
use super::replayed::{answered_ago, dates};
use crate::error::StoreError;
use crate::key::IdempotencyKey;
use crate::scope::Scope;
use crate::store::IdempotencyStore;
use crate::store::{RecordState, StoreOp};
use http::StatusCode;
use std::time::{Duration, SystemTime};

/// What became of a key, as [`Engine::status`] reads it. Never the stored body or headers: a
/// replay (the request sent again with its key) is what gives those.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyStatus {
    /// The key has no live record in this scope and no request holds it: never used,
    /// expired, released after a failure or rollback (its request may be sent again and runs).
    Absent,
    /// A request with the key is running (a lease-mode claim).
    InFlight {
        /// Time left on its lease, by the store's clock; its heartbeat extends it while it runs.
        lease_remaining: Duration,
        /// When to ask again: the lease's time left, at most
        /// [`EngineConfig::in_flight_retry_after`](crate::EngineConfig#structfield.in_flight_retry_after).
        retry_after: Duration,
    },
    /// A request with the key is running in a one-transaction mode: its open transaction
    /// holds the key, and its record exists only from its commit (sent again, the request
    /// waits for it or is answered in flight). It has no lease whose end could be told.
    InTransaction {
        /// When to ask again: such handlers take milliseconds; at most
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
    /// In the one-transaction modes a key without a record is also looked for among the keys
    /// that open request transactions hold (a second read, only then), so a running request
    /// reads [`KeyStatus::InTransaction`] rather than absent.
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
            None if self.held_by_transaction(scope, key).await? => KeyStatus::InTransaction {
                retry_after: TRANSACTION_RETRY_AFTER.min(shared.config.in_flight_retry_after),
            },
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

impl<S: IdempotencyStore + 'static> Engine<S> {
    /// In a one-transaction mode, whether an open request transaction holds the key (one
    /// bounded read); `false` in the lease mode, whose running requests have records.
    async fn held_by_transaction(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
    ) -> Result<bool, StoreError> {
        let shared = &self.shared;
        if !shared.config.claim_mode.is_one_transaction() {
            return Ok(false);
        }
        let Some(store) = shared.store.transactional() else {
            return Ok(false);
        };
        shared
            .call(StoreOp::Get, store.held_by_transaction(scope, key))
            .await
    }
}
