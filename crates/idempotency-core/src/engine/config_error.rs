//! [`ConfigError`]: why an engine (and the layer, the consumer or the job runner over it) was
//! not built.

use super::config::{ClaimMode, EngineConfig};
use crate::store::IdempotencyStore;
use std::time::Duration;

/// Why [`Engine::new`](crate::Engine::new) (and every builder over it: the HTTP layer's
/// `build()`) refused a configuration: each is a setting that could not run a request safely,
/// or could not run it the way it says, on this store. Refused when the engine is built, never
/// per request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// With the heartbeat on, the lease must last at least
    /// [`EngineConfig::MIN_LEASE_IN_STORE_TIMEOUTS`] store timeouts: one extension that hangs
    /// for a whole store timeout would otherwise let a live request's lease run out, and a retry
    /// take its key over while it runs.
    #[error(
        "the lease ({lease:?}) must last at least {} store timeouts ({:?} with a store timeout of \
         {store_timeout:?}), or one hung heartbeat lets a live request's key be taken over: \
         lengthen the lease or shorten the store timeout",
        EngineConfig::MIN_LEASE_IN_STORE_TIMEOUTS,
        *store_timeout * EngineConfig::MIN_LEASE_IN_STORE_TIMEOUTS
    )]
    LeaseTooShort {
        /// The lease that was set.
        lease: Duration,
        /// The store timeout that was set.
        store_timeout: Duration,
    },
    /// A one-transaction mode on a store whose transactions cannot hold a key (a store without
    /// transactions, or the PostgreSQL store with transactions off): every request would fail.
    #[error(
        "{mode:?} needs a store whose transactions can hold the key (the PostgreSQL store with \
         transactions on); the {backend} store cannot: use ClaimMode::Lease with this store"
    )]
    OneTransactionUnsupported {
        /// The mode that was set.
        mode: ClaimMode,
        /// The store's backend name.
        backend: &'static str,
    },
    /// The speculative mode on a store that cannot queue the key's lookup ahead of the
    /// handler's first statement (the sqlx driver sends `BEGIN` on its own): it would run as
    /// [`ClaimMode::OneTransaction`] while saying otherwise.
    #[error(
        "ClaimMode::OneTransactionSpeculative needs a store that queues the key's lookup with the \
         handler's first statement (the PostgreSQL store on tokio-postgres); the {backend} store \
         cannot: use ClaimMode::OneTransaction, which runs the same protocol with the lookup first"
    )]
    SpeculativeUnsupported {
        /// The store's backend name.
        backend: &'static str,
    },
    /// The speculative mode with an [`in_flight_wait`](EngineConfig#structfield.in_flight_wait):
    /// the speculative mode learns that a key is taken only after the handler ran, too late to
    /// wait for the duplicate, so a wait needs the lookup first, which is
    /// [`ClaimMode::OneTransaction`].
    #[error(
        "ClaimMode::OneTransactionSpeculative answers duplicates after the handler and cannot wait \
         for them (in_flight_wait {wait:?}): use ClaimMode::OneTransaction to wait, or no wait"
    )]
    SpeculativeCannotWait {
        /// The wait that was set.
        wait: Duration,
    },
}

impl EngineConfig {
    /// Why this configuration cannot run a request safely on `store`, if it cannot: the checks
    /// [`Engine::new`](crate::Engine::new) makes.
    pub fn check_for(&self, store: &dyn IdempotencyStore) -> Result<(), ConfigError> {
        self.check()?;
        if self.claim_mode.is_one_transaction() {
            let transactions = store.transactional();
            if !transactions.is_some_and(|store| store.supports_one_transaction()) {
                return Err(ConfigError::OneTransactionUnsupported {
                    mode: self.claim_mode,
                    backend: store.backend(),
                });
            }
            if self.claim_mode == ClaimMode::OneTransactionSpeculative
                && !transactions.is_some_and(|store| store.supports_speculative())
            {
                return Err(ConfigError::SpeculativeUnsupported {
                    backend: store.backend(),
                });
            }
        }
        Ok(())
    }

    /// Why this configuration cannot run a request safely on any store, if it cannot (the
    /// checks of [`check_for`](Self::check_for) that do not depend on the store).
    pub fn check(&self) -> Result<(), ConfigError> {
        let floor = self.store_timeout * Self::MIN_LEASE_IN_STORE_TIMEOUTS;
        if self.heartbeat && self.claim_mode == ClaimMode::Lease && self.lease < floor {
            return Err(ConfigError::LeaseTooShort {
                lease: self.lease,
                store_timeout: self.store_timeout,
            });
        }
        if self.claim_mode == ClaimMode::OneTransactionSpeculative && !self.in_flight_wait.is_zero()
        {
            return Err(ConfigError::SpeculativeCannotWait {
                wait: self.in_flight_wait,
            });
        }
        Ok(())
    }
}
