//! Store errors.

use crate::response::DecodeError;

/// A boxed error kept as the source of a [`StoreError`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A store operation failed. Protocol outcomes (in flight, mismatch, stale token) are not errors;
/// this is only for a store that could not answer. It is never turned into "not found".
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The store could not be reached (connection refused or lost, pool exhausted, server
    /// restarting). Retrying later may help.
    #[error("the {backend} idempotency store is unavailable")]
    Unavailable {
        /// Which store (`postgres`, `redis`, `memory`, ...).
        backend: &'static str,
        /// The underlying error.
        #[source]
        source: BoxError,
    },
    /// A store call took longer than the configured bound.
    #[error("the {backend} idempotency store did not answer within {timeout:?}")]
    Timeout {
        /// Which store.
        backend: &'static str,
        /// The bound that was exceeded.
        timeout: std::time::Duration,
    },
    /// The store is full and refuses new claims (memory store at its in-flight limit).
    #[error("the {backend} idempotency store is full: {reason}")]
    Full {
        /// Which store.
        backend: &'static str,
        /// What limit was reached.
        reason: String,
    },
    /// The scope (one authenticated caller) may not start new keys for now: it holds its share
    /// of the memory store, or used its new keys of the window
    /// ([`EngineConfig::new_keys_per_scope`](crate::EngineConfig#structfield.new_keys_per_scope)). Its
    /// used keys still replay, and other scopes are not affected. The layer answers 429.
    #[error("this caller may not start new keys in the {backend} idempotency store: {reason}")]
    ScopeFull {
        /// Which store.
        backend: &'static str,
        /// Which limit was reached.
        reason: String,
        /// When the scope may try again, if known.
        retry_after: Option<std::time::Duration>,
    },
    /// The store answered with an error that a retry will not fix (a query error, a script
    /// error, missing table or permission).
    #[error("the {backend} idempotency store failed")]
    Backend {
        /// Which store.
        backend: &'static str,
        /// The underlying error.
        #[source]
        source: BoxError,
    },
    /// The store took the write, but it did not reach as many replicas as configured within
    /// the bound (Redis `wait_for_replicas`): the store is reachable, the write may not be
    /// durable. Retrying later may help.
    #[error("the {backend} idempotency store's write was not replicated in time")]
    NotReplicated {
        /// Which store.
        backend: &'static str,
        /// How far the replication got.
        #[source]
        source: BoxError,
    },
    /// Every request transaction the engine admits at once on this store is running (the
    /// database is contended, see
    /// [`TransactionAdmission`](crate::TransactionAdmission)), and none ended within the
    /// store timeout. The store is up; retrying later may help. The layer answers `503
    /// store-busy`.
    #[error(
        "the {backend} idempotency store runs {limit} request transactions at once and none ended within {waited:?}"
    )]
    Busy {
        /// Which store.
        backend: &'static str,
        /// The transactions admitted at once when the request gave up.
        limit: usize,
        /// How long it waited for a place.
        waited: std::time::Duration,
    },
    /// A stored record could not be decoded.
    #[error("a record in the {backend} idempotency store is corrupt")]
    Corrupt {
        /// Which store.
        backend: &'static str,
        /// What could not be decoded.
        #[source]
        source: CorruptRecord,
    },
}

/// What was wrong with a corrupt record.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CorruptRecord {
    /// The stored response bytes could not be decoded.
    #[error(transparent)]
    Response(#[from] DecodeError),
    /// The stored fingerprint could not be decoded.
    #[error(transparent)]
    Fingerprint(#[from] crate::fingerprint::FingerprintError),
    /// A field is missing or has the wrong type.
    #[error("{0}")]
    Field(&'static str),
}

impl StoreError {
    /// True when a later retry of the same call may succeed (the store was unreachable, slow or
    /// full); false when the store or its data is broken.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            StoreError::Unavailable { .. }
                | StoreError::Timeout { .. }
                | StoreError::Full { .. }
                | StoreError::ScopeFull { .. }
                | StoreError::NotReplicated { .. }
                | StoreError::Busy { .. }
        )
    }

    /// True when the store could not be reached at all, or did not answer in time: the only
    /// failures after which the layer's `fail_open` runs a request without idempotency. A
    /// store that answered (a corrupt record, which exists and may be completed; a full store;
    /// a write short of its replicas; a query error) is never a reason to run a request
    /// unguarded.
    pub fn is_unreachable(&self) -> bool {
        matches!(
            self,
            StoreError::Unavailable { .. } | StoreError::Timeout { .. }
        )
    }

    /// The name of the store that failed.
    pub fn backend(&self) -> &'static str {
        match self {
            StoreError::Unavailable { backend, .. }
            | StoreError::Timeout { backend, .. }
            | StoreError::Full { backend, .. }
            | StoreError::ScopeFull { backend, .. }
            | StoreError::Backend { backend, .. }
            | StoreError::NotReplicated { backend, .. }
            | StoreError::Busy { backend, .. }
            | StoreError::Corrupt { backend, .. } => backend,
        }
    }

    /// A failure of `backend` caused by `source`: [`StoreError::Unavailable`] when `transient`
    /// (a retry later may succeed), [`StoreError::Backend`] otherwise. Stores classify their
    /// driver's errors and call this, so the mapping has one shape everywhere.
    pub fn from_failure(
        backend: &'static str,
        transient: bool,
        source: impl Into<BoxError>,
    ) -> Self {
        let source = source.into();
        if transient {
            StoreError::Unavailable { backend, source }
        } else {
            StoreError::Backend { backend, source }
        }
    }

    /// Shorthand for [`StoreError::Corrupt`].
    pub fn corrupt(backend: &'static str, source: impl Into<CorruptRecord>) -> Self {
        StoreError::Corrupt {
            backend,
            source: source.into(),
        }
    }
}

/// Shows an error followed by each of its causes, `error: cause: cause`, so a log line or an
/// operator-facing message says why something failed (the server's own message), not only
/// that it did.
///
/// ```
/// use idempotency_core::{ErrorChain, StoreError};
/// let error = StoreError::Unavailable { backend: "postgres", source: "connection refused".into() };
/// assert_eq!(
///     ErrorChain(&error).to_string(),
///     "the postgres idempotency store is unavailable: connection refused"
/// );
/// ```
#[derive(Clone, Copy)]
pub struct ErrorChain<'a>(pub &'a (dyn std::error::Error + 'static));

impl std::fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(cause) = source {
            write!(f, ": {cause}")?;
            source = cause.source();
        }
        Ok(())
    }
}

impl std::fmt::Debug for ErrorChain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}
