//! How a guard holds its key: the one thing about a request that differs by claim mode, set by
//! each mode's begin and asked by the guard's files and the modes' own steps.

use crate::fingerprint::Fingerprint;
use crate::store::LookupSignal;

/// How a guard holds its key, one variant per claim mode.
pub(in crate::engine) enum Hold {
    /// A claim record with a lease ([`ClaimMode::Lease`](crate::ClaimMode::Lease)).
    Lease,
    /// Only the request's transaction
    /// ([`ClaimMode::OneTransaction`](crate::ClaimMode::OneTransaction)); a record that
    /// superseded the request's is judged against its fingerprint.
    Transaction { fingerprint: Fingerprint },
    /// Only the request's transaction, whose key lookup was not answered when the handler
    /// started ([`ClaimMode::OneTransactionSpeculative`](crate::ClaimMode::OneTransactionSpeculative)):
    /// the transaction is settled first. `lookup` tells whether the lookup's answer came (`None`
    /// where the store does not say).
    Speculative {
        fingerprint: Fingerprint,
        lookup: Option<LookupSignal>,
    },
}

impl Hold {
    /// Whether a claim record holds the key (the lease mode), to be released when the request
    /// gives the key back; otherwise the request's transaction is the key's only hold, and the
    /// key is free once it ends.
    pub(in crate::engine) fn has_claim_record(&self) -> bool {
        matches!(self, Hold::Lease)
    }

    /// The request's fingerprint, in the modes whose records are written at commit.
    pub(in crate::engine) fn fingerprint(&self) -> Option<Fingerprint> {
        match self {
            Hold::Lease => None,
            Hold::Transaction { fingerprint } | Hold::Speculative { fingerprint, .. } => {
                Some(*fingerprint)
            }
        }
    }
}
