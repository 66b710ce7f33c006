//! The speculative mode's word from the store that the key's lookup was answered: the handler's
//! statements queue behind the lookup, so until it is, nothing bounds what they wait for.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Whether the key's lookup of a speculative transaction
/// ([`TransactionalStore::begin_one_transaction_speculative`](super::TransactionalStore::begin_one_transaction_speculative)) has been answered by the
/// database: the handler's statements queue behind it, so while it is not, nothing the handler
/// waits for is bounded (a frozen server, a locked key table). The engine watches it to answer
/// the client within its store timeout ([`StoreTransaction::lookup_signal`](super::StoreTransaction::lookup_signal)).
#[derive(Clone, Debug)]
pub struct LookupSignal(Arc<LookupState>);

/// The store's end of a [`LookupSignal`]: [`LookupAnswered::answered`] once the lookup's answer
/// came back (dropped unanswered, it counts as answered: the lookup then ended with an error).
#[derive(Debug)]
pub struct LookupAnswered(Arc<LookupState>);

/// What both ends share: a flag set once, and the waiters to wake when it is. Lighter than a
/// `watch` channel (one `Notify`, not eight, and no value behind a lock): every speculative
/// request makes one.
#[derive(Debug, Default)]
struct LookupState {
    answered: AtomicBool,
    woken: tokio::sync::Notify,
}

impl LookupSignal {
    /// A new signal, unanswered, and its store's end.
    pub fn new() -> (LookupAnswered, LookupSignal) {
        let state = Arc::new(LookupState::default());
        (LookupAnswered(Arc::clone(&state)), LookupSignal(state))
    }

    /// Whether the lookup was answered (or can no longer be).
    pub fn is_answered(&self) -> bool {
        self.0.answered.load(Ordering::Acquire)
    }

    /// Waits until the lookup is answered (or can no longer be).
    pub async fn answered(self) {
        let woken = self.0.woken.notified();
        let mut woken = std::pin::pin!(woken);
        // Registered before the flag is read: an answer after the read wakes this waiter
        // (`notify_waiters` wakes the waiters registered before it).
        woken.as_mut().enable();
        if self.is_answered() {
            return;
        }
        woken.await;
    }
}

impl LookupAnswered {
    /// The lookup's answer came back.
    pub fn answered(self) {
        // Dropping says it.
    }
}

impl Drop for LookupAnswered {
    fn drop(&mut self) {
        self.0.answered.store(true, Ordering::Release);
        self.0.woken.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::LookupSignal;
    use std::time::Duration;

    /// Long beside a wake, short beside CI's patience: only a waiter that is never woken takes it.
    const NEVER: Duration = Duration::from_secs(10);

    #[tokio::test]
    async fn a_waiter_is_woken_by_the_answer_that_comes_after_it() {
        let (answered, signal) = LookupSignal::new();
        assert!(!signal.is_answered());
        let waiter = tokio::spawn(signal.clone().answered());
        tokio::task::yield_now().await;
        answered.answered();
        tokio::time::timeout(NEVER, waiter)
            .await
            .expect("the waiter was woken")
            .expect("the waiter ran");
        assert!(signal.is_answered());
    }

    #[tokio::test]
    async fn an_answer_before_the_wait_is_seen_and_a_dropped_end_counts_as_one() {
        let (answered, signal) = LookupSignal::new();
        answered.answered();
        tokio::time::timeout(NEVER, signal.answered())
            .await
            .expect("already answered");
        let (dropped, signal) = LookupSignal::new();
        let waiter = tokio::spawn(signal.clone().answered());
        tokio::task::yield_now().await;
        drop(dropped);
        tokio::time::timeout(NEVER, waiter)
            .await
            .expect("a lookup that can no longer be answered wakes its waiter")
            .expect("the waiter ran");
        assert!(signal.is_answered());
    }

    #[tokio::test(start_paused = true)]
    async fn an_unanswered_lookup_keeps_its_waiter_waiting() {
        let (_answered, signal) = LookupSignal::new();
        let waited = tokio::time::timeout(Duration::from_secs(5), signal.clone().answered()).await;
        assert!(waited.is_err(), "no answer, no wake");
        assert!(!signal.is_answered());
    }
}
