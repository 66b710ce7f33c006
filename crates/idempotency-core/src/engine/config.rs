//! The engine's settings.

use http::StatusCode;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// Which handler statuses are stored for replay. Statuses that are not stored release the key
/// (and roll back the request's transaction), so the client's retry runs the handler again (ADR
/// amendment 5).
#[derive(Clone)]
pub struct ReplayPolicy(Arc<dyn Fn(StatusCode) -> bool + Send + Sync>);

impl ReplayPolicy {
    /// Store 2xx, 3xx and 4xx; release 5xx. `408 Request Timeout` and `429 Too Many Requests`
    /// are released too: both say "try again later", so replaying them for a day would turn a
    /// passing condition into a permanent answer. So are `401 Unauthorized` and `403
    /// Forbidden`: they judge the credentials the request carried, not the operation, so a
    /// client that fixes its token and retries with the same key gets the operation run, not a
    /// day of the old refusal (and a refusal never holds anything worth replaying). 1xx are
    /// never final and never stored.
    pub fn standard() -> Self {
        ReplayPolicy(Arc::new(|s: StatusCode| {
            (200..500).contains(&s.as_u16())
                && s != StatusCode::REQUEST_TIMEOUT
                && s != StatusCode::TOO_MANY_REQUESTS
                && s != StatusCode::UNAUTHORIZED
                && s != StatusCode::FORBIDDEN
        }))
    }

    /// Store every final status, 5xx included (Stripe API v1: "including 500 errors").
    pub fn all_final() -> Self {
        ReplayPolicy(Arc::new(|s: StatusCode| s.as_u16() >= 200))
    }

    /// Store exactly the statuses for which `f` returns true.
    pub fn custom(f: impl Fn(StatusCode) -> bool + Send + Sync + 'static) -> Self {
        ReplayPolicy(Arc::new(f))
    }

    /// Whether a response with `status` is stored (and so replayed to the key's retries).
    pub fn stores(&self, status: StatusCode) -> bool {
        (self.0)(status)
    }
}

impl Default for ReplayPolicy {
    fn default() -> Self {
        Self::standard()
    }
}

impl fmt::Debug for ReplayPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ReplayPolicy(..)")
    }
}

