//! The protocol engine: the one place where the idempotency policy lives.
//!
//! - `mod.rs`: [`Engine::begin`], which dispatches once on the claim mode to that mode's file,
//!   which holds what only the mode does, from its begin to its guard's end: `lease.rs` (a
//!   claim record written first, released by its token), `one_transaction.rs` (the key's lookup
//!   opens the request's transaction and is waited for; the loop and the steps both
//!   one-transaction modes share), `speculative.rs` (the lookup rides with the handler's first
//!   statement and is settled later);
//! - `config.rs`: [`EngineConfig`] and [`ReplayPolicy`];
//! - `guard.rs`: the [`Guard`] a proceeding request holds, its heartbeat, and how its outcome is
//!   stored (in the request's transaction when the store offers one), in every mode;
//! - `key_claim.rs`: the [`KeyClaim`] a handler sees; `heartbeat.rs`: what keeps it from running out
//!   (`heartbeat_schedule.rs`: the requests waiting for their first heartbeat);
//! - `opener.rs`: opening the request's transaction on a transactional store;
//! - `shared.rs`: what every guard and background task of one engine shares, and its bounded,
//!   timed store calls;
//! - `retry.rs`: the background retries that keep a claim's promises;
//! - `protocol.rs`: the protocol's decisions as pure functions, which the model checker calls too;
//! - `wait.rs`: waiting for a duplicate's answer, the one policy every mode's `begin` follows;
//!   `waiters.rs`: the duplicates waiting on this process, woken when a request settles a key;
//! - `replayed.rs`: a stored answer as a duplicate gets it; `status.rs`: [`Engine::status`],
//!   what became of a key.

pub(crate) mod admission;
pub(crate) mod completion;
pub(crate) mod config;
pub(crate) mod config_error;
pub(crate) mod guard;
mod heartbeat;
mod heartbeat_schedule;
pub(crate) mod in_flight;
pub(crate) mod key_claim;
mod lease;
pub(crate) mod limit;
mod one_transaction;
mod opener;
mod pending;
pub mod protocol;
pub(crate) mod replayed;
mod retry;
mod shared;
mod speculative;
pub(crate) mod status;
pub(crate) mod store_metrics;
mod timer;
mod wait;
pub(crate) mod waiters;

pub use config::{ClaimMode, EngineConfig, ReplayPolicy, TransactionAdmission};
pub use config_error::ConfigError;
pub use guard::{Completion, Guard, RollbackCause, Superseded};
pub use key_claim::KeyClaim;
pub use limit::ScopeLimit;
pub use replayed::Replayed;

use crate::error::StoreError;
use crate::fingerprint::Fingerprint;
use crate::key::IdempotencyKey;
use crate::scope::Scope;
use crate::store::IdempotencyStore;
use shared::Shared;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::task::TaskTracker;

/// What to do with a request, as decided by [`Engine::begin`].
#[must_use]
pub enum Begin<S: IdempotencyStore + 'static> {
    /// This request holds the key: run the handler, then hand its response to the guard.
    Proceed(Guard<S>),
    /// The same request already completed: answer with its stored response.
    Replay(Replayed),
    /// The same request is still running elsewhere: answer 409 and suggest retrying after
    /// `retry_after`.
    InFlight {
        /// When to retry: the time left on the running request's lease, at most
        /// [`EngineConfig::in_flight_retry_after`] (1 s by default).
        retry_after: Duration,
    },
    /// The key was used with a different request: answer 422 and never the other response.
    Mismatch,
}

impl<S: IdempotencyStore + 'static> fmt::Debug for Begin<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Begin::Proceed(guard) => f.debug_tuple("Proceed").field(guard).finish(),
            Begin::Replay(response) => f.debug_tuple("Replay").field(response).finish(),
            Begin::InFlight { retry_after } => f
                .debug_struct("InFlight")
                .field("retry_after", retry_after)
                .finish(),
            Begin::Mismatch => f.write_str("Mismatch"),
        }
    }
}

