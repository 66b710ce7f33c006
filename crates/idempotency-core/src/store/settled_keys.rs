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
//!
//! A request of the one-transaction modes has no record to mark until it commits: its
//! duplicate sends the key's id as a *watch* instead ([`WATCH_PREFIX`] and the id, on the same
//! channel), which every listening process keeps for a while ([`SettledKeys::waited_for`]); the
//! process whose request holds the key then sends the key's id with that request's commit
//! ([`SettledKeys::take_waited_for`]). A watch heard after that commit was sent is simply kept
//! until it ages out, and its duplicate polls.

use crate::key::IdempotencyKey;

use crate::scope::Scope;

use crate::error::StoreError;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};
use tokio::sync::mpsc::UnboundedSender;
use tokio_util::sync::CancellationToken;

/// What a watch's payload starts with, before the key's [`wake_id`] in 16 hex digits: `w`,
/// which no wake id in hex starts with, so a process that predates watches ignores them.
pub const WATCH_PREFIX: char = 'w';

/// How long a heard watch is kept for the request that holds its key: past it, the duplicate
/// that sent it has stopped waiting or polled its answer.
pub const WATCH_KEPT_FOR: Duration = Duration::from_secs(60);

/// The most watches a process keeps at once; past it, a new watch is not kept (its duplicate
/// polls), so a flood of them cannot grow the process.
pub const MOST_WATCHES_KEPT: usize = 16_384;

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
///
/// It also keeps the watches it hears: the keys duplicates on other processes wait for while a
/// one-transaction request holds them (see the module's documentation).
#[derive(Default)]
pub struct SettledKeys {
    subscribers: Mutex<Vec<Weak<OnSettled>>>,
    /// Watches heard, by wake id, with when.
    watches: Mutex<HashMap<u64, Instant>>,
    /// How many `watches` holds: read without the lock by every commit, which looks no further
    /// while it is 0.
    watch_count: AtomicUsize,
}

impl fmt::Debug for SettledKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SettledKeys")
            .field("subscribers", &self.lock().len())
            .field("watches", &self.watch_count.load(Ordering::Relaxed))
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

    fn watches(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Instant>> {
        // An insert or a removal, whole between statements: a poisoned map is consistent.
        self.watches.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A duplicate on some process waits for the key of `id`, held by a one-transaction
    /// request: kept for [`WATCH_KEPT_FOR`], so that the request of this process that holds the
    /// key sends `id` with its commit. Past [`MOST_WATCHES_KEPT`] (after the aged ones are
    /// dropped), not kept.
    pub fn waited_for(&self, id: u64) {
        let now = Instant::now();
        let mut watches = self.watches();
        if watches.len() >= MOST_WATCHES_KEPT {
            watches.retain(|_, heard| now.duration_since(*heard) < WATCH_KEPT_FOR);
        }
        if watches.len() < MOST_WATCHES_KEPT {
            watches.insert(id, now);
        }
        self.watch_count.store(watches.len(), Ordering::Release);
    }

    /// Whether a watch of `id` is kept now (what a test or a probe may ask; it takes nothing).
    pub fn is_waited_for(&self, id: u64) -> bool {
        self.watch_count.load(Ordering::Acquire) > 0
            && self
                .watches()
                .get(&id)
                .is_some_and(|heard| heard.elapsed() < WATCH_KEPT_FOR)
    }

    /// A one-transaction request of this process is about to commit `(scope, key)`: whether a
    /// duplicate waits for it elsewhere, so that the commit sends the key's [`wake_id`]. The
    /// watch is taken (one commit answers it). One atomic load while no watch is kept, which
    /// is what a request whose key nobody waits for pays.
    pub fn take_waited_for(&self, scope: &Scope, key: &IdempotencyKey) -> bool {
        if self.watch_count.load(Ordering::Acquire) == 0 {
            return false;
        }
        let id = wake_id(scope, key);
        let mut watches = self.watches();
        let taken = watches.remove(&id);
        self.watch_count.store(watches.len(), Ordering::Release);
        taken.is_some_and(|heard| heard.elapsed() < WATCH_KEPT_FOR)
    }

    /// A notice's payload, as a listening session heard it: a settle (the key's id), a watch
    /// ([`WATCH_PREFIX`] and the id), or something else on the channel (ignored).
    fn heard(&self, payload: &str) {
        match payload.strip_prefix(WATCH_PREFIX) {
            Some(id) => {
                if let Some(id) = parse_wake_id(id) {
                    self.waited_for(id);
                }
            }
            None => {
                if let Some(id) = parse_wake_id(payload) {
                    self.settled(id);
                }
            }
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
    /// When an opening in the background may next be tried (ms since `created`): at most one a
    /// second ([`SettleListener::open_in_background`]).
    next_background_try: AtomicU64,
    created: Instant,
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
            next_background_try: AtomicU64::new(0),
            created: Instant::now(),
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
                settled.heard(&payload);
            }
            // The session ended (the store dropped, or its connection lost): the next waiting
            // duplicate opens another; until then, duplicates poll.
            listening.store(false, Ordering::Release);
            tracing::debug!("the store's listening session for settle notices ended");
        });
        Ok(true)
    }

    /// Whether the store should open a session now, in a task of its own, without a waiting
    /// duplicate asking: none listens, the store has not said it cannot, and no such opening
    /// was tried in the last second (so a server that is down is not asked at every request).
    /// A store whose requests hold keys in one-transaction mode listens this way, to hear the
    /// watches of duplicates waiting on other processes.
    pub fn open_in_background(&self) -> bool {
        if self.listening.load(Ordering::Acquire) || self.unavailable.load(Ordering::Relaxed) {
            return false;
        }
        let now = u64::try_from(self.created.elapsed().as_millis()).unwrap_or(u64::MAX);
        let next = self.next_background_try.load(Ordering::Relaxed);
        now >= next
            && self
                .next_background_try
                .compare_exchange(next, now + 1_000, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }
}

#[cfg(test)]
#[cfg(not(idempotency_loom))]
mod tests;