/// How a request that proceeds holds its key.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClaimMode {
    /// The default, for any store and any handler: the key is claimed first, in its own write
    /// that commits at once (an in-flight record with a lease and a fencing token), the handler
    /// runs (its writes in the request's transaction if it takes one), and the response is
    /// stored last (on a transactional store, in the handler's transaction). A handler that
    /// calls something outside the database (a payment API, an email, a queue) needs this mode:
    /// a duplicate is answered "in flight" from the moment the claim commits, so the handler
    /// never runs twice at once, and a crash leaves a claim that blocks the key for one lease.
    #[default]
    Lease,
    /// The key's whole life in the handler's one database transaction, for handlers whose side
    /// effects are **all** writes in that transaction (a
    /// [`TransactionalStore`](crate::store::TransactionalStore) that
    /// [supports it](crate::store::TransactionalStore::supports_one_transaction), PostgreSQL). The
    /// transaction begins with the key's lookup (and a lock that keeps a duplicate from running
    /// while it is open), the handler writes in it, and the completed record is inserted right
    /// before `COMMIT`: the round trips of the bare handler's `BEGIN; ...; COMMIT`, no claim
    /// that commits alone, no lease, no heartbeat. A crash or any failure before `COMMIT` leaves
    /// nothing behind, and the retry runs at once. If a duplicate ever completes first (the
    /// lock is a fast path, the unique index is the rule), the later transaction rolls back
    /// and answers with the record that stands.
    ///
    /// Anything the handler does outside the transaction is **not** covered: its effect stays
    /// when the transaction rolls back, and the retry runs it again. Use [`ClaimMode::Lease`]
    /// for such handlers.
    ///
    /// The request's [`KeyClaim`](crate::KeyClaim) never runs out in this mode (the transaction holds
    /// the key), and its token fences no stored record: it is no fencing token for a downstream
    /// system here.
    OneTransaction,
    /// [`ClaimMode::OneTransaction`], with the key's lookup sent together with the handler's
    /// first statement instead of a round trip before it: `BEGIN` and the lookup are queued on
    /// the connection, the handler runs at once, and the lookup's answer is read when the
    /// handler returns. A fresh key costs the round trips of the bare handler's
    /// `BEGIN; ...; COMMIT` minus one (`docs/postgres.md`: the fastest mode through HTTP).
    ///
    /// When the lookup finds the key taken (a completed record, or a duplicate's transaction
    /// open), it aborts the transaction before the handler's first statement runs: every
    /// statement of the handler fails (SQLSTATE `25P02`, "current transaction is aborted"),
    /// nothing it wrote exists, and its response is dropped for the stored one (a replay), the
    /// mismatch answer, or "in flight". So the handler's **code** runs for every retry, up to
    /// its first statement: use this mode only for handlers whose side effects are all writes
    /// in the transaction, and whose code before their first statement has no effect.
    ///
    /// Duplicates are answered at once: this mode learns that a key is taken only when the
    /// handler returns, too late to wait, so an
    /// [`in_flight_wait`](EngineConfig#structfield.in_flight_wait) is refused when the engine is
    /// built ([`ConfigError::SpeculativeCannotWait`](crate::ConfigError::SpeculativeCannotWait)),
    /// and so is a store that cannot queue the lookup (sqlx, which sends `BEGIN` on its own:
    /// [`ConfigError::SpeculativeUnsupported`](crate::ConfigError::SpeculativeUnsupported)).
    /// [`ClaimMode::OneTransaction`] runs the same protocol with the lookup first, and can wait.
    OneTransactionSpeculative,
}

impl ClaimMode {
    /// Whether the key lives only in the request's transaction (the one-transaction modes).
    pub fn is_one_transaction(self) -> bool {
        matches!(
            self,
            ClaimMode::OneTransaction | ClaimMode::OneTransactionSpeculative
        )
    }
}

/// Settings of an [`Engine`](crate::Engine).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct EngineConfig {
    /// How long an in-flight claim holds the key without a heartbeat before another request
    /// may take it over (ADR amendment 6). While the request runs, the heartbeat extends it;
    /// it bounds how long the key of a crashed or hung worker stays blocked, and how long a
    /// response whose storing failed is retried in the background. Default 60 s.
    pub lease: Duration,
    /// How long a completed response is kept and replayed. Default 24 h (the ADR).
    pub retention: Duration,
    /// Which statuses are stored. Default [`ReplayPolicy::standard`].
    pub replay_policy: ReplayPolicy,
    /// How long a duplicate of an in-flight request waits for the first to finish before it is
    /// answered "in flight" (409). A protocol bound, separate from the store timeout. Default
    /// zero: answer at once.
    pub in_flight_wait: Duration,
    /// Whether the lease is extended (every third of its length, by a background task that the
    /// engine's heartbeat driver starts for a request still running a third of a lease after
    /// its claim) from the claim until the response is stored or released. Default true: a live request keeps its
    /// key however long its handler and its response body take, and only the claim of a worker
    /// that stopped (crashed, hung, partitioned) lapses after one lease.
    pub heartbeat: bool,
    /// Bound on each single store call (claim, complete, extend, release, opening and
    /// committing a transaction); past it the call counts as failed with
    /// [`StoreError::Timeout`](crate::StoreError::Timeout). Default 5 s.
    pub store_timeout: Duration,
    /// How a proceeding request holds its key. Default [`ClaimMode::Lease`].
    pub claim_mode: ClaimMode,
    /// The longest wait a duplicate of a running request is told to make before retrying (its
    /// `Retry-After`): the running request's remaining lease, at most this. The remaining lease
    /// is no estimate of when the request will finish (most finish in milliseconds, and the
    /// heartbeat keeps the lease near its full length), so a client that honoured it stalled a
    /// whole lease (59 s of the default 60) per duplicate. Default 1 s.
    pub in_flight_retry_after: Duration,
    /// At most this many new keys per scope per window, in this process: a request that would
    /// start one more is refused with [`StoreError::ScopeFull`](crate::StoreError::ScopeFull)
    /// (429 at the HTTP layer) and its key released, while the scope's used keys still replay
    /// and other scopes go on. It bounds how fast one caller can grow a PostgreSQL or Redis
    /// store (which evict nothing) by flooding it with new keys. Default none.
    pub new_keys_per_scope: Option<super::limit::ScopeLimit>,
    /// How many request transactions run at once on a store whose transactions hold pooled
    /// connections (the PostgreSQL store). Default [`TransactionAdmission::Adaptive`].
    pub transaction_admission: TransactionAdmission,
    /// With an [`in_flight_wait`](Self#structfield.in_flight_wait): at most this many
    /// duplicates of one key wait at once on this engine; one more is answered in flight at
    /// once. Default 16.
    pub max_waiters_per_key: usize,
    /// With an [`in_flight_wait`](Self#structfield.in_flight_wait): at most this many
    /// duplicates wait at once on this engine, all keys together; one more is answered in
    /// flight at once, so a flood of duplicates cannot hold the server's requests. Default 1024.
    pub max_waiters: usize,
}

