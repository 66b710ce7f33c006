//! The protocol's decisions, as pure functions: what a record found for a key means, what a
//! store's answer to a completion or a release makes of the request's outcome, and what the
//! client is answered for it.
//!
//! The engine takes every one of these decisions through this module, and the model checker
//! (`crates/idempotency-model`) calls the same functions at the same steps while it explores
//! every order of the claim modes' steps and faults, so the model cannot drift from the code
//! at these points.
//!
//! ```
//! use idempotency_core::protocol::{self, Answer, Judged};
//! use idempotency_core::store::{Record, RecordState};
//! use idempotency_core::{Completion, Fingerprint, StoredResponse};
//! use std::time::Duration;
//!
//! let fingerprint = Fingerprint::from_bytes(&[1; idempotency_core::FINGERPRINT_LEN])?;
//! let response = StoredResponse::new(
//!     http::StatusCode::CREATED,
//!     http::HeaderMap::new(),
//!     bytes::Bytes::from_static(b"{}"),
//! );
//! let record = Record {
//!     fingerprint,
//!     state: RecordState::Completed {
//!         response,
//!         retention_remaining: Duration::from_secs(60),
//!     },
//! };
//! let retention = Duration::from_secs(86_400);
//! assert!(matches!(protocol::judge(record, &fingerprint, retention), Judged::Replay(_)));
//! // A completion whose store call failed keeps the claim: the client gets the handler's
//! // response, and the key is never freed while the side effect may stand.
//! let failed = idempotency_core::StoreError::from_failure("memory", true, "timed out");
//! assert_eq!(protocol::after_store(Err(&failed), true), Completion::Deferred);
//! assert_eq!(Completion::Deferred.answer(), Answer::HandlerResponse);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use super::completion::{Completion, RollbackCause, Superseded};
use super::replayed::Replayed;
use crate::error::StoreError;
use crate::fingerprint::Fingerprint;
use crate::store::{FenceOutcome, Record, RecordState};
use std::time::Duration;

/// The `Retry-After` hint for a duplicate of a request running in the one-transaction mode:
/// that request holds no lease whose end could be told, and such handlers take milliseconds.
pub(crate) const TRANSACTION_RETRY_AFTER: Duration = Duration::from_secs(1);

/// What a live record means for a request with a given fingerprint ([`judge`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Judged {
    /// Another request's record: answer 422, never its response.
    Mismatch,
    /// The same request, completed: replay it.
    Replay(Replayed),
    /// The same request, still running; its lease has this long left.
    Running(Duration),
}

/// The one rule for a live record found by a request with `fingerprint`, on an engine that
/// keeps responses for `retention`: the fingerprint first (whatever the record's state), then
/// completed or running.
#[inline]
pub fn judge(record: Record, fingerprint: &Fingerprint, retention: Duration) -> Judged {
    if record.fingerprint != *fingerprint {
        return Judged::Mismatch;
    }
    match record.state {
        RecordState::Completed {
            response,
            retention_remaining,
        } => Judged::Replay(Replayed::new(response, retention_remaining, retention)),
        RecordState::InFlight { lease_remaining } => Judged::Running(lease_remaining),
    }
}

/// How a request whose own record lost to another's is answered: as that record's duplicate.
#[inline]
pub fn superseded(judged: Judged) -> Superseded {
    match judged {
        Judged::Mismatch => Superseded::Mismatch,
        Judged::Replay(response) => Superseded::Replay(response),
        Judged::Running(retry_after) => Superseded::InFlight { retry_after },
    }
}

