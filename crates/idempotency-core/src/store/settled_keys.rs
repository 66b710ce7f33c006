//! Waking duplicates across processes: a store that can tell this process when another one
//! settled a key (PostgreSQL's `LISTEN`/`NOTIFY`, Redis pub/sub) hands the key's [`wake_id`] to
//! its [`SettledKeys`], which wakes the duplicates the engines of this process have waiting for
//! it. [`SettleListener`] keeps the listening session, as every such store keeps it; the store
//! only opens one.
//!
//! The protocol: a duplicate that waits asks its store to watch the key
//! ([`IdempotencyStore::watch_settle`](crate::IdempotencyStore::watch_settle)): the store makes
//! sure it listens, then marks the key's running record as waited for. The request that settles
//! a marked record (stores its answer or gives the key back) sends the key's id from the same
//! statement, so the notice goes out when, and only when, the settle commits. A request whose
//! key nobody waits for sends nothing. A notice only makes an answer come sooner: the woken
//! duplicate asks the store again, and one that never comes (a listening connection lost) is
//! made up for by the duplicate's polling.

use crate::{IdempotencyKey, Scope, StoreError};
use sha2::{Digest, Sha256};
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use tokio::sync::mpsc::UnboundedSender;
use tokio_util::sync::CancellationToken;

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

/// A store's listening session for settle notices, as every store keeps it: opened at the first
/// waiting duplicate ([`SettleListener::ensure`], one opening at a time), kept while it lasts,
/// opened again by the next wait after it ended (its connection lost: notices sent meanwhile are
/// missed, and the duplicates waiting then poll), and never asked for again once the store said
/// it cannot open one. What it hears goes to its [`SettledKeys`]. Dropped (with the store), it
/// ends the session.
pub struct SettleListener {
    settled: Arc<SettledKeys>,
    /// A session listens now: a notice sent from now on is heard.
    listening: Arc<AtomicBool>,
    /// The store cannot open a session: never asked again.
    unavailable: AtomicBool,
    opening: tokio::sync::Mutex<()>,
    stop: CancellationToken,
}

impl fmt::Debug for SettleListener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SettleListener")
            .field("listening", &self.listening.load(Ordering::Relaxed))
            .field("unavailable", &self.unavailable.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Default for SettleListener {
    fn default() -> Self {
        SettleListener {
            settled: Arc::new(SettledKeys::new()),
            listening: Arc::new(AtomicBool::new(false)),
            unavailable: AtomicBool::new(false),
            opening: tokio::sync::Mutex::new(()),
            stop: CancellationToken::new(),
        }
    }
}

impl Drop for SettleListener {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl SettleListener {
    /// No session yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// What the session hears, for [`IdempotencyStore::settled_keys`](crate::IdempotencyStore::settled_keys).
    pub fn settled_keys(&self) -> &SettledKeys {
        &self.settled
    }

    /// Makes sure a session listens: `Ok(true)` once one does (at once when one already did).
    /// Otherwise `open(notices, stop)` opens one: it must return once a notice sent from then
    /// on is heard, send each notice's payload (a [`wake_id`] in 16 hex digits) to `notices`,
    /// and end when `stop` is cancelled or its connection is lost, dropping `notices`; it
    /// answers `Ok(false)` when the store cannot open a session, and then this answers
    /// `Ok(false)` for good.
    pub async fn ensure<F, Fut>(&self, open: F) -> Result<bool, StoreError>
    where
        F: FnOnce(UnboundedSender<String>, CancellationToken) -> Fut,
        Fut: Future<Output = Result<bool, StoreError>>,
    {
        if self.listening.load(Ordering::Acquire) {
            return Ok(true);
        }
        if self.unavailable.load(Ordering::Relaxed) {
            return Ok(false);
        }
        let _opening = self.opening.lock().await;
        if self.listening.load(Ordering::Acquire) {
            return Ok(true);
        }
        let (notices, mut heard) = tokio::sync::mpsc::unbounded_channel::<String>();
        if !open(notices, self.stop.child_token()).await? {
            self.unavailable.store(true, Ordering::Relaxed);
            return Ok(false);
        }
        self.listening.store(true, Ordering::Release);
        let (listening, settled) = (Arc::clone(&self.listening), Arc::clone(&self.settled));
        tokio::spawn(async move {
            while let Some(payload) = heard.recv().await {
                if let Some(id) = parse_wake_id(&payload) {
                    settled.settled(id);
                }
            }
            // The session ended (the store dropped, or its connection lost): the next waiting
            // duplicate opens another; until then, duplicates poll.
            listening.store(false, Ordering::Release);
            tracing::debug!("the store's listening session for settle notices ended");
        });
        Ok(true)
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

    #[tokio::test]
    async fn a_session_is_opened_once_reopened_after_it_ends_and_never_where_none_can_be() {
        use std::sync::atomic::AtomicUsize;
        let listener = SettleListener::new();
        let seen = Arc::new(AtomicU64::new(0));
        let told = Arc::clone(&seen);
        let subscriber: Arc<OnSettled> = Arc::new(move |id| told.store(id, Ordering::SeqCst));
        listener.settled_keys().subscribe(&subscriber);
        let opened = Arc::new(AtomicUsize::new(0));
        let (session, mut ended) =
            tokio::sync::mpsc::unbounded_channel::<UnboundedSender<String>>();
        let open = |notices: UnboundedSender<String>, _stop| {
            opened.fetch_add(1, Ordering::SeqCst);
            let session = session.clone();
            async move {
                session.send(notices).expect("the test holds the session");
                Ok(true)
            }
        };
        assert!(listener.ensure(open).await.expect("opened"));
        assert!(listener.ensure(open).await.expect("listening"));
        assert_eq!(
            opened.load(Ordering::SeqCst),
            1,
            "one session while it lasts"
        );
        let notices = ended.recv().await.expect("the session's sender");
        notices.send("00000000000000ff".to_owned()).expect("heard");
        notices.send("not an id".to_owned()).expect("heard");
        notices.send("0000000000000007".to_owned()).expect("heard");
        drop(notices);
        // The session ended: the next wait opens another.
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
        while listener.listening.load(Ordering::Acquire) {
            assert!(tokio::time::Instant::now() < deadline, "the end is noticed");
            tokio::task::yield_now().await;
        }
        assert_eq!(
            seen.load(Ordering::SeqCst),
            7,
            "ids passed on, in order; the rest ignored"
        );
        assert!(listener.ensure(open).await.expect("reopened"));
        assert_eq!(opened.load(Ordering::SeqCst), 2);

        let unable = SettleListener::new();
        let tried = AtomicUsize::new(0);
        for _ in 0..2 {
            let listening = unable
                .ensure(|_, _| {
                    tried.fetch_add(1, Ordering::SeqCst);
                    async { Ok(false) }
                })
                .await
                .expect("an answer");
            assert!(!listening);
        }
        assert_eq!(
            tried.load(Ordering::SeqCst),
            1,
            "a store that cannot is not asked again"
        );
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
