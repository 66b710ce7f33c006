//! A per-scope limit on new keys, in this process: one caller cannot make the store grow
//! without bound (a PostgreSQL table, a Redis instance up to `maxmemory`, after which every
//! caller's claims fail) by flooding it with new keys.

use crate::scope::Scope;
use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

const SHARDS: usize = 16;

/// At most this many new keys per scope per window ([`EngineConfig::new_keys_per_scope`](crate::EngineConfig#structfield.new_keys_per_scope)).
///
/// [`EngineConfig::new_keys_per_scope`]: crate::EngineConfig#structfield.new_keys_per_scope
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScopeLimit {
    /// New keys a scope may start per window.
    pub keys: u32,
    /// The window.
    pub per: Duration,
}

/// One scope's count in its current window.
struct Window {
    started: Instant,
    count: u32,
}

/// The counts of every scope seen in the current windows, sharded by scope.
pub(crate) struct ScopeLimiter {
    limit: ScopeLimit,
    shards: Box<[Mutex<HashMap<Scope, Window>>]>,
    hasher: RandomState,
}

impl ScopeLimiter {
    pub(crate) fn new(limit: ScopeLimit) -> Self {
        ScopeLimiter {
            limit,
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            hasher: RandomState::new(),
        }
    }

    /// The limit.
    pub(crate) fn limit(&self) -> ScopeLimit {
        self.limit
    }

    fn shard(&self, scope: &Scope) -> std::sync::MutexGuard<'_, HashMap<Scope, Window>> {
        let index = (self.hasher.hash_one(scope.as_str()) as usize) % SHARDS;
        // No code panics while holding it; recover the map if that ever changes.
        self.shards[index]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Counts a new key of `scope`: `Ok` with the charge (to [`ScopeLimiter::refund`] if the
    /// key turns out not to be new) when its window has room, else `Err` with the time left in
    /// the window. The unscoped key space has no limit (it is every caller's).
    pub(crate) fn admit(&self, scope: &Scope) -> Result<Charge, Duration> {
        let now = Instant::now();
        if scope.as_str() == Scope::UNSCOPED {
            return Ok(Charge(now));
        }
        let mut shard = self.shard(scope);
        if shard.len() >= 1024 && shard.len().is_power_of_two() {
            // Forget the scopes whose window is over, so the map holds the active ones only.
            let per = self.limit.per;
            shard.retain(|_, window| now.duration_since(window.started) < per);
        }
        let window = match shard.get_mut(scope) {
            Some(window) => window,
            None => shard.entry(scope.clone()).or_insert(Window {
                started: now,
                count: 0,
            }),
        };
        let elapsed = now.duration_since(window.started);
        if elapsed >= self.limit.per {
            *window = Window {
                started: now,
                count: 0,
            };
        }
        if window.count >= self.limit.keys {
            return Err(self.limit.per.saturating_sub(elapsed));
        }
        window.count += 1;
        Ok(Charge(window.started))
    }

    /// Gives back a charge of [`ScopeLimiter::admit`] for a key that was not new after all (a
    /// speculative request whose key turned out completed or running: a replay, a mismatch, a
    /// duplicate). A charge of a window that has ended since counts no more, and is ignored.
    pub(crate) fn refund(&self, scope: &Scope, Charge(window_started): Charge) {
        if scope.as_str() == Scope::UNSCOPED {
            return;
        }
        if let Some(window) = self.shard(scope).get_mut(scope)
            && window.started == window_started
        {
            window.count = window.count.saturating_sub(1);
        }
    }
}

/// One new key counted against its scope's window (the window's start identifies it).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Charge(Instant);

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_scope_gets_its_keys_per_window_and_others_are_not_counted() {
        let per = Duration::from_millis(200);
        let limiter = ScopeLimiter::new(ScopeLimit { keys: 3, per });
        let (a, b) = (Scope::new("a").unwrap(), Scope::new("b").unwrap());
        for _ in 0..3 {
            assert!(limiter.admit(&a).is_ok());
        }
        let refused = limiter.admit(&a).unwrap_err();
        assert!(refused <= per && refused > Duration::ZERO, "{refused:?}");
        assert!(limiter.admit(&b).is_ok(), "another scope has its own count");
        for _ in 0..100 {
            assert!(limiter.admit(&Scope::unscoped()).is_ok());
        }
        tokio::time::sleep(per).await;
        assert!(limiter.admit(&a).is_ok(), "a new window");
    }

    #[tokio::test]
    async fn a_refunded_charge_makes_room_only_in_its_own_window() {
        let per = Duration::from_millis(200);
        let limiter = ScopeLimiter::new(ScopeLimit { keys: 2, per });
        let a = Scope::new("a").unwrap();
        let first = limiter.admit(&a).unwrap();
        limiter.admit(&a).unwrap();
        assert!(limiter.admit(&a).is_err(), "full");
        limiter.refund(&a, first);
        let again = limiter.admit(&a).expect("the refund made room");
        assert!(
            limiter.admit(&a).is_err(),
            "full again: one refund, one key"
        );
        tokio::time::sleep(per).await;
        let new_window = limiter.admit(&a).unwrap();
        limiter.refund(&a, again);
        limiter.admit(&a).unwrap();
        assert!(
            limiter.admit(&a).is_err(),
            "a charge of the old window gave nothing back in the new one"
        );
        limiter.refund(&a, new_window);
        assert!(limiter.admit(&a).is_ok());
    }
}