/// How many request transactions the engine lets run at once on a store whose transactions
/// hold pooled connections ([`IdempotencyStore::pool_status`](crate::IdempotencyStore::pool_status)).
/// Replays and duplicates never take a place: a request that finds none free is answered from
/// its key's lookup if the key has a record (at once while a limit below the pool is kept, after
/// at most 25 ms while the limit stands at the pool or only tries a lower one).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum TransactionAdmission {
    /// At most the pool less a connection kept for lookups (one per eight), fewer when fewer
    /// commit more: the limit starts there and climbs the committed transactions per second,
    /// window by window (a probe down is kept only when two windows at it commit 1.2x more, or
    /// one 2x, a probe up only when two windows at it commit more and each place commits at
    /// least 0.75 of what it did; probes that find nothing come every 16-24 windows),
    /// so transactions that are slow but do not wait on each other keep the pool, and hot rows
    /// bring it down to the one or two that do not wait. A request
    /// that finds no place waits for one up to the store timeout, then gets
    /// [`StoreError::Busy`](crate::StoreError::Busy) (`503 store-busy`); a replay or a
    /// duplicate never takes one. Measured in `docs/benchmarks.md`, "Under contention".
    #[default]
    Adaptive,
    /// As many as the pool has connections: the pool's own queue is the only limit.
    WholePool,
}

impl EngineConfig {
    /// With the heartbeat on, the lease must last at least this many store timeouts: the
    /// heartbeat extends it every third of its length, so a lease of three store timeouts
    /// survives one extension that hangs for a whole timeout, and is retried before it ends.
    pub const MIN_LEASE_IN_STORE_TIMEOUTS: u32 = 3;
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            lease: Duration::from_secs(60),
            retention: Duration::from_secs(24 * 60 * 60),
            replay_policy: ReplayPolicy::standard(),
            in_flight_wait: Duration::ZERO,
            heartbeat: true,
            store_timeout: Duration::from_secs(5),
            claim_mode: ClaimMode::Lease,
            in_flight_retry_after: Duration::from_secs(1),
            new_keys_per_scope: None,
            transaction_admission: TransactionAdmission::Adaptive,
            max_waiters_per_key: 16,
            max_waiters: 1024,
        }
    }
}

