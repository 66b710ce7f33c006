//! A per-scope limit on new keys, in this process: one caller cannot make the store grow
//! without bound (a PostgreSQL table, a Redis instance up to `maxmemory`, after which every
//! caller's claims fail) by flooding it with new keys.

use crate::Scope;
use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

const SHARDS: usize = 16;

/// At most this many new keys per scope per window ([`EngineConfig::new_keys_per_scope`]).
///
/// [`EngineConfig::new_keys_per_scope`]: crate::EngineConfig::new_keys_per_scope
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

    /// Counts a new key of `scope`: `Ok` when its window has room, else `Err` with the time
    /// left in the window. The unscoped key space has no limit (it is every caller's).
    pub(crate) fn admit(&self, scope: &Scope) -> Result<(), Duration> {
        if scope.as_str() == Scope::UNSCOPED {
            return Ok(());
        }
        let now = Instant::now();
        let index = (self.hasher.hash_one(scope.as_str()) as usize) % SHARDS;
        // No code panics while holding it; recover the map if that ever changes.
        let mut shard = self.shards[index]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
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
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_scope_gets_its_keys_per_window_and_others_are_not_counted() {
        let per = Duration::from_millis(200);
        let limiter = ScopeLimiter::new(ScopeLimit { keys: 3, per });
        let (a, b) = (Scope::new("a").unwrap(), Scope::new("b").unwrap());
        for _ in 0..3 {
            assert_eq!(limiter.admit(&a), Ok(()));
        }
        let refused = limiter.admit(&a).unwrap_err();
        assert!(refused <= per && refused > Duration::ZERO, "{refused:?}");
        assert_eq!(limiter.admit(&b), Ok(()), "another scope has its own count");
        for _ in 0..100 {
            assert_eq!(limiter.admit(&Scope::unscoped()), Ok(()));
        }
        tokio::time::sleep(per).await;
        assert_eq!(limiter.admit(&a), Ok(()), "a new window");
    }
}