/// Waits for an engine's work to finish (see [`Engine::drain`]). Cheap to clone.
#[derive(Clone, Debug)]
pub struct Drain(TaskTracker);

impl Drain {
    /// Resolves once every tracked request and background task has finished. New work started
    /// meanwhile is waited for too; bound the wait with a timeout at shutdown.
    pub async fn drained(&self) {
        self.0.close();
        self.0.wait().await;
        self.0.reopen();
    }

    /// How much work is running now.
    pub fn running(&self) -> usize {
        self.0.len()
    }
}

/// Turns requests into [`Begin`] decisions over a store. Cheap to clone.
pub struct Engine<S> {
    shared: Arc<Shared<S>>,
}

impl<S> Clone for Engine<S> {
    fn clone(&self) -> Self {
        Engine {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S: IdempotencyStore> fmt::Debug for Engine<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Engine")
            .field("store", &self.shared.store.backend())
            .field(
                "metrics_engine_label",
                &self.shared.in_flight.engine_label(),
            )
            .field("config", &self.shared.config)
            .finish()
    }
}

impl<S: IdempotencyStore + 'static> Engine<S> {
    /// An engine over `store` with `config`, or why `config` cannot run on `store`
    /// ([`EngineConfig::check_for`]): a lease that one hung heartbeat could outlast, a
    /// one-transaction mode on a store that cannot hold a key in a transaction, the speculative
    /// mode where it cannot speculate. Refused here, once, never per request.
    pub fn new(store: S, config: EngineConfig) -> Result<Self, ConfigError> {
        config.check_for(&store)?;
        let metrics = store_metrics::StoreMetrics::new(store.backend());
        metrics.announce();
        Completion::announce();
        let waiters = Arc::new(waiters::Waiters::new(
            config.max_waiters_per_key,
            config.max_waiters,
        ));
        // Keys settled by other processes wake this engine's duplicates, on a store that hears
        // of them.
        let on_settled = store.settled_keys().map(|settled| {
            let woken = Arc::clone(&waiters);
            let on_settled: Arc<crate::store::OnSettled> = Arc::new(move |id| woken.wake_id(id));
            settled.subscribe(&on_settled);
            on_settled
        });
        Ok(Engine {
            shared: Arc::new(Shared {
                heartbeats: Arc::new(heartbeat_schedule::Schedule::new(config.lease)),
                metrics,
                in_flight: in_flight::InFlightGauges::announce(store.backend()),
                limiter: config.new_keys_per_scope.map(limit::ScopeLimiter::new),
                admission: match config.transaction_admission {
                    TransactionAdmission::Adaptive => store
                        .transactional()
                        .and(store.pool_status())
                        .map(|pool| admission::Admission::new(pool.max, store.backend())),
                    TransactionAdmission::WholePool => None,
                },
                waiters,
                on_settled,
                config,
                store,
                tasks: TaskTracker::new(),
            }),
        })
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.shared.store
    }

    /// The settings.
    pub fn config(&self) -> &EngineConfig {
        &self.shared.config
    }

    /// How this engine's requests hold their keys: the mode it was built with, which
    /// [`Engine::new`] checked the store runs as it says.
    pub fn claim_mode(&self) -> ClaimMode {
        self.shared.config.claim_mode
    }

    /// Counts `future` as this engine's work until it finishes, wherever it runs: a server's
    /// shutdown waits for it with [`Drain::drained`]. The HTTP layer tracks every request it runs,
    /// so a handler moved to its own task (its client left) still finishes and stores its
    /// response before the process exits.
    pub fn track<F: std::future::Future>(
        &self,
        future: F,
    ) -> impl std::future::Future<Output = F::Output> + use<F, S> {
        self.shared.tasks.track_future(future)
    }

    /// A handle a server's shutdown awaits so that tracked requests, heartbeats, and responses
    /// being stored or keys being released in the background finish first.
    pub fn drain(&self) -> Drain {
        Drain(self.shared.tasks.clone())
    }

