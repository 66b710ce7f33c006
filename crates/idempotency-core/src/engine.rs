//! The protocol engine: the one place where the idempotency policy lives.

use crate::{
    ClaimOutcome, FenceOutcome, Fingerprint, IdempotencyKey, IdempotencyStore, KeyError, KeyFormat,
    LeaseToken, RecordState, Scope, StoreError, StoredResponse,
};
use http::StatusCode;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// Which handler statuses are stored for replay. Statuses that are not stored release the key,
/// so the client's retry runs the handler again (ADR amendment 5).
#[derive(Clone)]
pub struct StorePolicy(Arc<dyn Fn(StatusCode) -> bool + Send + Sync>);

impl StorePolicy {
    /// Store 2xx, 3xx and 4xx; release 5xx. `408 Request Timeout` and `429 Too Many Requests`
    /// are released too: both say "try again later", so replaying them for a day would turn a
    /// passing condition into a permanent answer. 1xx are never final and never stored.
    pub fn standard() -> Self {
        StorePolicy(Arc::new(|s: StatusCode| {
            (200..500).contains(&s.as_u16())
                && s != StatusCode::REQUEST_TIMEOUT
                && s != StatusCode::TOO_MANY_REQUESTS
        }))
    }

    /// Store every final status, 5xx included (Stripe API v1: "including 500 errors").
    pub fn all_final() -> Self {
        StorePolicy(Arc::new(|s: StatusCode| s.as_u16() >= 200))
    }

    /// Store exactly the statuses for which `f` returns true.
    pub fn custom(f: impl Fn(StatusCode) -> bool + Send + Sync + 'static) -> Self {
        StorePolicy(Arc::new(f))
    }

    /// Whether a response with `status` is stored.
    pub fn should_store(&self, status: StatusCode) -> bool {
        (self.0)(status)
    }
}

impl Default for StorePolicy {
    fn default() -> Self {
        Self::standard()
    }
}

impl fmt::Debug for StorePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("StorePolicy(..)")
    }
}

/// Settings of an [`Engine`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct EngineConfig {
    /// How long an in-flight claim holds the key before another request may take it over
    /// (ADR amendment 6). Must exceed the longest handler run: a handler still running when its
    /// lease runs out can be run a second time by a retry. Default 60 s.
    pub lease: Duration,
    /// How long a completed response is kept and replayed. Default 24 h (the ADR).
    pub retention: Duration,
    /// Which statuses are stored. Default [`StorePolicy::standard`].
    pub store_policy: StorePolicy,
    /// How long a duplicate of an in-flight request waits for the first to finish before it is
    /// answered "in flight" (409). Default zero: answer at once.
    pub in_flight_wait: Duration,
    /// Which keys are accepted by [`Engine::begin_raw`]. Default UUID v4 (the ADR).
    pub key_format: KeyFormat,
    /// Whether [`Guard::keep_alive`] extends the lease while the work runs (every third of the
    /// lease). Default true: a live request keeps its key however long it runs, and only the
    /// claim of a worker that stopped (crashed, hung, partitioned) lapses after one lease.
    pub heartbeat: bool,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            lease: Duration::from_secs(60),
            retention: Duration::from_secs(24 * 60 * 60),
            store_policy: StorePolicy::standard(),
            in_flight_wait: Duration::ZERO,
            key_format: KeyFormat::UuidV4,
            heartbeat: true,
        }
    }
}

impl EngineConfig {
    /// Sets [`EngineConfig::lease`].
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }
    /// Sets [`EngineConfig::retention`].
    pub fn with_retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }
    /// Sets [`EngineConfig::store_policy`].
    pub fn with_store_policy(mut self, policy: StorePolicy) -> Self {
        self.store_policy = policy;
        self
    }
    /// Sets [`EngineConfig::in_flight_wait`].
    pub fn with_in_flight_wait(mut self, wait: Duration) -> Self {
        self.in_flight_wait = wait;
        self
    }
    /// Sets [`EngineConfig::heartbeat`].
    pub fn with_heartbeat(mut self, heartbeat: bool) -> Self {
        self.heartbeat = heartbeat;
        self
    }
    /// Sets [`EngineConfig::key_format`].
    pub fn with_key_format(mut self, format: KeyFormat) -> Self {
        self.key_format = format;
        self
    }
}

/// What to do with a request, as decided by [`Engine::begin`].
#[must_use]
pub enum Begin<S: IdempotencyStore + 'static> {
    /// This request holds the key: run the handler, then hand its response to the guard.
    Proceed(Guard<S>),
    /// The same request already completed: answer with its stored response.
    Replay(StoredResponse),
    /// The same request is still running elsewhere: answer 409 and suggest retrying after
    /// `retry_after` (the time left on its lease).
    InFlight {
        /// Time left on the running request's lease.
        retry_after: Duration,
    },
    /// The key was used with a different request: answer 422 and never the other response.
    Mismatch,
    /// The key is malformed (only from [`Engine::begin_raw`]).
    Invalid(KeyError),
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
            Begin::Invalid(e) => f.debug_tuple("Invalid").field(e).finish(),
        }
    }
}