/// What a fenced store of the response (no transaction) makes of the request's outcome:
/// stored; the lease lost ([`Completion::Stale`]: the key is another's now); or the store
/// failed, and the claim is kept and storing retried in the background
/// ([`Completion::Deferred`]) while the lease still runs by this process's clock
/// (`within_lease`). Past it, another request may have taken the key and answered: the
/// response is not the key's answer, so the request counts as [`Completion::Stale`]. Never
/// [`Completion::Released`]: a key whose side effect may stand is not freed.
#[inline]
pub fn after_store(outcome: Result<FenceOutcome, &StoreError>, within_lease: bool) -> Completion {
    match outcome {
        Ok(FenceOutcome::Applied) => Completion::Stored,
        Ok(FenceOutcome::Stale) => Completion::Stale,
        Err(_) if within_lease => Completion::Deferred,
        Err(_) => Completion::Stale,
    }
}

/// What a fenced release of the claim (the handler's effect did not happen) comes to:
/// released; already another's; or the store failed, and the release is retried in the
/// background while retries are told the request is in flight.
#[inline]
pub fn after_release(outcome: Result<FenceOutcome, &StoreError>) -> Completion {
    match outcome {
        Ok(FenceOutcome::Applied) => Completion::Released,
        Ok(FenceOutcome::Stale) => Completion::Stale,
        Err(_) => Completion::Deferred,
    }
}

/// A request's `COMMIT` (with its response, or its refusal) that the store answered with
/// `error`: a timeout or a lost connection may have committed, so the outcome is unknown; an
/// error the database answered with ended the transaction uncommitted.
#[inline]
pub fn after_failed_commit(error: &StoreError) -> Completion {
    if error.is_unreachable() {
        Completion::OutcomeUnknown
    } else {
        Completion::RolledBack(RollbackCause::Store)
    }
}

/// What the client of a request that ran is answered, given its [`Completion`]
/// ([`Completion::answer`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Answer {
    /// The handler's own response: its outcome is what the key stands for (stored, or to be
    /// stored in the background), or it was not to be stored and nothing of it committed.
    HandlerResponse,
    /// The stored response of the request that holds the key instead.
    Replay(Replayed),
    /// `422`: the key is another request's.
    Mismatch,
    /// `409`: another request holds the key and runs; retry after `retry_after`.
    InFlight {
        /// A hint for `Retry-After`.
        retry_after: Duration,
    },
    /// `503 not-committed`: nothing committed; the retry runs the request.
    NotCommitted,
    /// `503 outcome-unknown`: the commit may or may not have happened; the retry with the same
    /// key tells.
    OutcomeUnknown,
    /// `500`: the handler ended or kept the request's transaction itself.
    TransactionMisused,
}

impl Completion {
    /// What the client is answered: the handler's response only when what the key stands for
    /// agrees with it. A request whose lease was lost ([`Completion::Stale`]) is told to
    /// retry, and the retry gets the answer of the request that holds the key now. A
    /// transaction that rolled back (a speculative lookup that could not be settled, say)
    /// never passes on a response the handler may have built from statements the database
    /// refused.
    #[inline]
    pub fn answer(self) -> Answer {
        match self {
            Completion::Stored | Completion::Released | Completion::Deferred => {
                Answer::HandlerResponse
            }
            // Another request holds the key now, and what the key stands for is its answer:
            // the retry finds it. The handler's response may say the opposite (a refusal
            // beside the other request's order).
            Completion::Stale | Completion::RolledBack(RollbackCause::LeaseLost) => {
                Answer::InFlight {
                    retry_after: ROLLED_BACK_RETRY_AFTER,
                }
            }
            Completion::RolledBack(RollbackCause::Store) => Answer::NotCommitted,
            Completion::OutcomeUnknown => Answer::OutcomeUnknown,
            Completion::TransactionMisused => Answer::TransactionMisused,
            Completion::Superseded(Superseded::Replay(response)) => Answer::Replay(response),
            Completion::Superseded(Superseded::Mismatch) => Answer::Mismatch,
            Completion::Superseded(Superseded::InFlight { retry_after }) => {
                Answer::InFlight { retry_after }
            }
        }
    }
}

/// The `Retry-After` of a request whose lease was lost before its commit.
const ROLLED_BACK_RETRY_AFTER: Duration = Duration::from_secs(1);