    /// Claims `(scope, key)` for a request with `fingerprint` and decides what to do:
    ///
    /// - no live record: the claim is taken, [`Begin::Proceed`];
    /// - a live record with another fingerprint: [`Begin::Mismatch`] (whatever its state);
    /// - a completed record with this fingerprint: [`Begin::Replay`];
    /// - an in-flight record with this fingerprint: wait up to
    ///   [`EngineConfig::in_flight_wait`](crate::EngineConfig#structfield.in_flight_wait) for it to finish (replay) or be released (proceed),
    ///   then [`Begin::InFlight`].
    ///
    /// One store round trip when no waiting is configured. Each store call is bounded by
    /// [`EngineConfig::store_timeout`](crate::EngineConfig#structfield.store_timeout); waiting is not a store call. `Err` only when the store
    /// failed before anything showed that another request holds the key: once one did, a
    /// failure while waiting answers [`Begin::InFlight`], so a fail-open caller never runs a
    /// request that another one is running.
    ///
    /// A claim whose answer is lost (the call timed out or failed after reaching the store, or
    /// this future was dropped) is released in the background with its token, so the key is
    /// not blocked for a lease by a claim nobody holds.
    pub async fn begin(
        &self,
        scope: Scope,
        key: IdempotencyKey,
        fingerprint: Fingerprint,
    ) -> Result<Begin<S>, StoreError> {
        // The one-transaction modes' begins are boxed: their state is three quarters of the
        // lease mode's, which would otherwise carry it (one allocation in a mode whose request
        // waits for the database anyway).
        match self.shared.config.claim_mode {
            ClaimMode::Lease => self.begin_with_lease(scope, key, fingerprint).await,
            ClaimMode::OneTransaction => {
                Box::pin(self.begin_in_transaction(scope, key, fingerprint)).await
            }
            ClaimMode::OneTransactionSpeculative => {
                Box::pin(self.begin_speculative(scope, key, fingerprint)).await
            }
        }
    }
}

impl<S: IdempotencyStore + 'static> Engine<S> {
    /// A request that holds its key proceeds if its scope may start one more new key
    /// ([`EngineConfig::new_keys_per_scope`](crate::EngineConfig#structfield.new_keys_per_scope)); otherwise it gives the key back (nothing ran)
    /// and is refused with [`StoreError::ScopeFull`].
    async fn admitted(&self, guard: Guard<S>) -> Result<Begin<S>, StoreError> {
        let Some(limiter) = &self.shared.limiter else {
            return Ok(Begin::Proceed(guard));
        };
        match limiter.admit(guard.claim().scope()) {
            // A speculative request's key may turn out used when its lookup is read: the
            // guard gives the charge back then.
            Ok(charge) => Ok(Begin::Proceed(guard.charged(charge))),
            Err(retry_after) => {
                // A speculative request's key may turn out used: it still replays.
                if let Some(answer) = answer_instead(guard.release().await) {
                    return Ok(answer);
                }
                let ScopeLimit { keys, per } = limiter.limit();
                Err(StoreError::ScopeFull {
                    backend: self.shared.store.backend(),
                    reason: format!("it started its {keys} new keys of the last {per:?}"),
                    retry_after: Some(retry_after),
                })
            }
        }
    }
}

/// What a request answers instead of running, when releasing (or settling) its guard found
/// its key another's: a replay, a mismatch, in flight.
fn answer_instead<S: IdempotencyStore + 'static>(completion: Completion) -> Option<Begin<S>> {
    match completion {
        Completion::Superseded(Superseded::Replay(stored)) => Some(Begin::Replay(stored)),
        Completion::Superseded(Superseded::Mismatch) => Some(Begin::Mismatch),
        Completion::Superseded(Superseded::InFlight { retry_after }) => {
            Some(Begin::InFlight { retry_after })
        }
        _ => None,
    }
}
