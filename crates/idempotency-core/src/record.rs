//! What stores keep and return.

use crate::fingerprint::Fingerprint;

use crate::response::StoredResponse;
use std::fmt;
use std::time::Duration;

/// A fencing token: made at random by the engine when it claims a key, and required by every
/// later change of that record (ADR amendment 6). A worker whose lease ran out and was taken over
/// holds a token that no longer matches, so its late `complete` or `release` is refused.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct LeaseToken(uuid::Uuid);

impl LeaseToken {
    /// A new random token: 122 random bits from a thread-local CSPRNG seeded by the OS
    /// (`uuid`'s `fast-rng`: no system call per token).
    #[allow(clippy::new_without_default)]
    pub fn new() -> Self {
        LeaseToken(uuid::Uuid::new_v4())
    }

    /// Rebuilds a token from its stored form.
    pub fn from_uuid(uuid: uuid::Uuid) -> Self {
        LeaseToken(uuid)
    }

    /// The token as a UUID (its stored form).
    pub fn as_uuid(&self) -> uuid::Uuid {
        self.0
    }

    /// The token's 16 bytes.
    pub fn as_bytes(&self) -> &[u8; 16] {
        self.0.as_bytes()
    }
}

impl fmt::Debug for LeaseToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Tokens are capabilities: show only a prefix.
        write!(f, "LeaseToken({:08x}..)", self.0.as_u128() >> 96)
    }
}

/// A live record as read from a store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// The fingerprint of the request that created the record.
    pub fingerprint: Fingerprint,
    /// Whether that request is still running or has a stored response.
    pub state: RecordState,
}

/// The state of a live record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecordState {
    /// A request holds the claim; its lease runs out after `lease_remaining`.
    InFlight {
        /// Time left on the lease, by the store's clock.
        lease_remaining: Duration,
    },
    /// The request finished and its response is stored.
    Completed {
        /// The stored response.
        response: StoredResponse,
        /// Time left before the record expires, by the store's clock. A cache in front of the
        /// store (the local replay tier) keeps the record no longer than this.
        retention_remaining: Duration,
    },
}

/// The result of [`IdempotencyStore::claim`](crate::IdempotencyStore::claim).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// The key had no live record; it now holds an in-flight record owned by the given token.
    Claimed,
    /// A live record exists; it was left unchanged.
    Existing(Record),
}

/// The result of a fenced state change ([`complete`](crate::IdempotencyStore::complete) or
/// [`release`](crate::IdempotencyStore::release)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub enum FenceOutcome {
    /// The token held the claim and the change was made.
    Applied,
    /// The token no longer holds an in-flight claim on the key (its lease ran out and the key was
    /// taken over, released, completed or expired); nothing was changed.
    Stale,
}

impl FenceOutcome {
    /// [`FenceOutcome::Applied`] when the fenced statement or script changed exactly one record
    /// (a row count, a script's `1`), [`FenceOutcome::Stale`] when it changed none.
    pub fn from_count(changed: u64) -> Self {
        if changed == 1 {
            FenceOutcome::Applied
        } else {
            FenceOutcome::Stale
        }
    }
}
