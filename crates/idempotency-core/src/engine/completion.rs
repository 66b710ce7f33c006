//! What became of a proceeding request's outcome: [`Completion`], and the causes it carries.

use super::replayed::Replayed;
use std::time::Duration;

/// What [`Guard::complete`](crate::Guard::complete) or [`Guard::release`](crate::Guard::release) did with the request's outcome.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Completion {
    /// The response is stored (with the request's transaction, if it opened one) and will be
    /// replayed.
    Stored,
    /// The key was released for a retry: the policy does not store the status, or the caller
    /// released it. The request's transaction, if it opened one, was rolled back.
    Released,
    /// The lease had been lost (the key was taken over, released or expired): nothing was
    /// stored. The client is told to retry ([`Completion::answer`]): the key stands for the
    /// answer of the request that holds it now, which the retry gets, and the handler's response
    /// may say the opposite. Without a transaction this request's side effect did happen: the
    /// heartbeat makes a lost lease rare (a process frozen past its lease, or a store out for
    /// as long), see `docs/failure-modes.md`.
    Stale,
    /// The store failed after the handler ran. The claim is kept (retries get "in flight"),
    /// and the response is stored, or the key released, in the background, retrying until the
    /// lease runs out. The response still goes to this client. (A store that fails after the
    /// lease ran out by this process's clock makes it [`Completion::Stale`] instead.)
    Deferred,
    /// The request's transaction did not commit: none of its writes exist, and the handler's
    /// response must not be sent as if they did. Answer with an error the client retries with
    /// the same key; the retry runs the request.
    RolledBack(RollbackCause),
    /// The request's `COMMIT` was sent but never confirmed (the store timed out, or the
    /// connection dropped, while it was on its way): the writes and the record exist, or
    /// neither does, and nobody can tell yet. The handler's response must not be sent as if
    /// they did, nor an answer that says they do not: tell the client to retry with the same
    /// key to learn the outcome (a commit that happened replays, since its record holds the
    /// response; one that did not runs the request). A client that resubmits under a new key
    /// could create a duplicate.
    OutcomeUnknown,
    /// A bug in the handler: it rolled the request's transaction back itself (a raw
    /// `ROLLBACK`: its writes before it were undone, any statement after it committed on its
    /// own and stands, nothing was stored, and the key was released), asked for the
    /// transaction while it held it (its writes rolled back, the key released), or
    /// ended it in a way the store could not report, or still held it after returning (whether
    /// its writes exist is unknown, so nothing was stored and the claim is kept until its lease
    /// runs out). A handler that committed the transaction itself completes as
    /// [`Completion::Stored`]: its writes exist, and the response is stored after them.
    TransactionMisused,
    /// One-transaction mode: another request with the same key completed first. This
    /// request's transaction rolled back, so none of its writes exist, and the client is
    /// answered as that request's duplicate.
    Superseded(Superseded),
}

/// How to answer a request whose transaction lost its key to another request
/// ([`Completion::Superseded`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Superseded {
    /// The same request completed first: answer with its stored response.
    Replay(Replayed),
    /// The key was used with another request: answer 422.
    Mismatch,
    /// The key is held by a request still running (a lease-mode claim): answer 409.
    InFlight {
        /// A hint for `Retry-After`.
        retry_after: Duration,
    },
}

/// Why a request's transaction rolled back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RollbackCause {
    /// Its lease was lost before the commit: another request holds the key and runs it.
    LeaseLost,
    /// The store refused the completion or the commit (an error the database answered with,
    /// so the transaction ended without committing). The key was released, so a retry runs
    /// once.
    Store,
}

impl Completion {
    /// Exports `idempotency_completions_total` at zero for each result a request's completion
    /// can have, so its series exist before the first of each.
    pub(super) fn announce() {
        for result in [
            "stored",
            "released",
            "stale",
            "deferred",
            "rolled_back",
            "outcome_unknown",
            "transaction_misused",
            "superseded",
        ] {
            metrics::counter!("idempotency_completions_total", "result" => result).increment(0);
        }
    }

    /// Counts this completion in `idempotency_completions_total{result}`: literal labels, so
    /// the key is a static (no allocation, no hashing per request).
    pub(super) fn count(&self) {
        let counter = match self {
            Completion::Stored => {
                metrics::counter!("idempotency_completions_total", "result" => "stored")
            }
            Completion::Released => {
                metrics::counter!("idempotency_completions_total", "result" => "released")
            }
            Completion::Stale => {
                metrics::counter!("idempotency_completions_total", "result" => "stale")
            }
            Completion::Deferred => {
                metrics::counter!("idempotency_completions_total", "result" => "deferred")
            }
            Completion::RolledBack(_) => {
                metrics::counter!("idempotency_completions_total", "result" => "rolled_back")
            }
            Completion::OutcomeUnknown => {
                metrics::counter!("idempotency_completions_total", "result" => "outcome_unknown")
            }
            Completion::TransactionMisused => {
                metrics::counter!("idempotency_completions_total", "result" => "transaction_misused")
            }
            Completion::Superseded(_) => {
                metrics::counter!("idempotency_completions_total", "result" => "superseded")
            }
        };
        counter.increment(1);
    }

    /// The label of this outcome in `idempotency_completions_total{result}`.
    pub fn label(&self) -> &'static str {
        match self {
            Completion::Stored => "stored",
            Completion::Released => "released",
            Completion::Stale => "stale",
            Completion::Deferred => "deferred",
            Completion::RolledBack(_) => "rolled_back",
            Completion::OutcomeUnknown => "outcome_unknown",
            Completion::TransactionMisused => "transaction_misused",
            Completion::Superseded(_) => "superseded",
        }
    }
}