struct Shared<S> {
    config: EngineConfig,
    store: S,
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
            .field("config", &self.shared.config)
            .finish()
    }
}

const FIRST_POLL: Duration = Duration::from_millis(10);
const MAX_POLL: Duration = Duration::from_millis(250);

impl<S: IdempotencyStore + 'static> Engine<S> {
    /// An engine over `store` with `config`.
    pub fn new(store: S, config: EngineConfig) -> Self {
        Engine {
            shared: Arc::new(Shared { config, store }),
        }
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.shared.store
    }

    /// The settings.
    pub fn config(&self) -> &EngineConfig {
        &self.shared.config
    }

    /// Parses a raw header value with the configured [`KeyFormat`], then proceeds as
    /// [`Engine::begin`]. A malformed key gives [`Begin::Invalid`].
    pub async fn begin_raw(
        &self,
        scope: Scope,
        raw_key: &[u8],
        fingerprint: Fingerprint,
    ) -> Result<Begin<S>, StoreError> {
        match IdempotencyKey::parse(raw_key, self.shared.config.key_format) {
            Ok(key) => self.begin(scope, key, fingerprint).await,
            Err(e) => Ok(Begin::Invalid(e)),
        }
    }

    /// Claims `(scope, key)` for a request with `fingerprint` and decides what to do:
    ///
    /// - no live record: the claim is taken, [`Begin::Proceed`];
    /// - a live record with another fingerprint: [`Begin::Mismatch`] (whatever its state);
    /// - a completed record with this fingerprint: [`Begin::Replay`];
    /// - an in-flight record with this fingerprint: wait up to
    ///   [`EngineConfig::in_flight_wait`] for it to finish (replay) or be released (proceed),
    ///   then [`Begin::InFlight`].
    ///
    /// One store round trip when no waiting is configured.
    pub async fn begin(
        &self,
        scope: Scope,
        key: IdempotencyKey,
        fingerprint: Fingerprint,
    ) -> Result<Begin<S>, StoreError> {
        let config = &self.shared.config;
        let token = LeaseToken::new();
        let deadline = Instant::now() + config.in_flight_wait;
        let mut poll = FIRST_POLL;
        loop {
            let outcome = self
                .shared
                .store
                .claim(&scope, &key, &fingerprint, token, config.lease)
                .await?;
            let record = match outcome {
                ClaimOutcome::Claimed => {
                    return Ok(Begin::Proceed(Guard {
                        shared: Arc::clone(&self.shared),
                        claim: Some(Claim { scope, key, token }),
                    }));
                }
                ClaimOutcome::Existing(record) => record,
            };
            if record.fingerprint != fingerprint {
                return Ok(Begin::Mismatch);
            }
            match record.state {
                RecordState::Completed { response } => return Ok(Begin::Replay(response)),
                RecordState::InFlight { lease_remaining } => {
                    let now = Instant::now();
                    if now >= deadline {
                        return Ok(Begin::InFlight {
                            retry_after: lease_remaining,
                        });
                    }
                    let nap = poll
                        .min(deadline - now)
                        .min(lease_remaining.max(FIRST_POLL));
                    tokio::time::sleep(nap).await;
                    poll = (poll * 2).min(MAX_POLL);
                }
            }
        }
    }
}

struct Claim {
    scope: Scope,
    key: IdempotencyKey,
    token: LeaseToken,
}

/// What [`Guard::complete`] did with the response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Completion {
    /// The response is stored and will be replayed.
    Stored,
    /// The policy does not store this status: the key was released for a retry.
    Released,
    /// The lease had run out and the key was taken over, released or expired: nothing was
    /// stored. The response still goes to this client, but retries get the other request's.
    Stale,
}

/// Proof that this request holds the claim on its key. Hand the handler's response to
/// [`Guard::complete`], or give the key back with [`Guard::release`]. A guard dropped without
/// either (a panic, a cancelled future) releases the key in the background when a Tokio runtime
/// is running; otherwise the key frees itself when its lease runs out.
pub struct Guard<S: IdempotencyStore + 'static> {
    shared: Arc<Shared<S>>,
    claim: Option<Claim>,
}

impl<S: IdempotencyStore + 'static> fmt::Debug for Guard<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Guard");
        if let Some(c) = &self.claim {
            d.field("scope", &c.scope)
                .field("key", &c.key)
                .field("token", &c.token);
        }
        d.finish()
    }
}

