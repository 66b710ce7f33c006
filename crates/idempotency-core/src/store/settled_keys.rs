//! Waking duplicates across processes: a store that can tell this process when another one
//! settled a key (PostgreSQL's `LISTEN`/`NOTIFY`) hands the key's [`wake_id`] to its
//! [`SettledKeys`], which wakes the duplicates the engines of this process have waiting for it.
//!
//! The protocol: a duplicate that waits asks its store to watch the key
//! ([`IdempotencyStore::watch_settle`](crate::IdempotencyStore::watch_settle)): the store makes
//! sure it listens, then marks the key's running record as waited for. The request that settles
//! a marked record (stores its answer or gives the key back) sends the key's id from the same
//! statement, so the notice goes out when, and only when, the settle commits. A request whose
//! key nobody waits for sends nothing. A notice only makes an answer come sooner: the woken
//! duplicate asks the store again, and one that never comes (a listening connection lost) is
//! made up for by the duplicate's polling.

use crate::{IdempotencyKey, Scope};
use sha2::{Digest, Sha256};
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError, Weak};

/// The id by which processes tell each other that `(scope, key)` settled: the first 8 bytes,
/// big-endian, of the SHA-256 of the scope's length in bytes (decimal), `:`, the scope and the
/// key. A store computes it on its side too (PostgreSQL: `left(encode(sha256(convert_to(
/// octet_length(convert_to(scope, 'UTF8'))::text || ':' || scope || key, 'UTF8')), 'hex'), 16)`),
/// and sends it as 16 hex digits ([`parse_wake_id`]). Two keys with one id wake each other's
/// duplicates, which find their own key still running and wait on.
pub fn wake_id(scope: &Scope, key: &IdempotencyKey) -> u64 {
    let (scope, key) = (scope.as_str(), key.as_str());
    let mut digest = Sha256::new();
    digest.update(scope.len().to_string().as_bytes());
    digest.update(b":");
    digest.update(scope.as_bytes());
    digest.update(key.as_bytes());
    let digest = digest.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(first)
}

/// A [`wake_id`] sent as 16 hex digits; `None` for anything else (a notice of another sender on
/// the same channel is ignored).
pub fn parse_wake_id(text: &str) -> Option<u64> {
    if text.len() != 16 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(text, 16).ok()
}

/// What a subscriber is told: the [`wake_id`] of a key another process settled.
pub type OnSettled = dyn Fn(u64) + Send + Sync;

/// The keys other processes settled, as a store hears of them, passed on to whoever listens in
/// this process (each engine over the store, for its waiting duplicates). Subscribers are held
/// weakly: one dropped is forgotten.
#[derive(Default)]
pub struct SettledKeys {
    subscribers: Mutex<Vec<Weak<OnSettled>>>,
}

impl fmt::Debug for SettledKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SettledKeys")
            .field("subscribers", &self.lock().len())
            .finish()
    }
}

impl SettledKeys {
    /// No subscriber yet.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Weak<OnSettled>>> {
        // A push or a retain, whole between statements: a poisoned list is consistent.
        self.subscribers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Tells `on_settled` of every key settled from now on, for as long as the caller keeps it.
    pub fn subscribe(&self, on_settled: &Arc<OnSettled>) {
        let mut subscribers = self.lock();
        subscribers.retain(|subscriber| subscriber.strong_count() > 0);
        subscribers.push(Arc::downgrade(on_settled));
    }

    /// Another process settled the key of `id`: every subscriber is told.
    pub fn settled(&self, id: u64) {
        let subscribers: Vec<Arc<OnSettled>> =
            self.lock().iter().filter_map(Weak::upgrade).collect();
        for subscriber in subscribers {
            subscriber(id);
        }
    }
}

#[cfg(test)]
#[cfg(not(idempotency_loom))]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    #[test]
    fn the_id_is_the_digest_a_store_computes_in_sql() {
        // `printf '2:sckey' | sha256sum | cut -c1-16`, and PostgreSQL's expression above.
        let scope = Scope::new("sc").unwrap();
        let key = IdempotencyKey::parse(b"key", Default::default()).unwrap();
        assert_eq!(wake_id(&scope, &key), 0x01da_965a_a267_5244);
        assert_eq!(
            parse_wake_id("01da965aa2675244"),
            Some(0x01da_965a_a267_5244)
        );
        let other = Scope::new("sck").unwrap();
        let rest = IdempotencyKey::parse(b"ey", Default::default()).unwrap();
        assert_ne!(
            wake_id(&other, &rest),
            wake_id(&scope, &key),
            "the scope's length keeps ('sck', 'ey') apart from ('sc', 'key')"
        );
    }

    #[test]
    fn anything_but_sixteen_hex_digits_is_no_id() {
        for text in [
            "",
            "01da965aa267524",
            "01da965aa26752440",
            "01da965aa267524g",
            "+1da965aa2675244",
        ] {
            assert_eq!(parse_wake_id(text), None, "{text:?}");
        }
    }

    #[test]
    fn subscribers_are_told_while_they_are_kept() {
        let keys = SettledKeys::new();
        let seen = Arc::new(AtomicU64::new(0));
        let seen_by = Arc::clone(&seen);
        let subscriber: Arc<OnSettled> = Arc::new(move |id| {
            seen_by.store(id, Ordering::SeqCst);
        });
        keys.subscribe(&subscriber);
        keys.settled(7);
        assert_eq!(seen.load(Ordering::SeqCst), 7);
        drop(subscriber);
        keys.settled(9);
        assert_eq!(
            seen.load(Ordering::SeqCst),
            7,
            "a dropped subscriber is not told"
        );
        let again: Arc<OnSettled> = Arc::new(|_| {});
        keys.subscribe(&again);
        assert_eq!(keys.lock().len(), 1, "the dropped one is forgotten");
    }
}