/// The settings as a chain (`EngineConfig::default().lease(..).claim_mode(..)`): each method sets
/// the field of its name, and is named as the HTTP layer builder's setting of the same field.
impl EngineConfig {
    /// Sets [`lease`](Self#structfield.lease).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }
    /// Sets [`retention`](Self#structfield.retention).
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }
    /// Sets [`replay_policy`](Self#structfield.replay_policy).
    pub fn replay_policy(mut self, policy: ReplayPolicy) -> Self {
        self.replay_policy = policy;
        self
    }
    /// Sets [`in_flight_wait`](Self#structfield.in_flight_wait).
    pub fn in_flight_wait(mut self, wait: Duration) -> Self {
        self.in_flight_wait = wait;
        self
    }
    /// Sets [`max_waiters_per_key`](Self#structfield.max_waiters_per_key).
    pub fn max_waiters_per_key(mut self, waiters: usize) -> Self {
        self.max_waiters_per_key = waiters;
        self
    }
    /// Sets [`max_waiters`](Self#structfield.max_waiters).
    pub fn max_waiters(mut self, waiters: usize) -> Self {
        self.max_waiters = waiters;
        self
    }
    /// Sets [`heartbeat`](Self#structfield.heartbeat).
    pub fn heartbeat(mut self, heartbeat: bool) -> Self {
        self.heartbeat = heartbeat;
        self
    }
    /// Sets [`store_timeout`](Self#structfield.store_timeout).
    pub fn store_timeout(mut self, timeout: Duration) -> Self {
        self.store_timeout = timeout;
        self
    }
    /// Sets [`transaction_admission`](Self#structfield.transaction_admission).
    pub fn transaction_admission(mut self, admission: TransactionAdmission) -> Self {
        self.transaction_admission = admission;
        self
    }
    /// Sets [`claim_mode`](Self#structfield.claim_mode).
    pub fn claim_mode(mut self, mode: ClaimMode) -> Self {
        self.claim_mode = mode;
        self
    }
    /// Sets [`new_keys_per_scope`](Self#structfield.new_keys_per_scope): at most `keys` new keys per scope per `per`.
    pub fn new_keys_per_scope(mut self, keys: u32, per: Duration) -> Self {
        self.new_keys_per_scope = Some(super::limit::ScopeLimit { keys, per });
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standard_policy_stores_2xx_to_4xx_but_not_transient_or_server_errors() {
        let p = ReplayPolicy::standard();
        for s in [200, 201, 204, 301, 400, 404, 409, 422, 499] {
            assert!(p.stores(StatusCode::from_u16(s).unwrap()), "{s}");
        }
        for s in [100, 401, 403, 408, 429, 500, 502, 503, 504] {
            assert!(!p.stores(StatusCode::from_u16(s).unwrap()), "{s}");
        }
        assert!(ReplayPolicy::all_final().stores(StatusCode::INTERNAL_SERVER_ERROR));
        assert!(!ReplayPolicy::custom(|s| s == StatusCode::CREATED).stores(StatusCode::OK));
    }

    /// A lease that one hung extension can outlast is refused: with the default 5 s store
    /// timeout, a 6 s lease (whose first heartbeat at 2 s could hang until 7 s) is an error,
    /// 15 s is the floor; without a heartbeat, or in the one-transaction mode (no lease), any
    /// length is fine.
    #[test]
    fn a_lease_shorter_than_three_store_timeouts_is_refused() {
        let at = |lease: u64| EngineConfig::default().lease(Duration::from_secs(lease));
        let refused = at(6).check().unwrap_err();
        assert_eq!(
            refused,
            super::super::config_error::ConfigError::LeaseTooShort {
                lease: Duration::from_secs(6),
                store_timeout: Duration::from_secs(5)
            }
        );
        assert!(
            refused
                .to_string()
                .contains("at least 3 store timeouts (15s"),
            "{refused}"
        );
        assert!(at(14).check().is_err());
        assert!(at(15).check().is_ok());
        assert!(at(60).check().is_ok());
        assert!(at(6).heartbeat(false).check().is_ok());
        assert!(at(6).store_timeout(Duration::from_secs(2)).check().is_ok());
        let mut one_transaction = at(1);
        one_transaction.claim_mode = ClaimMode::OneTransaction;
        assert!(one_transaction.check().is_ok());
    }
}
