//! The claim a running request holds, as its handler sees it.

use crate::derived_key::DerivedKey;
use crate::key::IdempotencyKey;
use crate::record::LeaseToken;
use crate::scope::Scope;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

const HELD: u8 = 0;
const LOST: u8 = 1;
const FINISHED: u8 = 2;

/// The claim of a running request on its `(scope, key)`: what it is, and whether it is still
/// held. Cheap to clone. The HTTP layer puts it in the request extensions, so a handler can read
/// its key and fencing token (to pass to a downstream system that accepts one) and can stop
/// early when the lease is lost:
///
/// ```
/// # async fn charge(amount: u64) -> Result<(), ()> { Ok(()) }
/// # async fn handler(claim: idempotency_core::KeyClaim) -> Result<(), &'static str> {
/// tokio::select! {
///     result = charge(100) => result.map_err(|()| "charge failed"),
///     () = claim.lost() => Err("lease lost: another request may run this one"),
/// }
/// # }
/// ```
///
/// A lease is lost when the store says another request took the key over, or when it ran out
/// by this process's clock because the heartbeat could not extend it (or is turned off).
#[derive(Clone)]
pub struct KeyClaim(Arc<State>);

struct State {
    scope: Scope,
    key: IdempotencyKey,
    token: LeaseToken,
    length: Duration,
    /// When the claim was sent; deadlines are kept as milliseconds after it.
    base: Instant,
    /// End of the lease by this process's clock, in ms after `base`: the start of the last
    /// successful claim or extension plus the lease, so never later than the store's end.
    deadline_ms: AtomicU64,
    phase: AtomicU8,
    /// The request no longer wants its lease extended (it stored or is releasing its outcome).
    heartbeat_stopped: AtomicBool,
    /// The request is storing its response: the heartbeat goes on extending (a slow store call
    /// must not let the lease lapse), and a "stale" answer that the completion itself caused
    /// is not a loss.
    completing: AtomicBool,
    changed: Notify,
}

impl KeyClaim {
    /// A lease on `(scope, key)` for `token`, whose claim was sent at `claimed_at`.
    pub(crate) fn new(
        scope: Scope,
        key: IdempotencyKey,
        token: LeaseToken,
        length: Duration,
        claimed_at: Instant,
    ) -> Self {
        KeyClaim(Arc::new(State {
            scope,
            key,
            token,
            length,
            base: claimed_at,
            deadline_ms: AtomicU64::new(millis(length)),
            phase: AtomicU8::new(HELD),
            heartbeat_stopped: AtomicBool::new(false),
            completing: AtomicBool::new(false),
            changed: Notify::new(),
        }))
    }

    /// The scope (the authenticated principal) the key belongs to.
    pub fn scope(&self) -> &Scope {
        &self.0.scope
    }

    /// The client's idempotency key.
    pub fn key(&self) -> &IdempotencyKey {
        &self.0.key
    }

    /// The idempotency key to send with the call of step `step` to another service (a payment
    /// provider, a mailer): the same on every run of this request — a retry, a takeover after a
    /// crash or a lapsed lease, another instance — so the other service replays instead of
    /// acting twice; another one for another step, scope or key; and not the client's key
    /// ([`DerivedKey`]).
    ///
    /// ```
    /// # async fn charge(amount: u64, key: &str) -> Result<(), ()> { Ok(()) }
    /// # async fn handler(claim: idempotency_core::KeyClaim) -> Result<(), ()> {
    /// charge(100, claim.derive_key("charge").as_str()).await?;
    /// # Ok(()) }
    /// ```
    pub fn derive_key(&self, step: &str) -> DerivedKey {
        DerivedKey::derive(&self.0.scope, &self.0.key, step)
    }

    /// The fencing token of this claim: every change of the record checks it, and a downstream
    /// system that accepts fencing tokens can be given it.
    pub fn token(&self) -> LeaseToken {
        self.0.token
    }

    /// Whether this request still holds its key: not lost, not finished, and not past its end
    /// by this process's clock.
    pub fn is_held(&self) -> bool {
        self.0.phase.load(Ordering::Acquire) == HELD && Instant::now() < self.deadline()
    }