impl<S: IdempotencyStore + 'static> Guard<S> {
    /// Whether a response with `status` would be stored (so a caller can skip buffering a body
    /// that will not be kept).
    pub fn will_store(&self, status: StatusCode) -> bool {
        self.shared.config.store_policy.should_store(status)
    }

    /// The token that holds the claim.
    pub fn token(&self) -> Option<LeaseToken> {
        self.claim.as_ref().map(|c| c.token)
    }

    /// Moves the end of this claim's lease to one lease from now. [`FenceOutcome::Stale`] when
    /// the lease had already run out (and the key may have been taken over).
    pub async fn extend(&self) -> Result<FenceOutcome, StoreError> {
        let Some(claim) = self.claim.as_ref() else {
            return Ok(FenceOutcome::Stale);
        };
        let lease = self.shared.config.lease;
        self.shared
            .store
            .extend(&claim.scope, &claim.key, claim.token, lease)
            .await
    }

    /// Runs `work` (the handler) while keeping the claim alive: with
    /// [`EngineConfig::heartbeat`] on, the lease is extended every third of its length until
    /// `work` finishes. A failed extension is retried at the next beat; a stale one (the lease
    /// had run out) stops the heartbeat and is logged.
    pub async fn keep_alive<F: std::future::Future>(&self, work: F) -> F::Output {
        let config = &self.shared.config;
        if !config.heartbeat || self.claim.is_none() {
            return work.await;
        }
        let interval = (config.lease / 3).max(Duration::from_millis(10));
        let heartbeat = async {
            loop {
                tokio::time::sleep(interval).await;
                match self.extend().await {
                    Ok(FenceOutcome::Applied) => {}
                    Ok(FenceOutcome::Stale) => {
                        tracing::warn!(
                            backend = self.shared.store.backend(),
                            "the lease ran out while the handler was running; another request may run it too"
                        );
                        break;
                    }
                    Err(error) => tracing::warn!(
                        backend = self.shared.store.backend(),
                        %error,
                        "could not extend the lease; trying again at the next beat"
                    ),
                }
            }
            std::future::pending::<()>().await
        };
        tokio::pin!(work);
        tokio::select! {
            biased;
            output = &mut work => output,
            () = heartbeat => unreachable!("the heartbeat never finishes"),
        }
    }

    /// Stores the handler's response (or releases the key when the policy does not store its
    /// status). One store round trip. If the call fails, the guard's drop still tries to release
    /// the key, and the lease is the last resort.
    pub async fn complete(mut self, response: StoredResponse) -> Result<Completion, StoreError> {
        let Some(claim) = self.claim.as_ref() else {
            return Ok(Completion::Stale);
        };
        let store = &self.shared.store;
        let config = &self.shared.config;
        let completion = if config.store_policy.should_store(response.status()) {
            match store
                .complete(
                    &claim.scope,
                    &claim.key,
                    claim.token,
                    &response,
                    config.retention,
                )
                .await?
            {
                FenceOutcome::Applied => Completion::Stored,
                FenceOutcome::Stale => Completion::Stale,
            }
        } else {
            match store.release(&claim.scope, &claim.key, claim.token).await? {
                FenceOutcome::Applied => Completion::Released,
                FenceOutcome::Stale => Completion::Stale,
            }
        };
        if completion == Completion::Stale {
            tracing::warn!(
                backend = store.backend(),
                "lease lost before completion: the response was not stored"
            );
        }
        self.claim = None;
        Ok(completion)
    }

    /// Gives the key back so a retry can run at once.
    pub async fn release(mut self) -> Result<FenceOutcome, StoreError> {
        let Some(claim) = self.claim.as_ref() else {
            return Ok(FenceOutcome::Stale);
        };
        let outcome = self
            .shared
            .store
            .release(&claim.scope, &claim.key, claim.token)
            .await?;
        self.claim = None;
        Ok(outcome)
    }
}

impl<S: IdempotencyStore + 'static> Drop for Guard<S> {
    fn drop(&mut self) {
        let Some(claim) = self.claim.take() else {
            return;
        };
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(
                "guard dropped outside a Tokio runtime: the key frees when its lease runs out"
            );
            return;
        };
        let shared = Arc::clone(&self.shared);
        handle.spawn(async move {
            match shared
                .store
                .release(&claim.scope, &claim.key, claim.token)
                .await
            {
                Ok(_) => tracing::debug!(
                    backend = shared.store.backend(),
                    "dropped guard released its key"
                ),
                Err(error) => tracing::warn!(
                    backend = shared.store.backend(),
                    %error,
                    "dropped guard could not release its key; it frees when its lease runs out"
                ),
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standard_policy_stores_2xx_to_4xx_but_not_transient_or_server_errors() {
        let p = StorePolicy::standard();
        for s in [200, 201, 204, 301, 400, 404, 409, 422, 499] {
            assert!(p.should_store(StatusCode::from_u16(s).unwrap()), "{s}");
        }
        for s in [100, 408, 429, 500, 502, 503, 504] {
            assert!(!p.should_store(StatusCode::from_u16(s).unwrap()), "{s}");
        }
        assert!(StorePolicy::all_final().should_store(StatusCode::INTERNAL_SERVER_ERROR));
        assert!(!StorePolicy::custom(|s| s == StatusCode::CREATED).should_store(StatusCode::OK));
    }
}