    /// Resolves when the lease is lost (the store says another request took the key over) or
    /// has run out by this process's clock (the heartbeat could not extend it in time: another
    /// request may take the key over). Never resolves for a request that finishes while holding
    /// it. Running out by the local clock does not give the key up: the heartbeat keeps trying
    /// until the store answers, and the response is stored if the store still has this claim.
    pub async fn lost(&self) {
        loop {
            let changed = self.0.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            match self.0.phase.load(Ordering::Acquire) {
                LOST => return,
                FINISHED => std::future::pending::<()>().await,
                _ => {}
            }
            let deadline = self.deadline();
            if Instant::now() >= deadline {
                return;
            }
            tokio::select! {
                () = changed => {}
                () = tokio::time::sleep_until(deadline) => {}
            }
        }
    }

    /// End of the lease by this process's clock.
    pub(crate) fn deadline(&self) -> Instant {
        let ms = self.0.deadline_ms.load(Ordering::Acquire);
        self.0
            .base
            .checked_add(Duration::from_millis(ms))
            // A lease too long for the clock: it does not end in this process's lifetime.
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(30 * 365 * 86_400))
    }

    /// The lease's length.
    pub(crate) fn length(&self) -> Duration {
        self.0.length
    }

    /// When the claim was sent.
    pub(crate) fn claimed_at(&self) -> Instant {
        self.0.base
    }

    /// An extension sent at `sent_at` succeeded.
    pub(crate) fn renewed(&self, sent_at: Instant) {
        let end = self.end_ms(sent_at, self.0.length);
        self.0.deadline_ms.fetch_max(end, Ordering::AcqRel);
        self.0.changed.notify_waiters();
    }

    /// The key was claimed again with this token at `sent_at`, for `lease` (in the
    /// one-transaction modes, once the request's transaction is gone and its response is stored
    /// outside it): from now on the claim ends when that lease does, not when the transaction's
    /// "no end" did, so a store retried in the background stops when another request may hold
    /// the key.
    pub(crate) fn reclaimed(&self, sent_at: Instant, lease: Duration) {
        let end = self.end_ms(sent_at, lease);
        self.0.deadline_ms.store(end, Ordering::Release);
        self.0.changed.notify_waiters();
    }

    /// The end of a hold of `length` sent at `sent_at`, in ms after `base`.
    fn end_ms(&self, sent_at: Instant, length: Duration) -> u64 {
        millis(sent_at.saturating_duration_since(self.0.base) + length)
    }

    /// The store refused this token, or the lease ran out: another request may hold the key.
    pub(crate) fn mark_lost(&self) {
        if self
            .0
            .phase
            .compare_exchange(HELD, LOST, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            self.0.changed.notify_waiters();
        }
    }

    /// The request is storing or releasing its outcome: its heartbeat stops.
    pub(crate) fn stop_heartbeat(&self) {
        if !self.0.heartbeat_stopped.swap(true, Ordering::AcqRel) {
            self.0.changed.notify_waiters();
        }
    }

    /// Whether the heartbeat should (still) extend this lease: held, and not stopped.
    pub(crate) fn heartbeat_wanted(&self) -> bool {
        self.0.phase.load(Ordering::Acquire) == HELD
            && !self.0.heartbeat_stopped.load(Ordering::Acquire)
    }

    /// Sleeps for `period` unless the heartbeat stops first; returns whether it is still wanted.
    pub(crate) async fn sleep_while_heartbeat_wanted(&self, period: Duration) -> bool {
        let until = Instant::now() + period;
        loop {
            let changed = self.0.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if !self.heartbeat_wanted() {
                return false;
            }
            tokio::select! {
                () = changed => {}
                () = super::timer::sleep_until(until) => return self.heartbeat_wanted(),
            }
        }
    }

    /// The request is storing its response: the heartbeat goes on, and a "stale" answer the
    /// completion caused is not a loss.
    pub(crate) fn completing(&self) {
        self.0.completing.store(true, Ordering::Release);
    }

    /// Whether the request is storing its response.
    pub(crate) fn is_completing(&self) -> bool {
        self.0.completing.load(Ordering::Acquire)
    }

    /// The request finished (stored or released): the lease is no longer held, nor lost.
    pub(crate) fn finish(&self) {
        if self
            .0
            .phase
            .compare_exchange(HELD, FINISHED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            self.0.changed.notify_waiters();
        }
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl fmt::Debug for KeyClaim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyClaim")
            .field("scope", &self.0.scope)
            .field("key", &self.0.key)
            .field("token", &self.0.token)
            .field("held", &self.is_held())
            .finish()
    }
}
